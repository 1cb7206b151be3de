// The operator's side of the MariaDB store (mariadb::OpenAdmin) against a real MariaDB: the Admin
// contract suite (tests/store/admin_contract.cpp), and what only a server has: row locks held by
// other sessions, statement timeouts, table locks, an unmigrated schema, held streams and the
// relays' partition leases.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "../store/admin_contract.h"
#include "outbox/core/error.h"
#include "support/mariadb_test_support.h"
#include "support/wait.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

class MariaDbAdminHarness final : public AdminHarness {
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
    options.random = SeededRandom(7);
    return mariadb::OpenStore(std::move(options));
  }
  std::unique_ptr<Admin> OpenAdmin() override {
    return mariadb::OpenAdmin(MariaDbUrl(), schema_->name());
  }
  std::string Column(const MessageId& id, const std::string& column) override {
    const mariadb::Value params[] = {mariadb::IdBytes(id)};
    return MariaDbScalar(schema_->conn(),
                         "SELECT COALESCE(CAST(" + column + " AS CHAR), '<null>') FROM " +
                             schema_->name() + ".messages WHERE id = ?",
                         params)
        .value_or("<no row>");
  }
  std::string Snapshot() override {
    const auto result = schema_->conn().Run(
        "snapshot", "SELECT * FROM " + schema_->name() + ".messages ORDER BY id");
    std::string text;
    for (const auto& row : result.sets.at(0).rows) {
      for (const auto& value : row) text += value.value_or("<null>") + "|";
      text += "\n";
    }
    return text;
  }
  void Backdate(const std::vector<MessageId>& ids, std::chrono::seconds age) override {
    for (const auto& id : ids) {
      const mariadb::Value params[] = {static_cast<std::int64_t>(age.count()),
                                       mariadb::IdBytes(id)};
      schema_->conn().Run("backdate",
                          "UPDATE " + schema_->name() +
                              ".messages SET created_at = UTC_TIMESTAMP(6) - INTERVAL ? SECOND "
                              "WHERE id = ?",
                          params);
    }
  }
  MariaDbTestSchema& schema() { return *schema_; }

 private:
  std::unique_ptr<MariaDbTestSchema> schema_;
};

MariaDbAdminHarness harness;
INSTANTIATE_TEST_SUITE_P(MariaDb, AdminContractTest, ::testing::Values(&harness),
                         [](const auto&) { return std::string{"connector_c"}; });

// The contract's fixture, with the database at hand for what only a server can do.
class MariaDbAdminTest : public AdminContractTest {
 protected:
  static MariaDbTestSchema& schema() { return harness.schema(); }
  static std::string Table() { return schema().name() + ".messages"; }
  static std::string Scalar(const std::string& sql) {
    return MariaDbScalar(schema().conn(), sql).value_or("NULL");
  }
  static void Sql(mariadb::Connection& conn, const std::string& sql) { conn.Execute("test", sql); }
  static std::string Where(const MessageId& id) { return " WHERE id = UNHEX('" + Hex(id) + "')"; }
  static std::string Hex(const MessageId& id) {
    std::string hex = id.ToString();
    std::erase(hex, '-');
    return hex;
  }
};

TEST_P(MariaDbAdminTest, ARowClaimedWhileReplayWaitsForItsLockIsLeftAlone) {
  const auto ids = Enqueue(1, "t");
  Abandon(ids);
  // Another session locks the abandoned row, so the replay's locking read waits for it...
  auto other = MariaDbConnect();
  Sql(other, "START TRANSACTION");
  Sql(other, "SELECT 1 FROM " + Table() + Where(ids[0]) + " FOR UPDATE");
  auto replay = std::async(std::launch::async,
                           [this, &ids] { return admin_->Replay(ById(ids), false).count; });
  // (A transaction waiting for its first lock is not in INNODB_TRX: the replay's locking read is
  // seen waiting when it has run for 200 ms, which a read of one row by its key never takes.)
  ASSERT_TRUE(WaitUntil(
      [] {
        return Scalar("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE '%" +
                      schema().name() +
                      "%FOR UPDATE%' AND TIME_MS > 200 AND ID <> CONNECTION_ID()") == "1";
      },
      std::chrono::seconds{10}))
      << "the replay never waited";
  // ...while that session makes it processing, as a claim would, and commits.
  Sql(other, "UPDATE " + Table() +
                 " SET status = 'processing', lease_owner = 'fast-relay', lease_until = "
                 "UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE" +
                 Where(ids[0]));
  Sql(other, "COMMIT");
  EXPECT_EQ(replay.get(), 0);
  EXPECT_EQ(Column(ids[0], "status"), "processing");
  EXPECT_EQ(Column(ids[0], "lease_owner"), "fast-relay");
  EXPECT_EQ(Column(ids[0], "last_error"), "rejected: NOT_FOUND - no queue") << "not touched";
}

