// The Store contract suite against MariaDB.
#include "../store/store_contract.h"
#include "support/mariadb_test_support.h"

namespace outbox::testing {
namespace {

class MariaDbHarness final : public StoreHarness {
 public:
  void Reset() override {
    schema_.reset();
    schema_ = std::make_unique<MariaDbTestSchema>();
  }
  std::unique_ptr<Store> Open(const RetryPolicy& retry, const RetentionPolicy& retention) override {
    mariadb::StoreOptions options;
    options.url = MariaDbUrl();
    options.schema = schema_->name();
    options.retry = retry;
    options.retention = retention;
    options.random = SeededRandom(1);
    return mariadb::OpenStore(std::move(options));
  }

 private:
  std::unique_ptr<MariaDbTestSchema> schema_;
};

MariaDbHarness harness;
INSTANTIATE_TEST_SUITE_P(MariaDb, StoreContractTest, ::testing::Values(&harness),
                         [](const auto&) { return std::string{"connector_c"}; });

}  // namespace
}  // namespace outbox::testing
