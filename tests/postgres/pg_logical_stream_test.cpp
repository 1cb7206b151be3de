// WAL mode's reader of a logical replication slot (src/store/postgres/logical_stream.h) against a
// real PostgreSQL: commit order across many writers, rolled-back and foreign messages left out,
// contents intact, confirmation reaching the slot and nothing unconfirmed, restarts, a terminated
// walsender, a missing or busy slot, bounded waits, an idle slot kept moving. Each test uses a
// slot, a publication and a message prefix of its own, dropped at its end even when it fails.
// Also the text form of LSNs and the pgoutput parser on malformed input (no server needed).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "logical_stream.h"
#include "outbox/store/wal.h"
#include "support/pg_test_support.h"
#include "support/tcp_proxy.h"
#include "support/wait.h"

namespace outbox::testing {
namespace {

using postgres::DecodedCommit;
using postgres::LogicalStream;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr milliseconds kLimit{20000};      // the longest any condition is waited for
constexpr milliseconds kStatusEvery{200};  // status updates in these tests

std::string Unique(std::string_view stem) {
  std::random_device device;
  return "wal_" + std::string{stem} + "_" + std::to_string(device() % 1000000000U);
}

// A slot, a publication and a prefix of this test's own, and a plain connection to write with.
// The destructor drops the slot once no stream reads it (streams are closed first: declare this
// before them), terminating only its own walsender if one lingers.
class TestSlot {
 public:
  TestSlot()
      : conn_(Connect()),
        slot_(Unique("slot")),
        publication_(Unique("pub")),
        prefix_("outbox_test_" + slot_) {
    Sql(conn_.get(), "CREATE PUBLICATION " + publication_);
    Sql(conn_.get(), "SELECT pg_create_logical_replication_slot('" + slot_ + "', 'pgoutput')");
  }
  ~TestSlot() {
    try {
      const bool released = WaitUntil([&] { return ActivePid().empty(); }, milliseconds{5000});
      if (!released) {
        Sql(conn_.get(),
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE slot_name = '" +
                slot_ + "' AND active_pid IS NOT NULL");
        WaitUntil([&] { return ActivePid().empty(); }, milliseconds{5000});
      }
      Sql(conn_.get(),
          "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
          "WHERE slot_name = '" +
              slot_ + "'");
    } catch (const std::exception& error) {
      ADD_FAILURE() << "could not drop replication slot " << slot_ << ": " << error.what();
    }
    PgResult dropped{PQexec(conn_.get(), ("DROP PUBLICATION IF EXISTS " + publication_).c_str())};
  }
  TestSlot(const TestSlot&) = delete;
  TestSlot& operator=(const TestSlot&) = delete;

  PGconn* conn() const { return conn_.get(); }
  const std::string& slot() const { return slot_; }
  const std::string& publication() const { return publication_; }
  const std::string& prefix() const { return prefix_; }

  std::unique_ptr<LogicalStream> Stream(const std::string& slot = {},
                                        const std::string& conninfo = PgUrl(),
                                        milliseconds silence_limit = {}) const {
    return std::make_unique<LogicalStream>(
        conninfo, slot.empty() ? slot_ : slot, publication_, prefix_,
        postgres::LogicalStreamTiming{.status_interval = kStatusEvery,
                                      .silence_limit = silence_limit});
  }

  std::string ActivePid() const {
    return Scalar(conn_.get(),
                  "SELECT coalesce((SELECT active_pid::text FROM pg_replication_slots WHERE "
                  "slot_name = '" +
                      slot_ + "'), '')");
  }
  Lsn ConfirmedFlush() const {
    return ParseLsn(Scalar(conn_.get(),
                           "SELECT confirmed_flush_lsn FROM pg_replication_slots "
                           "WHERE slot_name = '" +
                               slot_ + "'"))
        .value_or(0);
  }

