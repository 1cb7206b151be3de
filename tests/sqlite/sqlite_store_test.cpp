// The SQLite store: the Store contract suite, and the writer in the caller's transaction.
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <thread>

#include "../store/store_contract.h"
#include "../support/header_limits.h"
#include "outbox/store/sqlite.h"

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
