#pragma once
// The Admin contract (outbox/store/admin.h) as tests, run against every store implementation. A
// store's test binary provides an AdminHarness and instantiates the suite:
//
//   INSTANTIATE_TEST_SUITE_P(Postgres, AdminContractTest, ::testing::Values(&harness));

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "outbox/store/admin.h"
#include "store_contract.h"

namespace outbox::testing {

class AdminHarness : public StoreHarness {
 public:
  // Opens the store's Admin on the outbox of the last Reset.
  virtual std::unique_ptr<Admin> OpenAdmin() = 0;
  // A column of message `id` as text, read behind the store's back ("<null>" for NULL).
  virtual std::string Column(const MessageId& id, const std::string& column) = 0;
  // Every column of every row, to compare before and after.
  virtual std::string Snapshot() = 0;
  // Moves created_at of `ids` `age` into the past.
  virtual void Backdate(const std::vector<MessageId>& ids, std::chrono::seconds age) = 0;
};

// The fixture: a fresh outbox, a store whose rejections abandon at once, and the Admin.
class AdminContractTest : public ::testing::TestWithParam<AdminHarness*> {
 protected:
  void SetUp() override {
    harness_->Reset();
    store_ = OpenStore(1);
    admin_ = harness_->OpenAdmin();
  }

  AdminHarness* harness_ = GetParam();
  // max_attempts 1: one rejection abandons a message.
  std::unique_ptr<Store> store_;
  std::unique_ptr<Admin> admin_;

  std::unique_ptr<Store> OpenStore(int max_attempts,
                                   std::chrono::seconds published_retention = std::chrono::seconds{
                                       0}) {
    RetryPolicy retry;
    retry.max_attempts = max_attempts;
    retry.initial_delay = std::chrono::hours{1};  // a failed row stays failed
    retry.max_delay = std::chrono::hours{1};
    RetentionPolicy retention;
    retention.published = published_retention;
    return harness_->Open(retry, retention);
  }

  std::vector<MessageId> Enqueue(int count, const std::string& topic,
                                 std::optional<std::string> key = std::nullopt,
                                 const std::string& target = "default") {
    std::vector<NewMessage> messages;
    for (int i = 0; i < count; ++i) {
      NewMessage message;
      message.topic = topic;
      message.stream_key = key;
      message.targets = {target};
      message.payload = R"({"n":)" + std::to_string(i % 10) + "}";
      messages.push_back(std::move(message));
    }
    return store_->Enqueue(messages);
  }

  // Claims everything due and fails `ids` with kRejected on `store` (abandoned when that spends
  // the last attempt, otherwise failed with a retry an hour away); releases the rest.
  static void Reject(Store& store, const std::vector<MessageId>& ids) {
    ClaimRequest request;
    request.owner = "relay-under-test";
    request.max_messages = 10000;
    const auto batch = store.Claim(request);
    const std::set<MessageId> doomed(ids.begin(), ids.end());
    std::vector<FailedMessage> failures;
    std::vector<LeasedId> others;
    for (const auto& envelope : batch) {
      if (doomed.contains(envelope.id)) {
        failures.push_back(
            FailedMessage::Of(envelope, Failure{FailureKind::kRejected, "NOT_FOUND - no queue"}));
      } else {
        others.push_back(LeasedId::Of(envelope));
      }
    }
    ASSERT_EQ(failures.size(), doomed.size()) << "not every message to reject was claimable";
    EXPECT_EQ(store.Fail(request.owner, failures).settled, static_cast<std::int64_t>(ids.size()));
    store.Release(request.owner, others);
  }
  void Abandon(const std::vector<MessageId>& ids) { Reject(*store_, ids); }

  // Claims exactly the message `id` (everything else is released) and keeps it leased.
  Envelope Lease(const MessageId& id, const std::string& owner = "busy-relay") {
    ClaimRequest request;
    request.owner = owner;
    request.max_messages = 10000;
    Envelope leased;
    std::vector<LeasedId> others;
    for (auto& envelope : store_->Claim(request)) {
      if (envelope.id == id) {
        leased = std::move(envelope);
      } else {
        others.push_back(LeasedId::Of(envelope));
      }
    }
    store_->Release(owner, others);
    EXPECT_EQ(leased.id, id) << "message was not claimable";
    return leased;
  }

  std::string Column(const MessageId& id, const std::string& column) {
    return harness_->Column(id, column);
  }

  static std::vector<MessageId> Ids(const MessagePage& page) {
    std::vector<MessageId> ids;
    for (const auto& message : page.messages) ids.push_back(message.id);
    return ids;
  }
  std::vector<MessageId> ListAll(const MessageFilter& filter) {
    return Ids(admin_->List(filter, Admin::kMaxListLimit));
  }
  static MessageFilter ById(std::vector<MessageId> ids) {
    MessageFilter filter;
    filter.ids = std::move(ids);
    return filter;
  }
};

}  // namespace outbox::testing
