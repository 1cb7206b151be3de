// The SQLite store: the Store and Admin contract suites, the writer in the caller's transaction,
// and what only SQLite's Admin has (its interrupted count, its file).
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <set>
#include <thread>

#include "../store/admin_contract.h"
#include "../store/store_contract.h"
#include "outbox/store/sqlite.h"
#include "support/header_limits.h"

namespace outbox::testing {
namespace {

std::string TempPath() {
  static int counter = 0;
  return (std::filesystem::temp_directory_path() /
          ("outbox-sqlite-test-" + std::to_string(getpid()) + "-" + std::to_string(++counter) +
           ".db"))
      .string();
}

void RemoveDatabase(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
}

class SqliteHarness final : public StoreHarness {
 public:
  ~SqliteHarness() override {
    if (!path_.empty()) RemoveDatabase(path_);
  }
  void Reset() override {
    if (!path_.empty()) RemoveDatabase(path_);
    path_ = TempPath();
    sqlite::Migrate(path_);
  }
  std::unique_ptr<Store> Open(const RetryPolicy& retry, const RetentionPolicy& retention) override {
    return sqlite::OpenStore(
        {.path = path_, .retry = retry, .retention = retention, .random = SeededRandom(1)});
  }

 private:
  std::string path_;
};

SqliteHarness harness;
INSTANTIATE_TEST_SUITE_P(Sqlite, StoreContractTest, ::testing::Values(&harness),
                         [](const auto&) { return std::string{"sqlite3"}; });

struct DbCloser {
  void operator()(sqlite3* db) const noexcept { sqlite3_close_v2(db); }
};
using Db = std::unique_ptr<sqlite3, DbCloser>;

Db OpenDb(const std::string& path) {
  sqlite3* raw = nullptr;
  sqlite3_open(path.c_str(), &raw);
  Db db{raw};
  sqlite3_busy_timeout(db.get(), 10000);
  return db;
}

void Exec(sqlite3* db, const char* sql) {
  ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
}

// The text of the first column of the first row of `sql`, "<null>" for NULL.
std::string Scalar(sqlite3* db, const std::string& sql) {
  sqlite3_stmt* raw = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &raw, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  const std::unique_ptr<sqlite3_stmt, decltype(&sqlite3_finalize)> statement{raw,
                                                                             &sqlite3_finalize};
  if (sqlite3_step(raw) != SQLITE_ROW || sqlite3_column_type(raw, 0) == SQLITE_NULL) {
    return "<null>";
  }
  return reinterpret_cast<const char*>(sqlite3_column_text(raw, 0));
}

class SqliteAdminHarness final : public AdminHarness {
 public:
  ~SqliteAdminHarness() override {
    if (!path_.empty()) RemoveDatabase(path_);
  }
  void Reset() override {
    db_.reset();
    if (!path_.empty()) RemoveDatabase(path_);
    path_ = TempPath();
    sqlite::Migrate(path_);
    db_ = OpenDb(path_);
  }
  std::unique_ptr<Store> Open(const RetryPolicy& retry, const RetentionPolicy& retention) override {
    return sqlite::OpenStore(
        {.path = path_, .retry = retry, .retention = retention, .random = SeededRandom(7)});
  }
  std::unique_ptr<Admin> OpenAdmin() override { return sqlite::OpenAdmin(path_); }
  std::string Column(const MessageId& id, const std::string& column) override {
    return Scalar(db_.get(),
                  "SELECT " + column + " FROM outbox_messages WHERE id = '" + id.ToString() + "'");
  }
  std::string Snapshot() override {
    std::string rows;
    sqlite3_stmt* raw = nullptr;
    sqlite3_prepare_v2(db_.get(), "SELECT * FROM outbox_messages ORDER BY id", -1, &raw, nullptr);
    const std::unique_ptr<sqlite3_stmt, decltype(&sqlite3_finalize)> statement{raw,
                                                                               &sqlite3_finalize};
    while (sqlite3_step(raw) == SQLITE_ROW) {
      for (int column = 0; column < sqlite3_column_count(raw); ++column) {
        const auto* text = sqlite3_column_text(raw, column);
        rows += text == nullptr ? "<null>" : reinterpret_cast<const char*>(text);
        rows += '|';
      }
      rows += '\n';
    }
    return rows;
  }
  void Backdate(const std::vector<MessageId>& ids, std::chrono::seconds age) override {
    for (const auto& id : ids) {
      Exec(db_.get(), ("UPDATE outbox_messages SET created_at = created_at - " +
                       std::to_string(age.count() * 1000) + " WHERE id = '" + id.ToString() + "'")
                          .c_str());
    }
  }
  sqlite3* db() const { return db_.get(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  Db db_;
};

SqliteAdminHarness admin_harness;
INSTANTIATE_TEST_SUITE_P(Sqlite, AdminContractTest, ::testing::Values(&admin_harness),
                         [](const auto&) { return std::string{"sqlite3"}; });

// The contract's fixture, with the file at hand for what only SQLite's Admin does.
class SqliteAdminTest : public AdminContractTest {};

TEST_P(SqliteAdminTest, CountByTopicGivesUpAfterItsTimeout) {
  // 200,000 rows in 1,000 groups: grouping them takes far longer than a millisecond.
  Exec(admin_harness.db(),
       "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200000)"
       " INSERT INTO outbox_messages (id, topic, partition, target, payload, content_type,"
       " headers, available_at, created_at)"
       " SELECT printf('00000000-0000-7000-8000-%012d', i), 'topic-' || (i % 1000), 0,"
       " 'default', '{}', 'application/json', '{}', 0, 0 FROM n");
  const auto started = std::chrono::steady_clock::now();
  EXPECT_FALSE(admin_->CountByTopic(std::chrono::milliseconds{1}).has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds{1});
  // The watchdog ends with the count: the next one, with time enough, counts everything.
  const auto counts = admin_->CountByTopic(std::chrono::seconds{30});
  ASSERT_TRUE(counts.has_value());
  std::int64_t sum = 0;
  for (const auto& group : *counts) sum += group.messages;
  EXPECT_EQ(sum, 200000);
  EXPECT_EQ(counts->size(), static_cast<std::size_t>(Admin::kTopicGroups + 1));
  EXPECT_EQ(admin_->List({}, 10).messages.size(), 10U);
}

TEST_P(SqliteAdminTest, OpenRefusesAnUnmigratedFileAndBadArguments) {
  const std::string empty = TempPath();
  // A file that does not exist is named as such, and not created (outboxctl on a wrong path).
  for (const auto& open :
       std::vector<std::function<void()>>{[&] { (void)sqlite::OpenAdmin(empty); },
                                          [&] { (void)sqlite::OpenStore({.path = empty}); }}) {
    try {
      open();
      FAIL() << "opened a database that does not exist";
    } catch (const StoreError& error) {
      EXPECT_EQ(error.kind(), FailureKind::kPermanent);
      EXPECT_NE(std::string{error.what()}.find("it does not exist"), std::string::npos)
          << error.what();
    }
    EXPECT_FALSE(std::filesystem::exists(empty));
  }
  // A database without the outbox tables.
  {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(empty.c_str(), &raw), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(raw, "CREATE TABLE app (id INTEGER)", nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(raw);
  }
  try {
    sqlite::OpenAdmin(empty);
    FAIL() << "opened a database without outbox tables";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kPermanent);
    EXPECT_NE(std::string{error.what()}.find("has no outbox tables"), std::string::npos);
  }
  RemoveDatabase(empty);
  EXPECT_THROW(sqlite::OpenAdmin(""), std::invalid_argument);
  EXPECT_THROW(sqlite::OpenAdmin(admin_harness.path(), std::chrono::milliseconds{-1}),
               std::invalid_argument);
  EXPECT_THROW(sqlite::OpenAdmin("/nonexistent-dir/outbox.db"), StoreError);
}

INSTANTIATE_TEST_SUITE_P(Sqlite, SqliteAdminTest, ::testing::Values(&admin_harness),
                         [](const auto&) { return std::string{"sqlite3"}; });

class SqliteWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempPath();
    sqlite::Migrate(path_);
    sqlite::Migrate(path_);  // idempotent
  }
  void TearDown() override { RemoveDatabase(path_); }
  std::string path_;
};

TEST_F(SqliteWriterTest, EnqueuesInTheCallersTransactionAndNeverCommits) {
  auto db = OpenDb(path_);
  auto store = sqlite::OpenStore({.path = path_});
  const sqlite::Writer writer;
  NewMessage message;
  message.topic = "orders";
  message.payload = R"({"id":1})";
  message.stream_key = "order-1";
  EXPECT_THROW(writer.Enqueue(db.get(), message), std::logic_error);  // no transaction

  Exec(db.get(), "CREATE TABLE orders (id INTEGER)");
  Exec(db.get(), "BEGIN");
  Exec(db.get(), "INSERT INTO orders VALUES (1)");
  writer.Enqueue(db.get(), message);
  Exec(db.get(), "ROLLBACK");
  EXPECT_TRUE(store->Claim({.owner = "r", .max_messages = 10}).empty());

  Exec(db.get(), "BEGIN");
  const MessageId id = writer.Enqueue(db.get(), message);
  EXPECT_EQ(sqlite3_get_autocommit(db.get()), 0);  // still the caller's transaction
  Exec(db.get(), "COMMIT");
  const auto batch = store->Claim({.owner = "r", .max_messages = 10});
  ASSERT_EQ(batch.size(), 1U);
  EXPECT_EQ(batch[0].id, id);
  EXPECT_EQ(batch[0].stream_seq, 1);  // the rolled-back enqueue left no gap

  NewMessage bad = message;
  bad.headers = {{"outbox-x", "1"}};
  Exec(db.get(), "BEGIN");
  EXPECT_THROW(writer.Enqueue(db.get(), bad), InvalidMessage);
  Exec(db.get(), "ROLLBACK");
}

// The writer's MessageLimits (the defaults, or StoreOptions::limits) refuse a message no sink
// could carry, naming the limit; headers at the limits are stored and claimed intact.
TEST_F(SqliteWriterTest, HeaderLimitsAreEnforcedAtEnqueue) {
  auto db = OpenDb(path_);
  const sqlite::Writer writer;
  NewMessage message;
  message.topic = "t";
  message.headers = HeadersAtTheLimits();
  const auto refusal = [&](const sqlite::Writer& w, const NewMessage& m) -> std::string {
    Exec(db.get(), "BEGIN");
    try {
      w.Enqueue(db.get(), m);
      Exec(db.get(), "ROLLBACK");
      return "";
    } catch (const InvalidMessage& error) {
      Exec(db.get(), "ROLLBACK");
      return error.what();
    }
  };
  NewMessage more = message;
  more.headers["x-one-more"] = "";
  EXPECT_EQ(refusal(writer, more),
            "outbox enqueue: message 0: headers: 65 headers, over the limit of 64 "
            "(max_header_count)");
  more = message;
  more.headers.at("x-010") += 'h';
  EXPECT_EQ(refusal(writer, more),
            "outbox enqueue: message 0: headers: 8193 bytes of names and values, over the limit "
            "of 8192 (max_headers_bytes)");
  more = message;
  more.headers = {{std::string(129, 'n'), "v"}};
  EXPECT_NE(refusal(writer, more)
                .find("header name is 129 bytes, over the limit of 128 "
                      "(max_header_name_bytes)"),
            std::string::npos);
  more.headers = {{"x", std::string(4097, 'v')}};
  EXPECT_EQ(refusal(writer, more),
            "outbox enqueue: message 0: header 'x': value is 4097 bytes, over the limit of 4096 "
            "(max_header_value_bytes)");
  // Limits of one's own.
  EXPECT_NE(refusal(sqlite::Writer{MessageLimits{.max_header_count = 63}}, message)
                .find("(max_header_count)"),
            std::string::npos);

  Exec(db.get(), "BEGIN");
  writer.Enqueue(db.get(), message);
  Exec(db.get(), "COMMIT");
  auto store = sqlite::OpenStore({.path = path_});
  const auto batch = store->Claim({.owner = "r", .max_messages = 10});
  ASSERT_EQ(batch.size(), 1U);
  EXPECT_EQ(batch[0].headers, message.headers);
}

TEST_F(SqliteWriterTest, StreamSeqIsGapFreeAndInCommitOrderUnderFourWriters) {
  std::vector<std::thread> writers;
  std::atomic<int> committed{0};
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&, w] {
      auto db = OpenDb(path_);
      const sqlite::Writer writer;
      NewMessage message;
      message.topic = "t";
      message.stream_key = "hot";
      for (int i = 0; i < 100; ++i) {
        Exec(db.get(), "BEGIN IMMEDIATE");
        writer.Enqueue(db.get(), message);
        const bool commit = (i + w) % 5 != 0;
        Exec(db.get(), commit ? "COMMIT" : "ROLLBACK");
        if (commit) ++committed;
      }
    });
  }
  for (auto& writer : writers) writer.join();
  auto store = sqlite::OpenStore({.path = path_});
  std::vector<std::int64_t> seqs;
  for (;;) {
    const auto batch = store->Claim({.owner = "r", .max_messages = 1000});
    if (batch.empty()) break;
    std::vector<LeasedId> leases;
    for (const auto& envelope : batch) {
      seqs.push_back(*envelope.stream_seq);
      leases.push_back(LeasedId::Of(envelope));
    }
    store->Complete("r", leases);
  }
  ASSERT_EQ(seqs.size(), static_cast<std::size_t>(committed.load()));
  for (std::size_t i = 0; i < seqs.size(); ++i)
    EXPECT_EQ(seqs[i], static_cast<std::int64_t>(i + 1));
}