// Rows other sessions hold locked but that are no candidates never make a change wait.
TEST_P(MariaDbAdminTest, AChangeNeverWaitsForRowsItDoesNotChange) {
  const auto busy = Enqueue(1, "busy");
  const auto doomed = Enqueue(2, "doomed");
  auto other = MariaDbConnect();
  Sql(other, "START TRANSACTION");
  Sql(other, "SELECT 1 FROM " + Table() + Where(busy[0]) + " FOR UPDATE");
  auto admin = mariadb::OpenAdmin(MariaDbUrl(), schema().name(), std::chrono::seconds{2});
  MessageFilter filter;
  filter.topic = "doomed";
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(admin->Abandon(filter, "gone", false).ids, doomed);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds{1});
  Sql(other, "ROLLBACK");
}

TEST_P(MariaDbAdminTest, CountByTopicGivesUpAfterItsTimeout) {
  Enqueue(3, "orders");
  // Another session holds the table, so the grouped count waits for it until its timeout.
  auto other = MariaDbConnect();
  Sql(other, "LOCK TABLES " + Table() + " WRITE");
  const auto started = std::chrono::steady_clock::now();
  EXPECT_FALSE(admin_->CountByTopic(milliseconds{200}).has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds{5});
  Sql(other, "UNLOCK TABLES");
  // The timeout was the count's alone: the next count and listing work.
  const auto counts = admin_->CountByTopic(std::chrono::seconds{5});
  ASSERT_TRUE(counts.has_value());
  ASSERT_EQ(counts->size(), 1U);
  EXPECT_EQ(counts->front().messages, 3);
  EXPECT_EQ(admin_->List({}, 10).messages.size(), 3U);
}

// A count given longer than the Admin's own statement timeout is cut at that timeout (the
// client's read timeout follows it closely): still nullopt, never a lost connection.
TEST_P(MariaDbAdminTest, CountByTopicIsBoundedByTheStatementTimeoutToo) {
  auto admin = mariadb::OpenAdmin(MariaDbUrl(), schema().name(), milliseconds{300});
  auto other = MariaDbConnect();
  Sql(other, "LOCK TABLES " + Table() + " WRITE");
  const auto started = std::chrono::steady_clock::now();
  EXPECT_FALSE(admin->CountByTopic(std::chrono::seconds{30}).has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds{5});
  Sql(other, "UNLOCK TABLES");
  EXPECT_TRUE(admin->CountByTopic(std::chrono::seconds{30}).has_value());
}

// outboxd's admin API opens its Admin with a statement timeout: a statement stuck behind a lock
// is ended after it (kUnavailable: busy, try again), and the connection keeps working.
TEST_P(MariaDbAdminTest, AStatementTimeoutEndsAStatementStuckBehindALock) {
  auto admin = mariadb::OpenAdmin(MariaDbUrl(), schema().name(), milliseconds{300});
  auto other = MariaDbConnect();
  Sql(other, "LOCK TABLES " + Table() + " WRITE");
  const auto started = std::chrono::steady_clock::now();
  try {
    (void)admin->List({}, 10);
    FAIL() << "listed through a table lock";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kUnavailable) << error.what();
    EXPECT_NE(std::string{error.what()}.find("max_statement_time"), std::string::npos)
        << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds{5});
  Sql(other, "UNLOCK TABLES");
  EXPECT_TRUE(admin->List({}, 10).messages.empty());
  EXPECT_THROW(mariadb::OpenAdmin(MariaDbUrl(), schema().name(), milliseconds{-1}),
               std::invalid_argument);
}