 private:
  PgConn conn_;
  std::string slot_;
  std::string publication_;
  std::string prefix_;
};

// The test server's conninfo with its host and port replaced (to go through a TcpProxy).
std::string ConninfoVia(int port) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(PgUrl().c_str(), &error);
  if (options == nullptr) {
    PQfreemem(error);
    throw std::runtime_error("cannot parse the test server's conninfo");
  }
  std::string conninfo = "host=127.0.0.1 port=" + std::to_string(port);
  for (PQconninfoOption* option = options; option->keyword != nullptr; ++option) {
    const std::string_view key = option->keyword;
    if (option->val != nullptr && (key == "dbname" || key == "user" || key == "password")) {
      conninfo += " " + std::string{key} + "='" + option->val + "'";
    }
  }
  PQconninfoFree(options);
  return conninfo;
}

int PgPort() {
  const PgConn conn = Connect();
  return std::stoi(PQport(conn.get()));
}

// One transaction emitting `contents` as transactional messages with `prefix` (bytea, binary).
void Emit(PGconn* conn, const std::string& prefix, const std::vector<std::string>& contents,
          bool commit = true) {
  Sql(conn, "BEGIN");
  for (const auto& content : contents) {
    postgres::Exec(conn, "emit", "SELECT pg_logical_emit_message(true, $1, $2::bytea)",
                   {{.value = prefix}, {.value = content, .binary = true}});
  }
  Sql(conn, commit ? "COMMIT" : "ROLLBACK");
}

void EmitNonTransactional(PGconn* conn, const std::string& prefix, const std::string& content) {
  postgres::Exec(conn, "emit", "SELECT pg_logical_emit_message(false, $1, $2::bytea)",
                 {{.value = prefix}, {.value = content, .binary = true}});
}

// Commits from `stream` until `count` came or kLimit passed.
std::vector<DecodedCommit> Collect(LogicalStream& stream, std::size_t count) {
  std::vector<DecodedCommit> commits;
  const auto until = steady_clock::now() + kLimit;
  while (commits.size() < count && steady_clock::now() < until) {
    if (auto commit = stream.Next(milliseconds{200})) commits.push_back(std::move(*commit));
  }
  return commits;
}

// The single content of each commit, in order.
std::vector<std::string> Contents(const std::vector<DecodedCommit>& commits) {
  std::vector<std::string> contents;
  for (const auto& commit : commits) {
    contents.insert(contents.end(), commit.contents.begin(), commit.contents.end());
  }
  return contents;
}

// Calls Next (which sends the status updates) until `condition` holds; false after kLimit.
bool PumpUntil(LogicalStream& stream, const std::function<bool()>& condition) {
  const auto until = steady_clock::now() + kLimit;
  while (!condition()) {
    if (steady_clock::now() > until) return false;
    EXPECT_FALSE(stream.Next(milliseconds{50}).has_value());
  }
  return true;
}

// Start, retried while the slot is still held by a stream that is going away.
void StartWhenFree(LogicalStream& stream, Lsn after) {
  const auto until = steady_clock::now() + kLimit;
  for (;;) {
    try {
      stream.Start(after);
      return;
    } catch (const StoreError& error) {
      if (error.kind() != FailureKind::kUnavailable || steady_clock::now() > until) throw;
      std::this_thread::sleep_for(milliseconds{50});
    }
  }
}

// --- LSN text (no server) ---

TEST(WalLsnTest, FormatsAsPostgresDoes) {
  EXPECT_EQ(FormatLsn(0), "0/0");
  EXPECT_EQ(FormatLsn(0x16B374D848ULL), "16/B374D848");
  EXPECT_EQ(FormatLsn(0x16B3748ULL), "0/16B3748");
  EXPECT_EQ(FormatLsn(~Lsn{0}), "FFFFFFFF/FFFFFFFF");
}

TEST(WalLsnTest, ParsesWhatItFormatsAndRefusesAnythingElse) {
  for (const Lsn lsn :
       {Lsn{0}, Lsn{1}, Lsn{0x16B374D848ULL}, Lsn{0xFFFFFFFFULL}, Lsn{0x100000000ULL}, ~Lsn{0}}) {
    EXPECT_EQ(ParseLsn(FormatLsn(lsn)), lsn) << FormatLsn(lsn);
  }
  EXPECT_EQ(ParseLsn("16/b374d848"), Lsn{0x16B374D848ULL});
  EXPECT_EQ(ParseLsn("00000016/0000000A"), Lsn{0x160000000AULL});
  for (const std::string_view junk :
       {"", "/", "0", "0/", "/0", "1/2/3", "x/1", "1/g", " 1/2", "1/2 ", "-1/2", "+1/2", "1/-2",
        "0x1/2", "1 /2", "123456789/0", "0/100000000", "FFFFFFFFF/0"}) {
    EXPECT_FALSE(ParseLsn(junk).has_value()) << "'" << junk << "'";
  }
}

// --- pgoutput parsing (no server) ---

std::string Int64Bytes(std::uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i)
    bytes[static_cast<std::size_t>(i)] = static_cast<char>(value >> (56 - 8 * i));
  return bytes;
}
std::string Int32Bytes(std::uint32_t value) { return Int64Bytes(value).substr(4); }