TEST_F(SqliteWriterTest, BadOptionsAndUnmigratedDatabasesAreRefused) {
  EXPECT_THROW(sqlite::OpenStore({.path = ""}), ConfigError);
  const std::string empty = TempPath();
  EXPECT_THROW(sqlite::OpenStore({.path = empty}), StoreError);
  RemoveDatabase(empty);
  EXPECT_THROW(sqlite::OpenStore({.path = "/nonexistent-dir/x.db"}), StoreError);
  EXPECT_THROW(sqlite::Migrate(path_, 0), std::invalid_argument);
  // on_abandon = "hold" needs the PostgreSQL store (issue #43): refused by the sink's key.
  RetryPolicy holding;
  holding.hold_targets = {"orders"};
  try {
    (void)sqlite::OpenStore({.path = path_, .retry = holding});
    ADD_FAILURE() << "a SQLite store accepted on_abandon = \"hold\"";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key(), "sinks.orders.on_abandon");
    EXPECT_NE(std::string{error.what()}.find("needs the PostgreSQL store"), std::string::npos);
  }
}

// Fan-out (issue #24): a message is written once per target, each copy numbered in its own
// (target, stream) and claimed behind its own target's messages only.
class SqliteFanOutTest : public SqliteWriterTest {
 protected:
  void SetUp() override {
    SqliteWriterTest::SetUp();
    db_ = OpenDb(path_);
  }
  void TearDown() override {
    db_.reset();
    SqliteWriterTest::TearDown();
  }

