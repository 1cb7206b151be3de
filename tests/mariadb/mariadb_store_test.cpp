// The relay-side store on MariaDB beyond the contract suite: claimers at once, head-of-line with
// two owners, a writer's long transaction, a connection killed on the server, bad options, and the
// claim's cost on a backlog (OUTBOX_MARIADB_BACKLOG=20000 for the measurement in the report).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <thread>

#include "outbox/core/error.h"
#include "support/mariadb_test_support.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

NewMessage Message(std::string topic, std::optional<std::string> stream_key = std::nullopt) {
  NewMessage message;
  message.topic = std::move(topic);
  message.stream_key = std::move(stream_key);
  message.payload = R"({"n":1})";
  return message;
}

ClaimRequest Request(std::string owner, int max = 100, milliseconds lease = milliseconds{60000}) {
  ClaimRequest request;
  request.owner = std::move(owner);
  request.max_messages = max;
  request.lease_duration = lease;
  return request;
}

std::vector<LeasedId> Leases(const std::vector<Envelope>& batch) {
  std::vector<LeasedId> leases;
  for (const auto& envelope : batch) leases.push_back(LeasedId::Of(envelope));
  return leases;
}

class MariaDbStoreTest : public ::testing::Test {
 protected:
  MariaDbTestSchema schema_;

  mariadb::StoreOptions Options() {
    mariadb::StoreOptions options;
    options.url = MariaDbUrl();
    options.schema = schema_.name();
    return options;
  }
  std::unique_ptr<Store> OpenStore() { return mariadb::OpenStore(Options()); }
  std::string Scalar(const std::string& sql) {
    return MariaDbScalar(schema_.conn(), sql).value_or("NULL");
  }
  // `count` messages on `streams` streams (none: unkeyed), enqueued in batches of 1,000.
  static void Backlog(Store& store, int count, int streams) {
    std::vector<NewMessage> batch;
    for (int i = 0; i < count; ++i) {
      batch.push_back(
          Message("t", streams > 0 ? std::optional<std::string>{"s" + std::to_string(i % streams)}
                                   : std::nullopt));
      if (batch.size() == 1000 || i + 1 == count) {
        store.Enqueue(batch);
        batch.clear();
      }
    }
  }
};

TEST_F(MariaDbStoreTest, FourClaimersAtOnceNeverGetTheSameMessage) {
  constexpr int kRows = 6000;
  constexpr int kClaimers = 4;
  Backlog(*OpenStore(), kRows / 2, 0);
  Backlog(*OpenStore(), kRows / 2, 300);  // and keyed: head-of-line between claimers
  std::vector<std::vector<MessageId>> claimed(kClaimers);
  std::vector<std::thread> claimers;
  for (int c = 0; c < kClaimers; ++c) {
    claimers.emplace_back([&, c] {
      auto store = OpenStore();
      const std::string owner = "relay-" + std::to_string(c);
      for (;;) {
        const auto batch = store->Claim(Request(owner, 100));
        // Empty: the others hold what is left (a claimer whose pick another claimer has locked
        // gets nothing that round, as on PostgreSQL), or it is all done.
        if (batch.empty() && store->Stats().pending == 0) break;
        for (const auto& envelope : batch) {
          claimed[static_cast<std::size_t>(c)].push_back(envelope.id);
        }
        EXPECT_EQ(store->Complete(owner, Leases(batch)).settled,
                  static_cast<std::int64_t>(batch.size()));
      }
    });
  }
  for (auto& claimer : claimers) claimer.join();
  std::set<MessageId> all;
  std::size_t total = 0;
  int busy = 0;
  for (const auto& ids : claimed) {
    total += ids.size();
    all.insert(ids.begin(), ids.end());
    busy += ids.empty() ? 0 : 1;
  }
  EXPECT_EQ(total, std::size_t{kRows}) << "some message was claimed twice or never";
  EXPECT_EQ(all.size(), std::size_t{kRows});
  EXPECT_GE(busy, 2) << "the claimers did not actually run side by side";
  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM " + schema_.name() + ".messages"), "0");
}