TEST(PgoutputParseTest, ReadsBeginMessageAndCommit) {
  const auto begin =
      postgres::ParsePgoutput("B" + Int64Bytes(0x1234) + Int64Bytes(0) + Int32Bytes(7));
  EXPECT_EQ(begin.type, postgres::PgoutputMessage::Type::kBegin);
  EXPECT_EQ(begin.lsn, 0x1234U);
  EXPECT_EQ(begin.commit_time, TimePoint{std::chrono::seconds{946684800}});
  const std::string content{"a\0b", 3};
  const std::string message_bytes = std::string{"M\x01"} + Int64Bytes(0x1200) + "pre" +
                                    std::string(1, '\0') + Int32Bytes(3) + content;
  const auto message = postgres::ParsePgoutput(message_bytes);
  EXPECT_EQ(message.type, postgres::PgoutputMessage::Type::kMessage);
  EXPECT_TRUE(message.transactional);
  EXPECT_EQ(message.prefix, "pre");
  EXPECT_EQ(message.content, content);
  const auto commit =
      postgres::ParsePgoutput(std::string{"C"} + std::string(1, '\0') + Int64Bytes(0x1234) +
                              Int64Bytes(0x1260) + Int64Bytes(1000000));
  EXPECT_EQ(commit.type, postgres::PgoutputMessage::Type::kCommit);
  EXPECT_EQ(commit.lsn, 0x1234U);
  EXPECT_EQ(commit.end_lsn, 0x1260U);
  EXPECT_EQ(commit.commit_time, TimePoint{std::chrono::seconds{946684801}});
  EXPECT_EQ(postgres::ParsePgoutput("R anything").type, postgres::PgoutputMessage::Type::kOther);
}

TEST(PgoutputParseTest, RefusesEveryTruncationAndMalformedField) {
  const std::string begin = "B" + Int64Bytes(0x1234) + Int64Bytes(0) + Int32Bytes(7);
  const std::string message = std::string{"M\x01"} + Int64Bytes(0x1200) + "pre" +
                              std::string(1, '\0') + Int32Bytes(3) + "abc";
  const std::string commit = std::string{"C"} + std::string(1, '\0') + Int64Bytes(0x1234) +
                             Int64Bytes(0x1260) + Int64Bytes(0);
  for (const auto& whole : {begin, message, commit}) {
    for (std::size_t length = 0; length < whole.size(); ++length) {
      // A copy of exactly `length` bytes, so that a read past it is a sanitizer error.
      const auto cut = std::make_unique<char[]>(length + 1);
      std::copy_n(whole.data(), length, cut.get());
      EXPECT_THROW(postgres::ParsePgoutput({cut.get(), length}), std::invalid_argument)
          << whole[0] << " cut to " << length;
    }
    EXPECT_THROW(postgres::ParsePgoutput(whole + "x"), std::invalid_argument) << whole[0];
  }
  const auto error_of = [](const std::string& data) {
    try {
      postgres::ParsePgoutput(data);
    } catch (const std::invalid_argument& error) {
      return std::string{error.what()};
    }
    return std::string{"<no error>"};
  };
  EXPECT_NE(error_of(std::string{"M\x01"} + Int64Bytes(1) + "p" + std::string(1, '\0') +
                     Int32Bytes(0xFFFFFFFFU))
                .find("negative content length"),
            std::string::npos);
  EXPECT_NE(error_of(std::string{"M\x01"} + Int64Bytes(1) + "p" + std::string(1, '\0') +
                     Int32Bytes(0x7FFFFFFFU) + "abc")
                .find("ends inside its content"),
            std::string::npos);
  EXPECT_NE(error_of(std::string{"M\x01"} + Int64Bytes(1) + "no-nul").find("NUL"),
            std::string::npos);
  EXPECT_NE(
      error_of(std::string{"M\x03"} + Int64Bytes(1) + "p" + std::string(1, '\0') + Int32Bytes(0))
          .find("unknown flags"),
      std::string::npos);
  EXPECT_NE(error_of("S" + Int32Bytes(1)).find("unknown pgoutput message type 83"),
            std::string::npos);
  EXPECT_NE(error_of(std::string{"C"} + std::string(1, '\0') + Int64Bytes(0x1260) +
                     Int64Bytes(0x1234) + Int64Bytes(0))
                .find("not after it"),
            std::string::npos);
}

TEST(LogicalStreamArgumentsTest, RefusesBadNames) {
  const auto make = [](std::string slot, std::string publication, std::string prefix) {
    LogicalStream stream{PgUrl(), std::move(slot), std::move(publication), std::move(prefix)};
  };
  EXPECT_NO_THROW(make("ok_slot_1", "ok_pub", "outbox"));
  for (const std::string& bad :
       std::vector<std::string>{"", "Slot", "a\"b", "a'b", "a-b", "a b", std::string(64, 'a')}) {
    EXPECT_THROW(make(bad, "pub", "outbox"), std::invalid_argument) << bad;
    EXPECT_THROW(make("slot", bad, "outbox"), std::invalid_argument) << bad;
  }
  EXPECT_NO_THROW(make(std::string(63, 'a'), std::string(63, 'b'), "outbox"));
  EXPECT_THROW(make("slot", "pub", ""), std::invalid_argument);
  EXPECT_THROW(make("slot", "pub", std::string{"a\0b", 3}), std::invalid_argument);
  EXPECT_THROW(LogicalStream("host='unterminated password=secret", "slot", "pub", "outbox"),
               std::invalid_argument);
}

// --- against the server ---

class PgLogicalStreamTest : public ::testing::Test {
 protected:
  TestSlot slot_;  // first: dropped after the test's streams are closed
};