  static NewMessage Message(std::string topic, std::optional<std::string> stream,
                            std::vector<std::string> targets = {}) {
    NewMessage message;
    message.topic = std::move(topic);
    message.stream_key = std::move(stream);
    message.targets = std::move(targets);
    return message;
  }

  // Writes `messages` with the writer in a transaction of its own: the ids of all copies.
  std::vector<std::vector<MessageId>> Write(const std::vector<NewMessage>& messages) {
    Exec(db_.get(), "BEGIN");
    auto ids = writer_.EnqueueCopies(db_.get(), messages);
    Exec(db_.get(), "COMMIT");
    return ids;
  }

  // What the writer refuses `messages` with ("" when it writes them, rolled back either way);
  // checks that a refusal left nothing written in the transaction.
  std::string Refusal(const std::vector<NewMessage>& messages) {
    Exec(db_.get(), "BEGIN");
    std::string error;
    try {
      writer_.EnqueueCopies(db_.get(), messages);
    } catch (const InvalidMessage& refused) {
      error = refused.what();
      EXPECT_EQ(Scalar(db_.get(), "SELECT count(*) FROM outbox_messages"), "0") << error;
    }
    Exec(db_.get(), "ROLLBACK");
    return error;
  }

  std::string Column(const MessageId& id, const std::string& column) {
    return Scalar(db_.get(),
                  "SELECT " + column + " FROM outbox_messages WHERE id = '" + id.ToString() + "'");
  }

