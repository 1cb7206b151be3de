// The Store contract suite against PostgreSQL.
#include "../store/store_contract.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

class PostgresHarness final : public StoreHarness {
 public:
  void Reset() override {
    schema_.reset();
    schema_ = std::make_unique<TestSchema>();
  }
  std::unique_ptr<Store> Open(const RetryPolicy& retry, const RetentionPolicy& retention) override {
    postgres::StoreOptions options;
    options.conninfo = PgUrl();
    options.schema = schema_->name();
    options.retry = retry;
    options.retention = retention;
    options.random = SeededRandom(1);
    return postgres::OpenStore(std::move(options));
  }

 private:
  std::unique_ptr<TestSchema> schema_;
};

PostgresHarness harness;
INSTANTIATE_TEST_SUITE_P(Postgres, StoreContractTest, ::testing::Values(&harness),
                         [](const auto&) { return std::string{"libpq"}; });

}  // namespace
}  // namespace outbox::testing