// 4 writers, 500 transactions each, one in ten rolled back, read while they write: every
// committed content exactly once, in strictly increasing commit order, each writer's in its order.
TEST_F(PgLogicalStreamTest, ReturnsEveryCommittedTransactionOnceInCommitOrder) {
  constexpr int kWriters = 4;
  constexpr int kEach = 500;
  auto stream = slot_.Stream();
  stream->Start(0);
  std::set<std::string> committed;
  for (int writer = 0; writer < kWriters; ++writer) {
    for (int i = 0; i < kEach; ++i) {
      if (i % 10 != 7) committed.insert("w" + std::to_string(writer) + "-" + std::to_string(i));
    }
  }
  std::vector<std::thread> writers;
  writers.reserve(kWriters);
  std::atomic<int> failures{0};
  for (int writer = 0; writer < kWriters; ++writer) {
    writers.emplace_back([&, writer] {
      try {
        const auto conn = Connect();
        for (int i = 0; i < kEach; ++i) {
          Emit(conn.get(), slot_.prefix(), {"w" + std::to_string(writer) + "-" + std::to_string(i)},
               i % 10 != 7);
        }
      } catch (const std::exception& error) {
        ++failures;
        ADD_FAILURE() << error.what();
      }
    });
  }
  const auto commits = Collect(*stream, committed.size());
  for (auto& writer : writers) writer.join();
  ASSERT_EQ(failures.load(), 0);
  ASSERT_EQ(commits.size(), committed.size());
  std::set<std::string> seen;
  std::map<int, int> last_of_writer;
  for (std::size_t i = 0; i < commits.size(); ++i) {
    ASSERT_EQ(commits[i].contents.size(), 1U);
    if (i > 0) {
      ASSERT_GT(commits[i].end_lsn, commits[i - 1].end_lsn) << i;
    }
    const auto& content = commits[i].contents[0];
    ASSERT_TRUE(seen.insert(content).second) << "twice: " << content;
    const int writer = std::stoi(content.substr(1));
    const int number = std::stoi(content.substr(content.find('-') + 1));
    if (last_of_writer.contains(writer)) {
      EXPECT_GT(number, last_of_writer[writer]) << content;
    }
    last_of_writer[writer] = number;
  }
  EXPECT_EQ(seen, committed);
  EXPECT_FALSE(stream->Next(milliseconds{300}).has_value());
  EXPECT_GE(stream->Received(), commits.back().end_lsn);
}

TEST_F(PgLogicalStreamTest, LeavesOutRollbacksOtherPrefixesAndNonTransactionalMessages) {
  auto stream = slot_.Stream();
  stream->Start(0);
  Emit(slot_.conn(), slot_.prefix(), {"rolled back"}, false);
  Emit(slot_.conn(), slot_.prefix() + "x", {"longer prefix"});
  Emit(slot_.conn(), "other", {"other prefix"});
  EmitNonTransactional(slot_.conn(), slot_.prefix(), "non-transactional");
  Emit(slot_.conn(), slot_.prefix().substr(1), {"shorter prefix"});
  Sql(slot_.conn(), "BEGIN");
  EmitNonTransactional(slot_.conn(), slot_.prefix(), "non-transactional in a transaction");
  Sql(slot_.conn(), "COMMIT");
  Emit(slot_.conn(), slot_.prefix(), {"marker"});
  const auto commits = Collect(*stream, 1);
  ASSERT_EQ(commits.size(), 1U);
  EXPECT_EQ(commits[0].contents, std::vector<std::string>{"marker"});
  EXPECT_EQ(stream->IgnoredNonTransactional(), 2U);
  EXPECT_GE(stream->Received(), commits[0].end_lsn);
  EXPECT_FALSE(stream->Next(milliseconds{300}).has_value());
  // The commit time is the server's, close to now.
  EXPECT_LT(std::chrono::abs(std::chrono::system_clock::now() - commits[0].commit_time),
            std::chrono::minutes{1});
}

TEST_F(PgLogicalStreamTest, KeepsBinaryAndLargeContentsIntact) {
  auto stream = slot_.Stream();
  stream->Start(0);
  std::string every_byte;
  for (int i = 0; i < 256; ++i) every_byte.push_back(static_cast<char>(i));
  every_byte += std::string(3, '\0');
  std::string large(1 << 20, '\0');
  std::mt19937 random{42};
  for (auto& byte : large) byte = static_cast<char>(random());
  Emit(slot_.conn(), slot_.prefix(), {every_byte});
  Emit(slot_.conn(), slot_.prefix(), {large});
  Emit(slot_.conn(), slot_.prefix(), {std::string{}});
  const auto contents = Contents(Collect(*stream, 3));
  ASSERT_EQ(contents.size(), 3U);
  EXPECT_EQ(contents[0], every_byte);
  EXPECT_TRUE(contents[1] == large) << "1 MiB content differs (" << contents[1].size() << " bytes)";
  EXPECT_EQ(contents[2], "");
}

