// The operator's side of the PostgreSQL store (outbox/store/postgres_admin.h) against a real
// PostgreSQL: the Admin contract suite (tests/store/admin_contract.cpp), and what only
// PostgreSQL has: row locks held by other sessions, statement timeouts, schemas and a server.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "../store/admin_contract.h"
#include "outbox/store/postgres_admin.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

class PostgresAdminHarness final : public AdminHarness {
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
    options.random = SeededRandom(7);
    return postgres::OpenStore(std::move(options));
  }
  std::unique_ptr<Admin> OpenAdmin() override {
    return postgres::OpenAdmin(PgUrl(), schema_->name());
  }
  std::string Column(const MessageId& id, const std::string& column) override {
    return Scalar(schema_->conn(), "SELECT coalesce(" + column + "::text, '<null>') FROM " +
                                       schema_->name() + ".messages WHERE id = '" + id.ToString() +
                                       "'");
  }
  std::string Snapshot() override {
    return Scalar(schema_->conn(),
                  "SELECT coalesce(string_agg(m::text, E'\\n' ORDER BY id), '') FROM " +
                      schema_->name() + ".messages m");
  }
  void Backdate(const std::vector<MessageId>& ids, std::chrono::seconds age) override {
    for (const auto& id : ids) {
      Sql(schema_->conn(), "UPDATE " + schema_->name() + ".messages SET created_at = now() - " +
                               std::to_string(age.count()) + " * interval '1 second' WHERE id = '" +
                               id.ToString() + "'");
    }
  }
  TestSchema& schema() { return *schema_; }

 private:
  std::unique_ptr<TestSchema> schema_;
};

PostgresAdminHarness harness;
INSTANTIATE_TEST_SUITE_P(Postgres, AdminContractTest, ::testing::Values(&harness),
                         [](const auto&) { return std::string{"libpq"}; });

// The contract's fixture, with the schema at hand for what only PostgreSQL can do.
class PgAdminTest : public AdminContractTest {
 protected:
  static TestSchema& schema() { return harness.schema(); }
};

TEST_P(PgAdminTest, ARowClaimedWhileReplayWaitsForItsLockIsLeftAlone) {
  const auto ids = Enqueue(1, "t");
  Abandon(ids);
  // Another session locks the abandoned row, so the replay's UPDATE waits for it...
  auto other = Connect();
  Sql(other.get(), "BEGIN");
  Sql(other.get(), "SELECT 1 FROM " + schema().name() + ".messages WHERE id = '" +
                       ids[0].ToString() + "' FOR UPDATE");
  auto replay = std::async(std::launch::async,
                           [this, &ids] { return admin_->Replay(ById(ids), false).count; });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds{10};
  while (Scalar(schema().conn(),
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query "
                "LIKE '%replayed by operator%'") != "1") {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the replay never waited";
    std::this_thread::sleep_for(std::chrono::milliseconds{10});
  }
  // ...while that session makes it processing, as a claim would, and commits.
  Sql(other.get(), "UPDATE " + schema().name() +
                       ".messages SET status = 'processing', lease_owner = 'fast-relay', "
                       "lease_until = now() + interval '1 minute' WHERE id = '" +
                       ids[0].ToString() + "'");
  Sql(other.get(), "COMMIT");
  EXPECT_EQ(replay.get(), 0);
  EXPECT_EQ(Column(ids[0], "status"), "processing");
  EXPECT_EQ(Column(ids[0], "lease_owner"), "fast-relay");
}