  static std::vector<MessageId> Ids(const std::vector<Envelope>& batch) {
    std::vector<MessageId> ids;
    for (const auto& envelope : batch) ids.push_back(envelope.id);
    return ids;
  }

  static std::vector<LeasedId> Leases(const std::vector<Envelope>& batch) {
    std::vector<LeasedId> leases;
    for (const auto& envelope : batch) leases.push_back(LeasedId::Of(envelope));
    return leases;
  }

  static std::vector<Envelope> Claim(Store& store, std::vector<std::string> paused = {},
                                     int max_messages = 100) {
    ClaimRequest request{.owner = "relay", .max_messages = max_messages};
    request.paused_targets = std::move(paused);
    return store.Claim(request);
  }

  Db db_;
  const sqlite::Writer writer_;
};

TEST_F(SqliteFanOutTest, EachTargetGetsACopyNumberedInItsOwnStreamSharingTheFirstCopysId) {
  const std::vector<std::string> three{"default", "partner", "audit"};
  const auto copies =
      Write({Message("orders", "s", three), Message("orders", "s", three),
             Message("orders", "s", three), Message("orders", std::nullopt, {"partner", "default"}),
             Message("orders", "s", {"partner"})});
  ASSERT_EQ(copies.size(), 5U);
  for (std::size_t i = 0; i < 3; ++i) ASSERT_EQ(copies[i].size(), 3U) << i;
  ASSERT_EQ(copies[3].size(), 2U);
  ASSERT_EQ(copies[4].size(), 1U);
  std::vector<MessageId> all;
  for (const auto& message : copies) all.insert(all.end(), message.begin(), message.end());
  EXPECT_EQ(std::set<MessageId>(all.begin(), all.end()).size(), all.size()) << "ids repeat";
  // The column: the first copy's id on every copy, NULL on a message with one copy.
  EXPECT_EQ(Column(copies[0][0], "event_id"), copies[0][0].ToString());
  EXPECT_EQ(Column(copies[0][2], "event_id"), copies[0][0].ToString());
  EXPECT_EQ(Column(copies[4][0], "event_id"), "<null>");

  auto store = sqlite::OpenStore({.path = path_});
  const auto batch = Claim(*store);
  EXPECT_EQ(Ids(batch), all) << "message by message, each in the order of its targets";
  ASSERT_EQ(batch.size(), 12U);
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t copy = 0; copy < 3; ++copy) {
      const Envelope& envelope = batch[i * 3 + copy];
      EXPECT_EQ(envelope.target, three[copy]);
      EXPECT_EQ(envelope.event_id, copies[i][0]);
      EXPECT_EQ(envelope.EventId(), copies[i][0]);
      EXPECT_EQ(envelope.stream_seq, static_cast<std::int64_t>(i + 1))
          << "message " << i << " for " << three[copy];
    }
  }
  EXPECT_EQ(batch[9].target, "partner");
  EXPECT_EQ(batch[10].target, "default");
  EXPECT_EQ(batch[10].event_id, copies[3][0]);
  EXPECT_FALSE(batch[10].stream_seq.has_value());
  EXPECT_FALSE(batch[11].event_id.has_value()) << "one copy: its own event";
  EXPECT_EQ(batch[11].EventId(), copies[4][0]);
  EXPECT_EQ(batch[11].stream_seq, 4) << "partner's fourth of stream s";

  // Enqueue returns the first copy's id of each message.
  Exec(db_.get(), "BEGIN");
  const std::vector<NewMessage> two{Message("orders", "s", {"audit", "default"}),
                                    Message("orders", "s")};
  const auto firsts = writer_.Enqueue(db_.get(), two);
  Exec(db_.get(), "COMMIT");
  ASSERT_EQ(firsts.size(), 2U);
  EXPECT_EQ(Column(firsts[0], "target"), "audit");
  EXPECT_EQ(Scalar(db_.get(), "SELECT count(*) FROM outbox_messages WHERE event_id = '" +
                                  firsts[0].ToString() + "'"),
            "2");
  EXPECT_EQ(Column(firsts[1], "target"), "default");
  EXPECT_EQ(Column(firsts[1], "event_id"), "<null>");
}