TEST_P(MariaDbAdminTest, ABadSchemaNameIsRefusedBeforeConnecting) {
  for (const std::string& name :
       std::vector<std::string>{"Bad-Name", "", "a;b", std::string(65, 'a')}) {
    try {
      mariadb::OpenAdmin("mariadb://u:secret@127.0.0.1:1/x", name);
      FAIL() << "opened the schema name '" << name << "'";
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string{error.what()}.find("not a plain identifier"), std::string::npos)
          << error.what();
    }
  }
}

TEST_P(MariaDbAdminTest, OpenRefusesAnUnmigratedSchemaAnUnreachableServerAndABadUrl) {
  try {
    mariadb::OpenAdmin(MariaDbUrl(), "no_such_schema_here");
    FAIL() << "opened an unmigrated schema";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kPermanent);
    EXPECT_NE(std::string{error.what()}.find("is not migrated"), std::string::npos);
    EXPECT_NE(std::string{error.what()}.find("run outboxctl migrate"), std::string::npos);
  }
  try {
    mariadb::OpenAdmin("mariadb://u:secret@127.0.0.1:1/x", schema().name());
    FAIL() << "connected to nothing";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kUnavailable);
    EXPECT_EQ(std::string{error.what()}.find("secret"), std::string::npos) << error.what();
  }
  try {
    mariadb::OpenAdmin("postgresql://u:secret@127.0.0.1/x", schema().name());
    FAIL() << "took a PostgreSQL URL";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kPermanent);
    EXPECT_NE(std::string{error.what()}.find("mariadb://"), std::string::npos) << error.what();
    EXPECT_EQ(std::string{error.what()}.find("secret"), std::string::npos) << error.what();
  }
}

TEST_P(MariaDbAdminTest, RelaysListsTheLiveRelaysWithThePartitionsEachHolds) {
  const std::string s = schema().name();
  auto& conn = schema().conn();
  // a: live, holds 0, 1 and 5 (one lease expiring first), once held 7 (expired); b: live, holds
  // nothing; c: gone (expired), still named on partition 9.
  Sql(conn, "INSERT INTO " + s +
                ".relay_instances (owner, started_at, heartbeat_at, expires_at) VALUES "
                "('a/1', UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, UTC_TIMESTAMP(6), "
                "UTC_TIMESTAMP(6) + INTERVAL 30 SECOND), "
                "('b/2', UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE, UTC_TIMESTAMP(6), "
                "UTC_TIMESTAMP(6) + INTERVAL 30 SECOND), "
                "('c/3', UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE, "
                "UTC_TIMESTAMP(6) - INTERVAL 30 SECOND)");
  Sql(conn, "UPDATE " + s +
                ".partition_leases SET owner = 'a/1', epoch = 2, lease_until = UTC_TIMESTAMP(6) + "
                "INTERVAL 20 SECOND WHERE partition_no IN (0, 5)");
  Sql(conn, "UPDATE " + s +
                ".partition_leases SET owner = 'a/1', epoch = 1, lease_until = UTC_TIMESTAMP(6) + "
                "INTERVAL 10 SECOND WHERE partition_no = 1");
  Sql(conn, "UPDATE " + s +
                ".partition_leases SET owner = 'a/1', epoch = 3, lease_until = UTC_TIMESTAMP(6) - "
                "INTERVAL 1 SECOND WHERE partition_no = 7");
  Sql(conn, "UPDATE " + s +
                ".partition_leases SET owner = 'c/3', epoch = 4, lease_until = UTC_TIMESTAMP(6) - "
                "INTERVAL 40 SECOND WHERE partition_no = 9");
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
  // The database's clock is UTC, as the system clock: they agree within the test's run.
  EXPECT_LT(std::chrono::abs(overview.database_now - before), std::chrono::seconds{5});

  // None live: the totals all the same.
  Sql(conn, "DELETE FROM " + s + ".relay_instances");
  const RelayOverview none = admin_->Relays();
  EXPECT_TRUE(none.relays.empty());
  EXPECT_EQ(none.partition_count, 64);
  EXPECT_EQ(none.unowned_partitions, 61);  // the leases are still live, their owners gone
}