TEST_P(PgAdminTest, CountByTopicGivesUpAfterItsTimeout) {
  Enqueue(3, "orders");
  // Another session holds the table, so the grouped count waits for it until its timeout.
  auto other = Connect();
  Sql(other.get(), "BEGIN");
  Sql(other.get(), "LOCK TABLE " + schema().name() + ".messages IN ACCESS EXCLUSIVE MODE");
  const auto started = std::chrono::steady_clock::now();
  EXPECT_FALSE(admin_->CountByTopic(std::chrono::milliseconds{200}).has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds{5});
  Sql(other.get(), "COMMIT");
  // The timeout ended with the count's transaction: the next count and listing work.
  const auto counts = admin_->CountByTopic(std::chrono::seconds{5});
  ASSERT_TRUE(counts.has_value());
  ASSERT_EQ(counts->size(), 1U);
  EXPECT_EQ(counts->front().messages, 3);
  EXPECT_EQ(Scalar(schema().conn(), "SHOW statement_timeout"), "0");
  EXPECT_EQ(admin_->List({}, 10).messages.size(), 3U);
}

// outboxd's admin API opens its Admin with a statement timeout: a statement stuck behind a lock
// is cancelled after it (kUnavailable: busy, try again), and the connection keeps working.
TEST_P(PgAdminTest, AStatementTimeoutCancelsAStatementStuckBehindALock) {
  auto admin = postgres::OpenAdmin(PgUrl(), schema().name(), std::chrono::milliseconds{300});
  const PgConn other = Connect();
  Sql(other.get(), "BEGIN");
  Sql(other.get(), "LOCK TABLE " + schema().name() + ".messages IN ACCESS EXCLUSIVE MODE");
  const auto started = std::chrono::steady_clock::now();
  try {
    (void)admin->List({}, 10);
    FAIL() << "listed through an exclusive lock";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kUnavailable) << error.what();
    EXPECT_NE(std::string{error.what()}.find("statement timeout"), std::string::npos)
        << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds{10});
  Sql(other.get(), "ROLLBACK");
  EXPECT_TRUE(admin->List({}, 10).messages.empty());
  EXPECT_THROW(postgres::OpenAdmin(PgUrl(), schema().name(), std::chrono::milliseconds{-1}),
               std::invalid_argument);
}

TEST_P(PgAdminTest, ABadSchemaNameIsRefusedBeforeConnecting) {
  try {
    postgres::OpenAdmin("postgresql://u:secret@127.0.0.1:1/x", "Bad-Name");
    FAIL() << "opened a bad schema name";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string{error.what()}.find("plain lower-case"), std::string::npos);
  }
}

TEST_P(PgAdminTest, OpenRefusesAnUnmigratedSchemaAndAnUnreachableServer) {
  try {
    postgres::OpenAdmin(PgUrl(), "no_such_schema_here");
    FAIL() << "opened an unmigrated schema";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kPermanent);
    EXPECT_NE(std::string{error.what()}.find("is not migrated"), std::string::npos);
    EXPECT_NE(std::string{error.what()}.find("run outboxctl migrate"), std::string::npos);
  }
  try {
    postgres::OpenAdmin("postgresql://u:secret@127.0.0.1:1/x", schema().name());
    FAIL() << "connected to nothing";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kUnavailable);
    EXPECT_EQ(std::string{error.what()}.find("secret"), std::string::npos);
  }
}