TEST_F(PgLogicalStreamTest, KeepsATransactionsMessagesTogetherInOrder) {
  auto stream = slot_.Stream();
  stream->Start(0);
  Sql(slot_.conn(), "BEGIN");
  for (int i = 0; i < 5; ++i) {
    postgres::Exec(slot_.conn(), "emit", "SELECT pg_logical_emit_message(true, $1, $2::bytea)",
                   {{.value = slot_.prefix()}, {.value = "m" + std::to_string(i), .binary = true}});
    postgres::Exec(slot_.conn(), "emit", "SELECT pg_logical_emit_message(true, 'other', 'x')");
  }
  Sql(slot_.conn(), "COMMIT");
  Emit(slot_.conn(), slot_.prefix(), {"next"});
  const auto commits = Collect(*stream, 2);
  ASSERT_EQ(commits.size(), 2U);
  EXPECT_EQ(commits[0].contents, (std::vector<std::string>{"m0", "m1", "m2", "m3", "m4"}));
  EXPECT_EQ(commits[1].contents, std::vector<std::string>{"next"});
}

// The slot's confirmed_flush_lsn follows Confirm, and never goes past what was confirmed.
TEST_F(PgLogicalStreamTest, ConfirmMovesTheSlotOnlyAsFarAsConfirmed) {
  auto stream = slot_.Stream();
  stream->Start(0);
  Emit(slot_.conn(), slot_.prefix(), {"one"});
  Emit(slot_.conn(), slot_.prefix(), {"two"});
  const auto commits = Collect(*stream, 2);
  ASSERT_EQ(commits.size(), 2U);
  const Lsn before = slot_.ConfirmedFlush();
  ASSERT_LT(before, commits[0].end_lsn);
  // Received but not confirmed: the slot stays where it was for a few status updates.
  const auto until = steady_clock::now() + 4 * kStatusEvery;
  while (steady_clock::now() < until) stream->Next(milliseconds{50});
  EXPECT_EQ(slot_.ConfirmedFlush(), before);

  stream->Confirm(commits[0].end_lsn);
  stream->Confirm(commits[0].end_lsn - 1);  // never moves back
  ASSERT_TRUE(PumpUntil(*stream, [&] { return slot_.ConfirmedFlush() >= commits[0].end_lsn; }));
  EXPECT_EQ(slot_.ConfirmedFlush(), commits[0].end_lsn);
  const auto later = steady_clock::now() + 4 * kStatusEvery;
  while (steady_clock::now() < later) stream->Next(milliseconds{50});
  EXPECT_EQ(slot_.ConfirmedFlush(), commits[0].end_lsn);

  // Close sends what was confirmed since the last update.
  stream->Confirm(commits[1].end_lsn);
  stream->Close();
  EXPECT_TRUE(WaitUntil([&] { return slot_.ConfirmedFlush() == commits[1].end_lsn; }, kLimit));
}

// A confirmed position past what was received (a caller's slip) would make the slot skip what is
// in between: it is reported only as far as the stream got.
TEST_F(PgLogicalStreamTest, ConfirmPastWhatWasReceivedIsHeldBack) {
  auto stream = slot_.Stream();
  stream->Start(0);
  Emit(slot_.conn(), slot_.prefix(), {"one"});
  const auto one = Collect(*stream, 1);
  ASSERT_EQ(one.size(), 1U);
  stream->Confirm(one[0].end_lsn + 100000000);
  ASSERT_TRUE(PumpUntil(*stream, [&] { return slot_.ConfirmedFlush() >= one[0].end_lsn; }));
  EXPECT_LE(slot_.ConfirmedFlush(), stream->Received());
  EXPECT_LT(slot_.ConfirmedFlush(), one[0].end_lsn + 100000000);
  // What came after the received position is still delivered to a new stream.
  Emit(slot_.conn(), slot_.prefix(), {"two"});
  stream.reset();
  auto restarted = slot_.Stream();
  StartWhenFree(*restarted, 0);
  EXPECT_EQ(Contents(Collect(*restarted, 1)), std::vector<std::string>{"two"});
}

// A transaction larger than one Next call can take (past its timeout a call reads at most 1024
// protocol messages) is kept whole across calls, and Received() stays behind it until its commit.
TEST_F(PgLogicalStreamTest, TransactionReadOverManyCallsStaysWhole) {
  auto stream = slot_.Stream();
  stream->Start(0);
  constexpr int kMessages = 3000;
  std::vector<std::string> contents;
  contents.reserve(kMessages);
  for (int i = 0; i < kMessages; ++i) {
    contents.push_back(std::to_string(i) + std::string(1000, static_cast<char>('a' + i % 26)));
  }
  Emit(slot_.conn(), slot_.prefix(), contents);
  std::optional<DecodedCommit> commit;
  int empty_calls = 0;
  std::vector<Lsn> received;
  const auto until = steady_clock::now() + kLimit;
  while (!commit && steady_clock::now() < until) {
    commit = stream->Next(milliseconds{0});
    if (!commit) {
      ++empty_calls;
      received.push_back(stream->Received());
    }
  }
  ASSERT_TRUE(commit.has_value());
  EXPECT_GE(empty_calls, (kMessages + 2) / 1024);
  EXPECT_TRUE(commit->contents == contents) << commit->contents.size() << " contents";
  for (const Lsn lsn : received) ASSERT_LT(lsn, commit->end_lsn) << FormatLsn(lsn);
  EXPECT_GE(stream->Received(), commit->end_lsn);
}

