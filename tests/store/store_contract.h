#pragma once
// The Store contract as tests, run against every store implementation. A store's test binary
// provides a StoreHarness and instantiates the suite:
//
//   INSTANTIATE_TEST_SUITE_P(Postgres, StoreContractTest, ::testing::Values(&harness));

#include <gtest/gtest.h>

#include <memory>

#include "outbox/core/error.h"
#include "outbox/core/retry_policy.h"
#include "outbox/store/store.h"

namespace outbox::testing {

class StoreHarness {
 public:
  virtual ~StoreHarness() = default;
  // Starts from an empty outbox: the next Open sees no messages.
  virtual void Reset() = 0;
  // Opens a store on the outbox of the last Reset.
  virtual std::unique_ptr<Store> Open(const RetryPolicy& retry,
                                      const RetentionPolicy& retention) = 0;
};

class StoreContractTest : public ::testing::TestWithParam<StoreHarness*> {};

}  // namespace outbox::testing