TEST_P(PgAdminTest, RelaysListsTheLiveRelaysWithThePartitionsEachHolds) {
  const std::string s = schema().name();
  // a: live, holds 0, 1 and 5 (one lease expiring first), once held 7 (expired); b: live, holds
  // nothing; c: gone (expired), still named on partition 9.
  Sql(schema().conn(),
      "INSERT INTO " + s +
          ".relay_instances (owner, started_at, heartbeat_at, expires_at) VALUES "
          "('a/1', now() - interval '1 hour', now(), now() + interval '30 s'), "
          "('b/2', now() - interval '1 min', now(), now() + interval '30 s'), "
          "('c/3', now() - interval '2 hour', now() - interval '1 min', now() - interval '30 s')");
  Sql(schema().conn(), "UPDATE " + s +
                           ".partition_leases SET owner = 'a/1', epoch = 2, "
                           "lease_until = now() + interval '20 s' WHERE partition IN (0, 5)");
  Sql(schema().conn(), "UPDATE " + s +
                           ".partition_leases SET owner = 'a/1', epoch = 1, "
                           "lease_until = now() + interval '10 s' WHERE partition = 1");
  Sql(schema().conn(), "UPDATE " + s +
                           ".partition_leases SET owner = 'a/1', epoch = 3, "
                           "lease_until = now() - interval '1 s' WHERE partition = 7");
  Sql(schema().conn(), "UPDATE " + s +
                           ".partition_leases SET owner = 'c/3', epoch = 4, "
                           "lease_until = now() - interval '40 s' WHERE partition = 9");
  const auto before = std::chrono::system_clock::now();
  const RelayOverview overview = admin_->Relays();
  ASSERT_EQ(overview.relays.size(), 2U);
  const RelayStatus& a = overview.relays[0];
  EXPECT_EQ(a.owner, "a/1");
  EXPECT_EQ(a.partitions, (std::vector<int>{0, 1, 5}));
  ASSERT_TRUE(a.next_lease_expiry.has_value());
  const auto next = *a.next_lease_expiry - overview.database_now;
  EXPECT_GT(next, std::chrono::seconds{8});
  EXPECT_LE(next, std::chrono::seconds{10});
  EXPECT_GT(a.expires_at, overview.database_now);
  EXPECT_LT(a.started_at, overview.database_now - std::chrono::minutes{59});
  EXPECT_LE(a.heartbeat_at, overview.database_now);
  const RelayStatus& b = overview.relays[1];
  EXPECT_EQ(b.owner, "b/2");
  EXPECT_TRUE(b.partitions.empty());
  EXPECT_FALSE(b.next_lease_expiry.has_value());
  EXPECT_EQ(overview.partition_count, 64);
  EXPECT_EQ(overview.unowned_partitions, 61);
  EXPECT_EQ(overview.lease_acquisitions, 2 + 2 + 1 + 3 + 4);
  EXPECT_LT(std::chrono::abs(overview.database_now - before), std::chrono::seconds{5});

  // None live: the totals all the same.
  Sql(schema().conn(), "DELETE FROM " + s + ".relay_instances");
  const RelayOverview none = admin_->Relays();
  EXPECT_TRUE(none.relays.empty());
  EXPECT_EQ(none.partition_count, 64);
  EXPECT_EQ(none.unowned_partitions, 61);  // the leases are still live, their owners gone
}

// ---- on_abandon = "hold" (issue #43): only the PostgreSQL store holds streams ----

// A store whose rejections abandon at once and whose target "default" holds its streams.
std::unique_ptr<Store> OpenHoldingStore(AdminHarness& admin_harness) {
  RetryPolicy retry;
  retry.max_attempts = 1;
  retry.hold_targets = {"default"};
  return admin_harness.Open(retry, RetentionPolicy{});
}

std::vector<MessageId> ClaimIds(Store& store, const std::string& owner = "relay-2") {
  ClaimRequest request;
  request.owner = owner;
  request.max_messages = 100;
  std::vector<MessageId> ids;
  for (const auto& envelope : store.Claim(request)) ids.push_back(envelope.id);
  return ids;
}