// A zero timeout returns what has already arrived: the WAL relay gathers a batch with such calls,
// so transactions the server has sent must come one per call, none held back for a later wait.
TEST_F(PgLogicalStreamTest, ZeroTimeoutReturnsTransactionsAlreadySent) {
  auto stream = slot_.Stream();
  stream->Start(0);
  Emit(slot_.conn(), slot_.prefix(), {"running"});
  ASSERT_EQ(Contents(Collect(*stream, 1)), std::vector<std::string>{"running"});
  constexpr int kTransactions = 20;
  for (int i = 0; i < kTransactions; ++i) Emit(slot_.conn(), slot_.prefix(), {std::to_string(i)});
  // The insert position: with synchronous_commit off the commits may not be written yet.
  const Lsn written = *ParseLsn(Scalar(slot_.conn(), "SELECT pg_current_wal_insert_lsn()"));
  const std::string pid = slot_.ActivePid();
  ASSERT_FALSE(pid.empty());
  // The walsender has sent them (sent_lsn) and waits for more WAL: its output is on our socket
  // (it waits for a writable socket instead while output is pending).
  const auto all_sent = [&] {
    return Scalar(slot_.conn(),
                  "SELECT coalesce((SELECT r.sent_lsn >= '" + FormatLsn(written) +
                      "'::pg_lsn AND a.wait_event = 'WalSenderWaitForWAL' FROM pg_stat_replication "
                      "r JOIN pg_stat_activity a USING (pid) WHERE r.pid = " +
                      pid + "), false)") == "t";
  };
  // Reading nothing meanwhile, so what the server sent waits on the socket.
  ASSERT_TRUE(WaitUntil(all_sent, kLimit));
  for (int i = 0; i < kTransactions; ++i) {
    const auto commit = stream->Next(milliseconds{0});
    ASSERT_TRUE(commit.has_value()) << "transaction " << i << " was sent but not returned";
    EXPECT_EQ(commit->contents, std::vector<std::string>{std::to_string(i)});
  }
}

TEST_F(PgLogicalStreamTest, StartAfterResumesSkippingWhatWasHandled) {
  auto stream = slot_.Stream();
  stream->Start(0);
  for (const char* content : {"a", "b", "c"}) Emit(slot_.conn(), slot_.prefix(), {content});
  const auto first = Collect(*stream, 3);
  ASSERT_EQ(Contents(first), (std::vector<std::string>{"a", "b", "c"}));
  stream->Close();

  // Resumed after "a": "b" and "c" only, at the same positions.
  StartWhenFree(*stream, first[0].end_lsn);
  EXPECT_EQ(stream->Received(), first[0].end_lsn);
  const auto resumed = Collect(*stream, 2);
  ASSERT_EQ(Contents(resumed), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(resumed[0].end_lsn, first[1].end_lsn);
  EXPECT_EQ(resumed[1].end_lsn, first[2].end_lsn);
  EXPECT_FALSE(stream->Next(milliseconds{300}).has_value());
  stream->Close();

  // Nothing was confirmed: from the start, everything comes again.
  StartWhenFree(*stream, 0);
  EXPECT_EQ(Contents(Collect(*stream, 3)), (std::vector<std::string>{"a", "b", "c"}));

  // Confirmed up to "b": a new stream (a restarted relay) starts after it whatever it asks.
  stream->Confirm(first[1].end_lsn);
  ASSERT_TRUE(PumpUntil(*stream, [&] { return slot_.ConfirmedFlush() >= first[1].end_lsn; }));
  stream.reset();
  auto restarted = slot_.Stream();
  StartWhenFree(*restarted, 0);
  EXPECT_EQ(Contents(Collect(*restarted, 1)), std::vector<std::string>{"c"});
  EXPECT_FALSE(restarted->Next(milliseconds{300}).has_value());
}

TEST_F(PgLogicalStreamTest, TerminatedWalsenderIsUnavailableAndStartResumes) {
  auto stream = slot_.Stream();
  stream->Start(0);
  Emit(slot_.conn(), slot_.prefix(), {"before"});
  const auto before = Collect(*stream, 1);
  ASSERT_EQ(before.size(), 1U);
  const std::string pid = slot_.ActivePid();
  ASSERT_FALSE(pid.empty());
  Sql(slot_.conn(), "SELECT pg_terminate_backend(" + pid + ")");  // this test's walsender only

  std::optional<StoreError> failure;
  const auto until = steady_clock::now() + kLimit;
  while (!failure && steady_clock::now() < until) {
    try {
      EXPECT_FALSE(stream->Next(milliseconds{100}).has_value());
    } catch (const StoreError& error) {
      failure = error;
    }
  }
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->kind(), FailureKind::kUnavailable) << failure->what();
  const std::string message = failure->what();
  EXPECT_NE(message.find(slot_.slot()), std::string::npos) << message;
  EXPECT_NE(message.find("host=127.0.0.1"), std::string::npos) << message;
  EXPECT_EQ(message.find("password"), std::string::npos) << message;
  // Broken until started again.
  EXPECT_THROW(stream->Next(milliseconds{10}), StoreError);

  Emit(slot_.conn(), slot_.prefix(), {"after"});
  StartWhenFree(*stream, before[0].end_lsn);
  EXPECT_EQ(Contents(Collect(*stream, 1)), std::vector<std::string>{"after"});
}