TEST_F(SqliteFanOutTest, AMessageThatNamesNoTargetGoesToItsTopicsDefaultTargets) {
  Exec(db_.get(),
       R"(INSERT INTO outbox_topic_settings VALUES ('orders', '["partner", "default"]'))");
  const auto copies = Write({Message("orders", "s"), Message("other", "s"),
                             Message("orders", "s", {"audit"}), Message("orders", std::nullopt)});
  ASSERT_EQ(copies.size(), 4U);
  ASSERT_EQ(copies[0].size(), 2U);
  EXPECT_EQ(Column(copies[0][0], "target"), "partner");
  EXPECT_EQ(Column(copies[0][1], "target"), "default");
  EXPECT_EQ(Column(copies[0][1], "event_id"), copies[0][0].ToString());
  ASSERT_EQ(copies[1].size(), 1U) << "a topic without a row";
  EXPECT_EQ(Column(copies[1][0], "target"), "default");
  ASSERT_EQ(copies[2].size(), 1U) << "the message's own targets win";
  EXPECT_EQ(Column(copies[2][0], "target"), "audit");
  EXPECT_EQ(copies[3].size(), 2U);

  // Read at every call: a change of the row applies to the next one.
  Exec(db_.get(), R"(UPDATE outbox_topic_settings SET targets = '["audit"]')");
  const auto later = Write({Message("orders", "s")});
  ASSERT_EQ(later.size(), 1U);
  ASSERT_EQ(later[0].size(), 1U);
  EXPECT_EQ(Column(later[0][0], "target"), "audit");
  EXPECT_EQ(Column(later[0][0], "stream_seq"), "2");
  EXPECT_EQ(Column(later[0][0], "event_id"), "<null>");
}

TEST_F(SqliteFanOutTest, ABadTopicSettingsRowIsRefusedNamingTheTopicAndNothingIsWritten) {
  std::string many = "[";
  for (int i = 0; i <= static_cast<int>(kMaxTargets); ++i) {
    many += (i == 0 ? "\"t" : ", \"t") + std::to_string(i) + "\"";
  }
  many += "]";
  const std::vector<std::pair<std::string, std::string>> bad{
      {"[]", "are an empty array"},
      {"default", "are not a JSON array"},
      {R"({"targets": ["a"]})", "are not a JSON array"},
      {R"(["a", 1])", "hold a number, not a name"},
      {R"(["a", "b", "a"])", "are invalid: targets: 'a' is named twice"},
      {R"(["a", ""])", "are invalid: target must not be empty"},
      {many, "are invalid: targets: 33 targets, over the limit of 32"},
  };
  Exec(db_.get(), "INSERT INTO outbox_topic_settings VALUES ('orders', '[]')");
  for (const auto& [targets, why] : bad) {
    sqlite3_stmt* raw = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db_.get(), "UPDATE outbox_topic_settings SET targets = ?1", -1,
                                 &raw, nullptr),
              SQLITE_OK);
    sqlite3_bind_text(raw, 1, targets.c_str(), -1, SQLITE_TRANSIENT);
    EXPECT_EQ(sqlite3_step(raw), SQLITE_DONE);
    sqlite3_finalize(raw);
    // The valid message before it is not written either.
    EXPECT_EQ(Refusal({Message("fine", "s"), Message("orders", "s")}),
              "outbox enqueue: message 1: topic 'orders': its default targets "
              "(outbox_topic_settings.targets) " +
                  why)
        << targets;
  }
  // Its own targets do not read the row.
  EXPECT_EQ(Refusal({Message("orders", "s", {"default"})}), "");
}