// Two relays without partition leases share streams: a stream's message is never handed to one
// while an earlier one is leased by the other, and the stream's order holds across them.
TEST_F(MariaDbStoreTest, HeadOfLineHoldsAcrossTwoOwners) {
  auto a = OpenStore();
  auto b = OpenStore();
  const std::vector<NewMessage> messages{Message("t", "s"), Message("t", "s"), Message("t", "x"),
                                         Message("t", "s")};
  const auto ids = a->Enqueue(messages);
  const auto first = a->Claim(Request("a", 1));
  ASSERT_EQ(first.size(), 1U);
  EXPECT_EQ(first[0].id, ids[0]);
  const auto other = b->Claim(Request("b"));
  ASSERT_EQ(other.size(), 1U) << "only stream x: s waits behind a's lease";
  EXPECT_EQ(other[0].id, ids[2]);
  const auto behind = a->Claim(Request("a"));  // behind its own lease, a may go on
  ASSERT_EQ(behind.size(), 2U);
  EXPECT_EQ(behind[0].id, ids[1]);
  EXPECT_EQ(behind[1].id, ids[3]);
  // a gives the last two back and publishes the first: b takes the stream over, in order.
  EXPECT_EQ(a->Release("a", Leases(behind)).settled, 2);
  EXPECT_TRUE(b->Claim(Request("b")).empty()) << "s#1 is still a's";
  EXPECT_EQ(a->Complete("a", Leases(first)).settled, 1);
  const auto taken = b->Claim(Request("b"));
  ASSERT_EQ(taken.size(), 2U);
  EXPECT_EQ(taken[0].id, ids[1]);
  EXPECT_EQ(taken[1].id, ids[3]);
  EXPECT_EQ(taken[0].stream_seq, 2);
  EXPECT_EQ(taken[1].stream_seq, 3);
}

// Two claimers at once: a row the other claimer has locked (its claim not yet committed) is
// skipped, and so is the rest of its stream, which would otherwise go to this claimer while the
// other still publishes the stream's head.
TEST_F(MariaDbStoreTest, AStreamIsNotSplitBetweenTwoClaimersAtOnce) {
  auto store = OpenStore();
  const std::vector<NewMessage> messages{Message("t", "s"), Message("t", "s"), Message("t", "x")};
  const auto ids = store->Enqueue(messages);
  auto other = MariaDbConnect();  // a claim under way: s#1 locked, its transaction open
  other.Execute("test", "START TRANSACTION");
  const mariadb::Value head = mariadb::IdBytes(ids[0]);
  other.Run("test", "SELECT id FROM " + schema_.name() + ".messages WHERE id = ? FOR UPDATE",
            {&head, 1});
  const auto batch = store->Claim(Request("b"));
  ASSERT_EQ(batch.size(), 1U) << "s#2 must wait for s#1";
  EXPECT_EQ(batch[0].id, ids[2]);
  other.Execute("test", "ROLLBACK");
  const auto rest = store->Claim(Request("b"));
  ASSERT_EQ(rest.size(), 2U);
  EXPECT_EQ(rest[0].id, ids[0]);
  EXPECT_EQ(rest[1].id, ids[1]);
}

TEST_F(MariaDbStoreTest, ALongOpenTransactionIsDeliveredAfterItCommits) {
  auto slow = MariaDbConnect();
  auto store = OpenStore();
  mariadb::Writer writer{schema_.name()};
  slow.Execute("test", "START TRANSACTION");
  const MessageId early = writer.Enqueue(slow.Ready(), Message("t"));  // the smaller id
  std::vector<NewMessage> later(5, Message("t"));
  store->Enqueue(later);
  auto batch = store->Claim(Request("relay"));
  EXPECT_EQ(batch.size(), 5U);
  EXPECT_EQ(store->Complete("relay", Leases(batch)).settled, 5);
  slow.Execute("test", "COMMIT", true);
  batch = store->Claim(Request("relay"));
  ASSERT_EQ(batch.size(), 1U);
  EXPECT_EQ(batch[0].id, early);
}