// Relays as the relays' own heartbeats leave them (the procedure, not rows written by hand).
TEST_P(MariaDbAdminTest, RelaysShowsWhatTheHeartbeatsTook) {
  auto first = mariadb::OpenPartitionLeases(MariaDbUrl(), schema().name());
  auto second = mariadb::OpenPartitionLeases(MariaDbUrl(), schema().name());
  (void)first->Heartbeat("relay-a/1", std::chrono::seconds{30}, {});
  (void)second->Heartbeat("relay-b/1", std::chrono::seconds{30}, {});
  const RelayOverview overview = admin_->Relays();
  ASSERT_EQ(overview.relays.size(), 2U);
  EXPECT_EQ(overview.relays[0].owner, "relay-a/1");
  EXPECT_EQ(overview.relays[0].partitions.size() + overview.relays[1].partitions.size(), 64U)
      << "the first took them all, the second none yet (or its share)";
  EXPECT_EQ(overview.unowned_partitions,
            64 - static_cast<std::int64_t>(overview.relays[0].partitions.size() +
                                           overview.relays[1].partitions.size()));
  EXPECT_GE(overview.lease_acquisitions, 64);
}

// ---- on_abandon = "hold" (issue #43): the MariaDB store holds streams as PostgreSQL's ----

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

TEST_P(MariaDbAdminTest, AHeldStreamPublishesNothingAfterItsAbandonedMessageUntilSkipped) {
  store_ = OpenHoldingStore(*harness_);
  const auto held = Enqueue(3, "orders", "order-1");
  const auto other = Enqueue(1, "orders", "order-2");
  const auto unkeyed = Enqueue(1, "orders");
  Abandon({held[0], other[0], unkeyed[0]});
  EXPECT_EQ(Column(held[0], "holds_stream"), "1");
  EXPECT_EQ(Column(other[0], "holds_stream"), "1") << "its stream has no later message yet";
  EXPECT_EQ(Column(unkeyed[0], "holds_stream"), "0") << "no stream to hold";
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
  EXPECT_EQ(Column(held[0], "holds_stream"), "0");
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

TEST_P(MariaDbAdminTest, AReplayedHeadPublishesFirstAndItsStreamFollowsInOrder) {
  store_ = OpenHoldingStore(*harness_);
  const auto ids = Enqueue(3, "orders", "order-1");
  Abandon({ids[0]});
  EXPECT_TRUE(ClaimIds(*store_).empty());
  EXPECT_EQ(admin_->Replay(ById({ids[0]}), /*dry_run=*/true).count, 1);
  EXPECT_TRUE(ClaimIds(*store_).empty()) << "a dry run releases nothing";
  EXPECT_EQ(admin_->Replay(ById({ids[0]}), false).count, 1);
  EXPECT_EQ(Column(ids[0], "holds_stream"), "0");
  EXPECT_EQ(ClaimIds(*store_), ids);
}

TEST_P(MariaDbAdminTest, AHeldMessageIsNotPurged) {
  store_ = OpenHoldingStore(*harness_);
  const auto ids = Enqueue(2, "orders", "order-1");
  Abandon({ids[0]});
  RetentionPolicy now;
  now.published = std::chrono::seconds{0};
  now.abandoned = std::chrono::seconds{0};
  EXPECT_EQ(admin_->Purge(now, 10), 0) << "it still holds its stream";
  EXPECT_EQ(admin_->Skip(ById({ids[0]}), false).count, 1);
  EXPECT_EQ(admin_->Purge(now, 10), 1);
}

INSTANTIATE_TEST_SUITE_P(MariaDb, MariaDbAdminTest, ::testing::Values(&harness),
                         [](const auto&) { return std::string{"connector_c"}; });

}  // namespace
}  // namespace outbox::testing