TEST_F(SqliteFanOutTest, AStreamCountedBeforeFanOutContinuesFromItsLastSeqForEveryTarget) {
  // outbox_streams: the counter per stream across targets of the schema before fan-out.
  Exec(db_.get(), "INSERT INTO outbox_streams VALUES ('s', 17)");
  const auto first = Write({Message("o", "s", {"default"})});
  const auto partner = Write({Message("o", "s", {"partner"})});
  const auto both = Write({Message("o", "s", {"default", "partner"})});
  const auto fresh = Write({Message("o", "fresh", {"default"})});
  EXPECT_EQ(Column(first[0][0], "stream_seq"), "18");
  EXPECT_EQ(Column(partner[0][0], "stream_seq"), "18");
  EXPECT_EQ(Column(both[0][0], "stream_seq"), "19");
  EXPECT_EQ(Column(both[0][1], "stream_seq"), "19");
  EXPECT_EQ(Column(fresh[0][0], "stream_seq"), "1") << "a stream without an old counter";
  EXPECT_EQ(Scalar(db_.get(), "SELECT last_seq FROM outbox_streams WHERE stream_key = 's'"), "17")
      << "read, never written";
  EXPECT_EQ(Scalar(db_.get(), "SELECT count(*) FROM outbox_streams"), "1");
}

// The schema of src/store/sqlite/schema.cpp before fan-out (issue #24), comments left out.
constexpr const char* kSchemaBeforeFanOut = R"(
CREATE TABLE IF NOT EXISTS outbox_settings (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  partition_count INTEGER NOT NULL CHECK (partition_count BETWEEN 1 AND 4096)
);
CREATE TABLE IF NOT EXISTS outbox_streams (
  stream_key TEXT PRIMARY KEY,
  last_seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox_messages (
  position INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  topic TEXT NOT NULL,
  stream_key TEXT,
  stream_seq INTEGER,
  partition INTEGER NOT NULL,
  target TEXT NOT NULL,
  type TEXT,
  payload BLOB NOT NULL,
  content_type TEXT NOT NULL,
  headers TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending'
    CHECK (status IN ('pending', 'processing', 'failed', 'published', 'abandoned')),
  attempts INTEGER NOT NULL DEFAULT 0,
  available_at INTEGER NOT NULL,
  last_error TEXT,
  lease_owner TEXT,
  lease_until INTEGER,
  lease_epoch INTEGER NOT NULL DEFAULT 0,
  created_at INTEGER NOT NULL,
  published_at INTEGER,
  abandoned_at INTEGER
);
CREATE INDEX IF NOT EXISTS outbox_messages_claimable ON outbox_messages (position)
  WHERE status IN ('pending', 'failed');
CREATE INDEX IF NOT EXISTS outbox_messages_in_flight ON outbox_messages (stream_key, position)
  WHERE status IN ('processing', 'failed');
CREATE INDEX IF NOT EXISTS outbox_messages_status ON outbox_messages (status);
CREATE INDEX IF NOT EXISTS outbox_messages_waiting_streams
  ON outbox_messages (target, stream_key, position) WHERE status IN ('pending', 'failed');
CREATE INDEX IF NOT EXISTS outbox_messages_abandoned_streams
  ON outbox_messages (stream_key, stream_seq) WHERE status = 'abandoned';
)";