// A connection cut without a word from the server: kUnavailable naming the server, then Start
// resumes.
TEST_F(PgLogicalStreamTest, CutConnectionIsUnavailable) {
  TcpProxy proxy{"127.0.0.1", PgPort()};
  auto stream = slot_.Stream({}, ConninfoVia(proxy.port()));
  stream->Start(0);
  Emit(slot_.conn(), slot_.prefix(), {"before"});
  ASSERT_EQ(Contents(Collect(*stream, 1)), std::vector<std::string>{"before"});
  proxy.DropAll();
  try {
    const auto until = steady_clock::now() + kLimit;
    while (steady_clock::now() < until) stream->Next(milliseconds{100});
    FAIL() << "no error after the connection was cut";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kUnavailable) << error.what();
    EXPECT_NE(std::string{error.what()}.find("port=" + std::to_string(proxy.port())),
              std::string::npos)
        << error.what();
    EXPECT_EQ(std::string{error.what()}.find("password"), std::string::npos) << error.what();
  }
  Emit(slot_.conn(), slot_.prefix(), {"after"});
  StartWhenFree(*stream, 0);
  EXPECT_EQ(Contents(Collect(*stream, 2)), (std::vector<std::string>{"before", "after"}));
}

// A server that goes silent (its replies held in the network) is noticed within the silence
// limit: a ping at half of it, then kUnavailable.
TEST_F(PgLogicalStreamTest, SilentServerIsUnavailableAfterTheSilenceLimit) {
  TcpProxy proxy{"127.0.0.1", PgPort()};
  constexpr milliseconds kSilence{1500};
  auto stream = slot_.Stream({}, ConninfoVia(proxy.port()), kSilence);
  stream->Start(0);
  // Quiet but alive: the server answers the pings, so a few silence limits pass without error.
  const auto alive_until = steady_clock::now() + 3 * kSilence;
  while (steady_clock::now() < alive_until) {
    ASSERT_NO_THROW(stream->Next(milliseconds{200}));
  }
  proxy.SetMode(TcpProxy::Mode::kHoldReplies);
  const auto held = steady_clock::now();
  try {
    const auto until = held + kLimit;
    while (steady_clock::now() < until) stream->Next(milliseconds{100});
    FAIL() << "no error from a silent server";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kUnavailable) << error.what();
    EXPECT_NE(std::string{error.what()}.find("no answer from the server"), std::string::npos)
        << error.what();
  }
  EXPECT_LT(steady_clock::now() - held, kSilence + milliseconds{1000});
}

// The default silence limit is the statement deadline when that is shorter (issue #40): a stream
// whose connection froze (nothing forwarded either way, the socket kept open) is given up at it.
TEST_F(PgLogicalStreamTest, AFrozenStreamIsGivenUpAtTheStatementDeadline) {
  TcpProxy proxy{"127.0.0.1", PgPort()};
  constexpr milliseconds kDeadline{1500};
  postgres::SetStatementDeadline(kDeadline);
  auto stream = slot_.Stream({}, ConninfoVia(proxy.port()));  // silence limit: the default
  postgres::SetStatementDeadline(postgres::kDefaultStatementDeadline);
  stream->Start(0);
  ASSERT_NO_THROW(stream->Next(milliseconds{300}));
  proxy.SetMode(TcpProxy::Mode::kFreeze);
  const auto frozen = steady_clock::now();
  try {
    const auto until = frozen + kLimit;
    while (steady_clock::now() < until) stream->Next(milliseconds{100});
    FAIL() << "no error from a frozen stream";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kUnavailable) << error.what();
  }
  EXPECT_LT(steady_clock::now() - frozen, kDeadline + milliseconds{1000});
  // A new connection goes through the same proxy (once the frozen walsender is ended).
  Sql(slot_.conn(),
      "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE "
      "slot_name = '" +
          slot_.slot() + "' AND active_pid IS NOT NULL");
  Emit(slot_.conn(), slot_.prefix(), {"after the freeze"});
  StartWhenFree(*stream, 0);
  EXPECT_EQ(Contents(Collect(*stream, 1)), (std::vector<std::string>{"after the freeze"}));
}