TEST_P(PgAdminTest, AHeldStreamPublishesNothingAfterItsAbandonedMessageUntilSkipped) {
  store_ = OpenHoldingStore(*harness_);
  const auto held = Enqueue(3, "orders", "order-1");
  const auto other = Enqueue(1, "orders", "order-2");
  const auto unkeyed = Enqueue(1, "orders");
  Abandon({held[0], other[0], unkeyed[0]});
  EXPECT_EQ(Column(held[0], "holds_stream"), "true");
  EXPECT_EQ(Column(other[0], "holds_stream"), "true") << "its stream has no later message yet";
  EXPECT_EQ(Column(unkeyed[0], "holds_stream"), "false") << "no stream to hold";
  EXPECT_EQ(store_->Stats().streams_held, 2);
  const auto later_other = Enqueue(1, "orders", "order-2");
  const auto flowing = Enqueue(2, "orders", "order-3");

  // Only the streams that are not held flow.
  EXPECT_EQ(ClaimIds(*store_), flowing);
  // The held ones are listed, and a dry run of the skip changes nothing.
  MessageFilter held_only;
  held_only.held = true;
  const auto page = admin_->List(held_only, 10);
  ASSERT_EQ(page.messages.size(), 2U);
  EXPECT_EQ(page.messages[0].id, held[0]);
  EXPECT_TRUE(page.messages[0].holds_stream);
  const auto before = harness_->Snapshot();
  const auto dry = admin_->Skip(ById({held[0]}), /*dry_run=*/true);
  EXPECT_EQ(dry.ids, std::vector<MessageId>{held[0]});
  EXPECT_EQ(harness_->Snapshot(), before);
  EXPECT_TRUE(ClaimIds(*store_).empty());

  // Skipped: the stream goes on past it, telling the consumer what it missed.
  EXPECT_EQ(admin_->Skip(ById({held[0]}), false).count, 1);
  EXPECT_EQ(Column(held[0], "status"), "abandoned");
  EXPECT_EQ(Column(held[0], "holds_stream"), "false");
  EXPECT_EQ(store_->Stats().streams_held, 1);
  ClaimRequest request;
  request.owner = "relay-3";
  const auto batch = store_->Claim(request);
  ASSERT_EQ(batch.size(), 2U);
  EXPECT_EQ(batch[0].id, held[1]);
  EXPECT_EQ(batch[0].stream_prev_seq, 0) << "seq 1 was abandoned";
  EXPECT_EQ(batch[1].id, held[2]);
  // A message that does not hold its stream is not skipped again.
  EXPECT_EQ(admin_->Skip(ById({held[0], unkeyed[0]}), false).count, 0);
  EXPECT_EQ(Column(later_other[0], "status"), "pending");
}

TEST_P(PgAdminTest, AReplayedHeadPublishesFirstAndItsStreamFollowsInOrder) {
  store_ = OpenHoldingStore(*harness_);
  const auto ids = Enqueue(3, "orders", "order-1");
  Abandon({ids[0]});
  EXPECT_TRUE(ClaimIds(*store_).empty());
  EXPECT_EQ(admin_->Replay(ById({ids[0]}), /*dry_run=*/true).count, 1);
  EXPECT_TRUE(ClaimIds(*store_).empty()) << "a dry run releases nothing";
  EXPECT_EQ(admin_->Replay(ById({ids[0]}), false).count, 1);
  EXPECT_EQ(Column(ids[0], "holds_stream"), "false");
  EXPECT_EQ(store_->Stats().streams_held, 0);
  EXPECT_EQ(ClaimIds(*store_), ids);
}

TEST_P(PgAdminTest, TheTopicsOnAbandonWinsOverItsTargetsDefault) {
  Sql(schema().conn(), "INSERT INTO " + schema().name() +
                           ".topic_settings (topic, on_abandon) VALUES ('loose', 'continue'), "
                           "('strict', 'hold')");
  store_ = OpenHoldingStore(*harness_);  // "default" holds
  const auto loose = Enqueue(2, "loose", "k");
  const auto strict = Enqueue(2, "strict", "k", "partner");  // "partner" continues by default
  Abandon({loose[0], strict[0]});
  EXPECT_EQ(Column(loose[0], "holds_stream"), "false");
  EXPECT_EQ(Column(strict[0], "holds_stream"), "true");
  EXPECT_EQ(ClaimIds(*store_), std::vector<MessageId>{loose[1]});
}

TEST_P(PgAdminTest, AnUnknownOnAbandonIsRefusedByTheDatabase) {
  try {
    Sql(schema().conn(), "INSERT INTO " + schema().name() +
                             ".topic_settings (topic, on_abandon) VALUES ('t', 'stop')");
    FAIL() << "an unknown policy was accepted";
  } catch (const std::exception& error) {
    EXPECT_NE(std::string{error.what()}.find("topic_settings_on_abandon"), std::string::npos)
        << error.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Postgres, PgAdminTest, ::testing::Values(&harness),
                         [](const auto&) { return std::string{"libpq"}; });

}  // namespace
}  // namespace outbox::testing