TEST(SqliteUpgradeTest, MigrateUpgradesADatabaseCreatedBeforeFanOut) {
  const std::string path = TempPath();
  auto db = OpenDb(path);
  Exec(db.get(), kSchemaBeforeFanOut);
  Exec(db.get(), "INSERT INTO outbox_settings VALUES (1, 64)");
  Exec(db.get(), "INSERT INTO outbox_streams VALUES ('s', 5)");
  const std::string old_id = "01900000-0000-7000-8000-000000000005";
  Exec(db.get(),
       ("INSERT INTO outbox_messages (id, topic, stream_key, stream_seq, partition, target,"
        " payload, content_type, headers, available_at, created_at) VALUES ('" +
        old_id +
        "', 'orders', 's', 5, 3, 'default', '{\"n\":5}', 'application/json',"
        " '{\"correlation_id\":\"c\"}', 0, 0)")
           .c_str());
  // Before the upgrade the store and the admin refuse the file, naming Migrate.
  for (const auto& open : std::vector<std::function<void()>>{
           [&] { sqlite::OpenStore({.path = path}); }, [&] { sqlite::OpenAdmin(path); }}) {
    try {
      open();
      ADD_FAILURE() << "opened tables of the old schema";
    } catch (const StoreError& error) {
      EXPECT_NE(std::string{error.what()}.find("older version: call outbox::sqlite::Migrate"),
                std::string::npos)
          << error.what();
    }
  }

  sqlite::Migrate(path);
  sqlite::Migrate(path);  // idempotent
  EXPECT_EQ(Scalar(db.get(),
                   "SELECT count(*) FROM pragma_table_info('outbox_messages') WHERE name = "
                   "'event_id'"),
            "1");
  EXPECT_EQ(Scalar(db.get(),
                   "SELECT count(*) FROM sqlite_master WHERE name IN ('outbox_target_streams',"
                   " 'outbox_topic_settings', 'outbox_messages_event_id')"),
            "3");
  EXPECT_EQ(Scalar(db.get(),
                   "SELECT count(*) FROM sqlite_master WHERE name = "
                   "'outbox_messages_waiting_streams'"),
            "0")
      << "no query reads it since head-of-line is per target";
  EXPECT_EQ(Scalar(db.get(), "SELECT event_id FROM outbox_messages"), "<null>");

  const sqlite::Writer writer;
  Exec(db.get(), "BEGIN");
  const std::vector<NewMessage> fan_out{
      {.topic = "orders", .stream_key = "s", .targets = {"default", "partner"}}};
  const auto copies = writer.EnqueueCopies(db.get(), fan_out);
  Exec(db.get(), "COMMIT");
  ASSERT_EQ(copies.size(), 1U);
  ASSERT_EQ(copies[0].size(), 2U);

  auto store = sqlite::OpenStore({.path = path});
  const auto batch = store->Claim({.owner = "relay"});
  ASSERT_EQ(batch.size(), 3U);
  EXPECT_EQ(batch[0].id.ToString(), old_id) << "the old row is claimable, first";
  EXPECT_FALSE(batch[0].event_id.has_value());
  EXPECT_EQ(batch[0].stream_seq, 5);
  EXPECT_EQ(batch[0].payload, R"({"n":5})");
  EXPECT_EQ(batch[0].headers, (Headers{{"correlation_id", "c"}}));
  EXPECT_EQ(batch[1].id, copies[0][0]);
  EXPECT_EQ(batch[1].stream_seq, 6) << "continues from the old counter";
  EXPECT_EQ(batch[2].id, copies[0][1]);
  EXPECT_EQ(batch[2].stream_seq, 6) << "continues from the old counter";
  EXPECT_EQ(batch[2].event_id, copies[0][0]);

  auto admin = sqlite::OpenAdmin(path);
  MessageFilter old_event;
  old_event.event_id = Uuid::Parse(old_id);
  const auto page = admin->List(old_event, 10);
  ASSERT_EQ(page.messages.size(), 1U);
  EXPECT_EQ(page.messages[0].id.ToString(), old_id);
  EXPECT_EQ(page.messages[0].event_id.ToString(), old_id);
  MessageFilter new_event;
  new_event.event_id = copies[0][0];
  EXPECT_EQ(admin->List(new_event, 10).messages.size(), 2U);

  admin.reset();
  store.reset();
  db.reset();
  RemoveDatabase(path);
}

TEST_F(SqliteFanOutTest, APausedTargetHoldsBackOnlyItsOwnCopiesOfAStream) {
  const std::vector<std::string> two{"default", "partner"};
  const auto copies =
      Write({Message("o", "s", two), Message("o", "s", two), Message("o", "s", two)});
  auto store = sqlite::OpenStore({.path = path_});
  const auto batch = Claim(*store, {"partner"});
  EXPECT_EQ(Ids(batch), (std::vector<MessageId>{copies[0][0], copies[1][0], copies[2][0]}));
  for (std::size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(batch[i].stream_seq, static_cast<std::int64_t>(i + 1));
  }
  EXPECT_EQ(store->Complete("relay", Leases(batch)).settled, 3);
  EXPECT_TRUE(Claim(*store, {"partner"}).empty());
  // Resumed: its copies, in stream order.
  EXPECT_EQ(Ids(Claim(*store)), (std::vector<MessageId>{copies[0][1], copies[1][1], copies[2][1]}));
}

TEST_F(SqliteFanOutTest, ATargetsFailedHeadHoldsBackOnlyItsOwnCopiesOfAStream) {
  const std::vector<std::string> two{"default", "partner"};
  const auto copies =
      Write({Message("o", "s", two), Message("o", "s", two), Message("o", "s", two)});
  auto store = sqlite::OpenStore({.path = path_});
  const auto heads = Claim(*store, {}, 2);
  ASSERT_EQ(Ids(heads), (std::vector<MessageId>{copies[0][0], copies[0][1]}));
  const FailedMessage failed = FailedMessage::Of(
      heads[1], Failure{FailureKind::kUnavailable, "asked to wait", std::chrono::seconds{60}});
  EXPECT_EQ(store->Fail("relay", std::span{&failed, 1}).settled, 1);
  EXPECT_EQ(store->Complete("relay", Leases({heads[0]})).settled, 1);

  const auto batch = Claim(*store);
  EXPECT_EQ(Ids(batch), (std::vector<MessageId>{copies[1][0], copies[2][0]}))
      << "the default copies go on; partner's wait behind its retry";
  ASSERT_EQ(batch.size(), 2U);
  EXPECT_EQ(batch[0].stream_seq, 2);
  EXPECT_EQ(batch[1].stream_seq, 3);
  EXPECT_EQ(store->Complete("relay", Leases(batch)).settled, 2);
  EXPECT_TRUE(Claim(*store).empty()) << "partner's head still waits for its retry";
}