// The procedures run READ COMMITTED whatever the caller's session says: called from a
// REPEATABLE READ session, the claim's pick would share-lock what it reads and wait for a writer's
// uncommitted row until the lock wait timed out.
TEST_F(MariaDbStoreTest, TheClaimDoesNotWaitForOpenWritersWhateverTheSessionsIsolation) {
  auto store = OpenStore();
  const NewMessage committed = Message("t");
  store->Enqueue(std::span{&committed, 1});
  auto writer_conn = MariaDbConnect();
  writer_conn.Execute("test", "START TRANSACTION");
  mariadb::Writer writer{schema_.name()};
  writer.Enqueue(writer_conn.Ready(), Message("t"));
  auto caller = MariaDbConnect();
  caller.Execute("test", "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ");
  caller.Execute("test", "SET SESSION innodb_lock_wait_timeout = 2");
  const auto started = Clock::now();
  const auto result = caller.Run(
      "test", "CALL " + schema_.name() + ".relay_claim('relay', 10, 60000, NULL, NULL, NULL, 0)");
  EXPECT_LT(Clock::now() - started, milliseconds{1000});
  ASSERT_EQ(result.sets.size(), 2U);
  EXPECT_EQ(result.sets[1].rows.size(), 1U) << "the committed message, not the open one";
  writer_conn.Execute("test", "ROLLBACK");
}

// Names and ids reach the procedures as JSON data, never as SQL: quotes, backslashes and
// non-ASCII in a paused target's name and in a failure's text go through unchanged.
TEST_F(MariaDbStoreTest, OddTextIsDataNotSql) {
  auto store = OpenStore();
  NewMessage odd = Message("t");
  odd.targets = {"it's \"odd\" \\ é"};
  NewMessage plain = Message("t");
  const std::vector<NewMessage> messages{odd, plain};
  store->Enqueue(messages);
  ClaimRequest request = Request("relay");
  request.paused_targets = {"it's \"odd\" \\ é", "'); DROP TABLE messages; --"};
  const auto batch = store->Claim(request);
  ASSERT_EQ(batch.size(), 1U);
  EXPECT_EQ(batch[0].target, "default");
  const auto rest = store->Claim(Request("relay"));
  ASSERT_EQ(rest.size(), 1U);
  EXPECT_EQ(rest[0].target, "it's \"odd\" \\ é");
  const std::string reason = "nack: 'quoted' \"twice\" \\ \xff\xfe bytes";
  const FailedMessage failed = FailedMessage::Of(rest[0], Failure{FailureKind::kPermanent, reason});
  EXPECT_EQ(store->Fail("relay", std::span{&failed, 1}).settled, 1);
  const auto stored = Scalar("SELECT last_error FROM " + schema_.name() + ".messages");
  EXPECT_NE(stored.find("nack: 'quoted' \"twice\" \\ "), std::string::npos) << stored;
}

TEST_F(MariaDbStoreTest, BadOptionsAreConfigErrors) {
  auto options = Options();
  options.url = "";
  EXPECT_THROW(mariadb::OpenStore(options), ConfigError);
  options.url = "postgresql://127.0.0.1/outbox";
  EXPECT_THROW(mariadb::OpenStore(options), ConfigError);
  options.url = "mariadb://127.0.0.1:99999/outbox";
  EXPECT_THROW(mariadb::OpenStore(options), ConfigError);
  options = Options();
  options.schema = "Bad-Name";
  EXPECT_THROW(mariadb::OpenStore(options), ConfigError);
  options.schema = "";
  EXPECT_THROW(mariadb::OpenStore(options), ConfigError);
  options = Options();
  options.retry.max_attempts = 0;
  EXPECT_THROW(mariadb::OpenStore(options), ConfigError);
  options = Options();
  options.retention.published = std::chrono::seconds{-1};
  EXPECT_THROW(mariadb::OpenStore(options), ConfigError);
  options = Options();
  options.statement_deadline = milliseconds{0};
  EXPECT_THROW(mariadb::OpenStore(options), ConfigError);
  options = Options();
  options.schema = "not_migrated_here";
  try {
    mariadb::OpenStore(options);
    ADD_FAILURE() << "opened a schema that is not there";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kPermanent);
    EXPECT_NE(std::string{error.what()}.find("not migrated"), std::string::npos) << error.what();
  }
  // A server that is not there: unavailable, and the password never shows.
  options = Options();
  options.url = "mariadb://outbox:Sup3rSecretPw@127.0.0.1:1/outbox_test";
  try {
    mariadb::OpenStore(options);
    ADD_FAILURE() << "expected StoreError";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kUnavailable);
    EXPECT_EQ(std::string{error.what()}.find("Sup3rSecretPw"), std::string::npos) << error.what();
  }
}

