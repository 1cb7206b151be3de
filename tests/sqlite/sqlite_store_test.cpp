// The SQLite store: the Store and Admin contract suites, the writer in the caller's transaction,
// and what only SQLite's Admin has (its interrupted count, its file).
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
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