TEST_F(SqliteFanOutTest, StreamPrevSeqLooksOnlyAtTheMessagesOwnTarget) {
  const std::vector<std::string> two{"default", "partner"};
  const auto copies = Write({Message("o", "s", two), Message("o", "s", two)});
  auto store = sqlite::OpenStore({.path = path_});
  const auto heads = Claim(*store, {}, 2);
  ASSERT_EQ(Ids(heads), (std::vector<MessageId>{copies[0][0], copies[0][1]}));
  const FailedMessage failed =
      FailedMessage::Of(heads[1], Failure{FailureKind::kPermanent, "malformed for partner"});
  EXPECT_EQ(store->Fail("relay", std::span{&failed, 1}).settled, 1);  // abandoned
  EXPECT_EQ(store->Complete("relay", Leases({heads[0]})).settled, 1);

  const auto batch = Claim(*store);
  ASSERT_EQ(Ids(batch), (std::vector<MessageId>{copies[1][0], copies[1][1]}));
  EXPECT_EQ(batch[0].stream_seq, 2);
  EXPECT_FALSE(batch[0].stream_prev_seq.has_value())
      << "default's seq 1 was published; partner's seq 1 is another target's";
  EXPECT_EQ(batch[1].stream_seq, 2);
  EXPECT_EQ(batch[1].stream_prev_seq, 0) << "partner's seq 1 was abandoned";
}

TEST_F(SqliteFanOutTest, TheAdminFindsAndChangesTheCopiesOfAnEvent) {
  const auto copies = Write({Message("o", "s", {"default", "partner", "audit"}), Message("o", "s"),
                             Message("o", "s", {"default", "partner"})});
  const MessageId event = copies[0][0];
  auto admin = sqlite::OpenAdmin(path_);
  const auto list = [&](const MessageFilter& filter) {
    std::vector<MessageId> ids;
    for (const auto& message : admin->List(filter, 100).messages) ids.push_back(message.id);
    return ids;
  };
  MessageFilter by_event;
  by_event.event_id = event;
  const auto page = admin->List(by_event, 100);
  ASSERT_EQ(page.messages.size(), 3U);
  for (std::size_t copy = 0; copy < 3; ++copy) {
    EXPECT_EQ(page.messages[copy].id, copies[0][copy]);
    EXPECT_EQ(page.messages[copy].event_id, event);
  }
  MessageFilter by_copy;  // a later copy's own id: itself
  by_copy.event_id = copies[0][1];
  EXPECT_EQ(list(by_copy), (std::vector<MessageId>{copies[0][1]}));
  MessageFilter single;
  single.event_id = copies[1][0];
  const auto alone = admin->List(single, 100).messages;
  ASSERT_EQ(alone.size(), 1U);
  EXPECT_EQ(alone[0].id, copies[1][0]);
  EXPECT_EQ(alone[0].event_id, copies[1][0]) << "one copy: its own event";
  MessageFilter audit = by_event;
  audit.target = "audit";
  EXPECT_EQ(list(audit), (std::vector<MessageId>{copies[0][2]}));
  MessageFilter elsewhere = by_event;
  elsewhere.ids = std::vector<MessageId>{copies[2][0]};
  EXPECT_TRUE(list(elsewhere).empty());
  MessageFilter partner;
  partner.target = "partner";
  std::vector<MessageId> events;
  for (const auto& message : admin->List(partner, 100).messages) {
    events.push_back(message.event_id);
  }
  EXPECT_EQ(events, (std::vector<MessageId>{copies[0][0], copies[2][0]}));
  const auto detail = admin->Show(copies[0][2]);
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->summary.event_id, event);

  const auto dry = admin->Abandon(by_event, "bad event", true);
  EXPECT_EQ(dry.ids, copies[0]);
  EXPECT_EQ(Column(copies[0][0], "status"), "pending");
  EXPECT_EQ(admin->Abandon(by_event, "bad event", false).ids, copies[0]);
  MessageFilter abandoned;
  abandoned.status = MessageStatus::kAbandoned;
  EXPECT_EQ(list(abandoned), copies[0]) << "the other messages are untouched";
  MessageFilter replay = by_event;
  replay.target = "partner";
  EXPECT_EQ(admin->Replay(replay, false).ids, (std::vector<MessageId>{copies[0][1]}));
  EXPECT_EQ(Column(copies[0][1], "status"), "pending");
  EXPECT_EQ(Column(copies[0][2], "status"), "abandoned");
}

TEST(SqliteWakeupTest, WaitEndsOnInterruptOrDeadline) {
  auto wakeup = sqlite::OpenWakeup();
  wakeup->AnnounceIdle();
  wakeup->Withdraw();
  EXPECT_EQ(wakeup->Wait(std::chrono::steady_clock::now() + std::chrono::milliseconds{50}),
            WakeReason::kTimeout);
  std::thread interrupter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds{50});
    wakeup->Interrupt();
  });
  EXPECT_EQ(wakeup->Wait(std::chrono::steady_clock::now() + std::chrono::seconds{10}),
            WakeReason::kInterrupted);
  interrupter.join();
}

}  // namespace
}  // namespace outbox::testing