// Starting on a server that accepts the connection and never answers ends at the deadline.
TEST_F(PgLogicalStreamTest, StartOnAServerThatNeverAnswersEndsAtTheDeadline) {
  TcpProxy proxy{"127.0.0.1", PgPort()};
  proxy.SetMode(TcpProxy::Mode::kBlackhole);
  postgres::SetStatementDeadline(milliseconds{2000});  // connect_timeout 2 s
  auto stream = slot_.Stream({}, ConninfoVia(proxy.port()));
  postgres::SetStatementDeadline(postgres::kDefaultStatementDeadline);
  const auto start = steady_clock::now();
  try {
    stream->Start(0);
    FAIL() << "started on a server that never answers";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kUnavailable) << error.what();
  }
  EXPECT_LT(steady_clock::now() - start, milliseconds{4000});
}

TEST_F(PgLogicalStreamTest, MissingSlotIsPermanentAndSaysHowToRecover) {
  auto stream = slot_.Stream(Unique("missing"));
  try {
    stream->Start(0);
    FAIL() << "started on a missing slot";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kPermanent);
    const std::string message = error.what();
    EXPECT_NE(message.find("does not exist"), std::string::npos) << message;
    EXPECT_NE(message.find("may be lost"), std::string::npos) << message;
    EXPECT_NE(message.find("outboxctl migrate --wal-slot"), std::string::npos) << message;
    EXPECT_EQ(message.find("password"), std::string::npos) << message;
  }
  // A missing publication, likewise.
  LogicalStream no_publication{PgUrl(), slot_.slot(), Unique("nopub"), slot_.prefix()};
  try {
    no_publication.Start(0);
    FAIL() << "started without the publication";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kPermanent);
    EXPECT_NE(std::string{error.what()}.find("publication"), std::string::npos) << error.what();
  }
}

TEST_F(PgLogicalStreamTest, SecondReaderOfTheSlotIsUnavailable) {
  auto first = slot_.Stream();
  first->Start(0);
  auto second = slot_.Stream();
  try {
    second->Start(0);
    FAIL() << "two readers of one slot";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kUnavailable);
    const std::string message = error.what();
    EXPECT_NE(message.find("is in use by another process (pid " + slot_.ActivePid() + ")"),
              std::string::npos)
        << message;
  }
  // The first one reads on.
  Emit(slot_.conn(), slot_.prefix(), {"still"});
  EXPECT_EQ(Contents(Collect(*first, 1)), std::vector<std::string>{"still"});
}

TEST_F(PgLogicalStreamTest, NextWithNothingToReadReturnsAtItsTimeout) {
  auto stream = slot_.Stream();
  stream->Start(0);
  for (const milliseconds timeout : {milliseconds{300}, milliseconds{0}, milliseconds{50}}) {
    const auto start = steady_clock::now();
    EXPECT_FALSE(stream->Next(timeout).has_value());
    const auto took = steady_clock::now() - start;
    EXPECT_GE(took, timeout);
    EXPECT_LT(took, timeout + milliseconds{150});
  }
}

// An idle slot is kept moving: Received() follows the server's keepalives past unrelated WAL, and
// confirming it lets the slot go past that WAL.
TEST_F(PgLogicalStreamTest, IdleSlotAdvancesPastUnrelatedTraffic) {
  const std::string schema = Unique("traffic");
  Sql(slot_.conn(), "CREATE SCHEMA " + schema + "; CREATE TABLE " + schema + ".t (x int)");
  struct DropSchema {
    PGconn* conn;
    std::string name;
    ~DropSchema() { PgResult dropped{PQexec(conn, ("DROP SCHEMA " + name + " CASCADE").c_str())}; }
  } drop_schema{slot_.conn(), schema};

  auto stream = slot_.Stream();
  stream->Start(0);
  Emit(slot_.conn(), slot_.prefix(), {"ours"});
  const auto ours = Collect(*stream, 1);
  ASSERT_EQ(ours.size(), 1U);
  stream->Confirm(ours[0].end_lsn);
  Sql(slot_.conn(), "INSERT INTO " + schema + ".t SELECT generate_series(1, 100)");
  const Lsn traffic = *ParseLsn(Scalar(slot_.conn(), "SELECT pg_current_wal_insert_lsn()"));
  ASSERT_GT(traffic, ours[0].end_lsn);

  ASSERT_TRUE(PumpUntil(*stream, [&] { return stream->Received() >= traffic; }))
      << FormatLsn(stream->Received()) << " < " << FormatLsn(traffic);
  stream->Confirm(stream->Received());
  EXPECT_TRUE(PumpUntil(*stream, [&] { return slot_.ConfirmedFlush() >= traffic; }))
      << FormatLsn(slot_.ConfirmedFlush()) << " < " << FormatLsn(traffic);
}

}  // namespace
}  // namespace outbox::testing