TEST_F(MariaDbStoreTest, ReconnectsAfterTheConnectionIsKilled) {
  // The store's session is the one whose default database is the test's.
  auto options = Options();
  const auto query = options.url.find('?');
  options.url = options.url.substr(0, options.url.rfind('/', query) + 1) + schema_.name();
  auto store = mariadb::OpenStore(options);
  const NewMessage message = Message("t");
  store->Enqueue(std::span{&message, 1});
  const auto session = Scalar("SELECT MAX(ID) FROM information_schema.PROCESSLIST WHERE DB = '" +
                              schema_.name() + "'");
  schema_.conn().Execute("test", "KILL CONNECTION " + session);
  try {
    store->Stats();  // may notice the loss now...
  } catch (const StoreError& error) {
    EXPECT_TRUE(error.kind() == FailureKind::kOutcomeUnknown ||
                error.kind() == FailureKind::kUnavailable)
        << error.what();
  }
  EXPECT_EQ(store->Stats().pending, 1);  // ...and works again on the next call
  EXPECT_EQ(store->Claim(Request("relay")).size(), 1U);
}

// The claim's cost on a backlog of keyed messages: one claim of 500, then claim+complete rounds
// (the completion riding on the next claim, as the relay does) until it is drained, each stream
// in order. Prints the numbers.
TEST_F(MariaDbStoreTest, DrainsABacklogInStreamOrderAndMeasuresTheClaim) {
  const char* env = std::getenv("OUTBOX_MARIADB_BACKLOG");
  const int rows = env != nullptr ? std::max(1000, std::atoi(env)) : 3000;
  const int streams = std::max(1, rows / 20);
  auto store = OpenStore();
  auto started = Clock::now();
  Backlog(*store, rows, streams);
  const double enqueue_s = std::chrono::duration<double>(Clock::now() - started).count();

  started = Clock::now();
  ClaimResult round = store->ClaimRound(Request("relay", 500));
  const double first_ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
  ASSERT_EQ(round.messages.size(), 500U);
  std::map<std::string, std::int64_t> last_seq;
  std::size_t total = 0;
  int rounds = 1;
  started = Clock::now();
  while (!round.messages.empty()) {
    for (const auto& envelope : round.messages) {
      auto& seen = last_seq[*envelope.stream_key];
      ASSERT_EQ(*envelope.stream_seq, seen + 1) << "stream " << *envelope.stream_key;
      seen = *envelope.stream_seq;
    }
    total += round.messages.size();
    ClaimRequest next = Request("relay", 500);
    next.complete = Leases(round.messages);
    round = store->ClaimRound(next);
    ASSERT_EQ(round.completed.settled, static_cast<std::int64_t>(next.complete.size()));
    ++rounds;
  }
  const double drain_s = std::chrono::duration<double>(Clock::now() - started).count();
  EXPECT_EQ(total, static_cast<std::size_t>(rows));
  EXPECT_EQ(Scalar("SELECT COUNT(*) FROM " + schema_.name() + ".messages"), "0");
  if (env != nullptr) {
    // Measured only: the same under partition leases (every partition held, so that each claim
    // share-locks 64 lease rows and filters by partition).
    Backlog(*store, rows, streams);
    auto leases = mariadb::OpenPartitionLeases(MariaDbUrl(), schema_.name());
    ClaimRequest partitioned = Request("relay", 500);
    partitioned.partitions = leases->Heartbeat("relay", std::chrono::seconds{60}, {}).owned;
    started = Clock::now();
    std::size_t claimed = 0;
    int partitioned_rounds = 0;
    for (ClaimResult next = store->ClaimRound(partitioned);; ++partitioned_rounds) {
      claimed += next.messages.size();
      if (next.messages.empty()) break;
      partitioned.complete = Leases(next.messages);
      next = store->ClaimRound(partitioned);
    }
    const double partitioned_s = std::chrono::duration<double>(Clock::now() - started).count();
    EXPECT_EQ(claimed, static_cast<std::size_t>(rows));
    std::cout << "[ measure  ] the same under partition leases (64 held): "
              << static_cast<double>(claimed) / partitioned_s << " msg/s, "
              << partitioned_s * 1000.0 / partitioned_rounds << " ms/round\n";
  }
  std::cout << "[ measure  ] backlog " << rows << " on " << streams << " streams: enqueue "
            << enqueue_s << " s; first claim of 500: " << first_ms << " ms; claim+complete "
            << rounds << " rounds in " << drain_s << " s = " << static_cast<double>(total) / drain_s
            << " msg/s, " << drain_s * 1000.0 / rounds << " ms/round\n";
}

}  // namespace
}  // namespace outbox::testing
