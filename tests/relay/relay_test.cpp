// The relay engine against a real PostgreSQL, with a scripted sink.
#include "outbox/relay/relay.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "outbox/core/error.h"
#include "outbox/store/postgres_admin.h"
#include "support/pg_test_support.h"
#include "support/tcp_proxy.h"
#include "test_sink.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class RelayTest : public ::testing::Test {
 protected:
  TestSchema schema_;

  // Runs a relay over `sink` on its own thread until the test ends or StopRelay().
  void StartRelay(std::unique_ptr<Sink> sink, RelayOptions options = {}, RetryPolicy retry = {}) {
    SinkMap sinks;
    sinks.emplace("default", std::move(sink));
    StartRelay(std::move(sinks), std::move(options), retry);
  }
  // The store and the wake-up connect to `store_url` and `wakeup_url` (default: PgUrl()).
  void StartRelay(SinkMap sinks, RelayOptions options, RetryPolicy retry = {},
                  const std::string& store_url = PgUrl(), const std::string& wakeup_url = PgUrl()) {
    if (options.instance.empty()) options.instance = "relay-test";
    postgres::StoreOptions store_options;
    store_options.conninfo = store_url;
    store_options.schema = schema_.name();
    store_options.retry = retry;
    relay_ =
        std::make_unique<Relay>(options, postgres::OpenStore(store_options),
                                postgres::OpenWakeup(wakeup_url, schema_.name()), std::move(sinks));
    thread_ = std::thread([this] { relay_->Run(); });
  }
  void StopRelay() {
    if (!thread_.joinable()) return;
    relay_->Stop();
    thread_.join();
  }
  void TearDown() override { StopRelay(); }
  void DrainThroughDatabaseOutages(bool with_partition_leases);

  // Waits (bounded) until `done` holds; false on time-out.
  static bool WaitFor(const std::function<bool()>& done, milliseconds limit = milliseconds{20000}) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (done()) return true;
      std::this_thread::sleep_for(milliseconds{5});
    }
    return done();
  }

  // True while a relay's idle mark stands (writers would notify).
  bool RelayAsleep() {
    const std::string s = schema_.name();
    return Scalar(schema_.conn(), "SELECT (SELECT last_value FROM " + s +
                                      ".wakeup_idle_gen) > (SELECT last_value FROM " + s +
                                      ".wakeup_woken_gen)") == "t";
  }

  // Statements the relay (not the test's writers) has sent about this test's schema, counted by
  // pg_stat_statements (loaded by scripts/services). The schema's name (t_<n>_<m>) is matched with
  // its underscores escaped, as a name and not as a LIKE pattern of wildcards.
  std::int64_t RelayStatements() {
    Sql(schema_.conn(), "CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    std::string pattern;
    for (const char c : schema_.name()) {
      if (c == '_' || c == '%' || c == '\\') pattern += '\\';
      pattern += c;
    }
    return std::stoll(Scalar(
        schema_.conn(),
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM "
        "pg_database WHERE datname = current_database()) AND query LIKE '%" +
            pattern +
            "%' AND query NOT LIKE '%enqueue(%' AND query NOT LIKE '%pg_stat_statements%' AND "
            "query NOT LIKE '%last_value%'"));
  }

  // What a writer at a steady rate brought about (issues #21 and #49).
  struct SteadyWrite {
    int written = 0;
    double elapsed = 0;
    std::int64_t statements = 0;  // the relay's, from its idle start until all was delivered
  };

  // The relay started and idle, delivering to `sink`: for 3 s one transaction of
  // `per_transaction` messages every `gap`, then until every message is delivered.
  SteadyWrite Steadily(TestSink* sink, int per_transaction, milliseconds gap) {
    EXPECT_TRUE(WaitFor([&] { return RelayAsleep(); }));
    SteadyWrite run;
    const std::int64_t before = RelayStatements();
    const auto started = std::chrono::steady_clock::now();
    auto conn = Connect();
    while (std::chrono::steady_clock::now() - started < seconds{3}) {
      Scalar(conn.get(), "SELECT count(" + schema_.name() +
                             ".enqueue('t', '{}')) FROM generate_series(1, " +
                             std::to_string(per_transaction) + ")");
      run.written += per_transaction;
      std::this_thread::sleep_for(gap);
    }
    run.elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    EXPECT_TRUE(
        WaitFor([&] { return sink->delivered().size() == static_cast<std::size_t>(run.written); }));
    std::this_thread::sleep_for(milliseconds{300});  // the last batch settled, the relay idle
    run.statements = RelayStatements() - before;
    return run;
  }

  std::string Count(const std::string& where) {
    return Scalar(schema_.conn(),
                  "SELECT count(*) FROM " + schema_.name() + ".messages WHERE " + where);
  }
  std::string Enqueue(const std::string& args) {
    return Scalar(schema_.conn(), "SELECT " + schema_.name() + ".enqueue(" + args + ")");
  }

  // A relay of this test's schema publishing to `sink` (for tests that run several).
  std::unique_ptr<Relay> MakeRelay(const RelayOptions& options, std::unique_ptr<Sink> sink) {
    postgres::StoreOptions store_options;
    store_options.conninfo = PgUrl();
    store_options.schema = schema_.name();
    SinkMap sinks;
    sinks.emplace("default", std::move(sink));
    return std::make_unique<Relay>(options, postgres::OpenStore(store_options),
                                   postgres::OpenWakeup(PgUrl(), schema_.name()), std::move(sinks));
  }

  std::unique_ptr<PartitionLeases> leases_;  // outlives relay_, which points to it
  std::unique_ptr<Relay> relay_;
  std::thread thread_;
};

TEST_F(RelayTest, DeliversWhatCommitsAndNothingThatRollsBackInStreamOrder) {
  auto owned = std::make_unique<TestSink>();
  TestSink* sink = owned.get();
  RelayOptions options;
  options.batch_size = 100;
  StartRelay(std::move(owned), options);

  constexpr int kWriters = 4;
  constexpr int kPerWriter = 500;
  std::mutex mutex;
  std::set<std::string> committed;
  std::set<std::string> rolled_back;
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      auto conn = Connect();
      for (int i = 0; i < kPerWriter; ++i) {
        Sql(conn.get(), "BEGIN");
        const std::string id =
            Scalar(conn.get(), "SELECT " + schema_.name() + ".enqueue('t', '{}', stream_key => 's" +
                                   std::to_string((w * kPerWriter + i) % 50) + "')");
        const bool commit = (i + w) % 5 != 0;
        Sql(conn.get(), commit ? "COMMIT" : "ROLLBACK");
        std::lock_guard lock(mutex);
        (commit ? committed : rolled_back).insert(id);
      }
    });
  }
  for (auto& writer : writers) writer.join();
  ASSERT_TRUE(WaitFor([&] { return sink->delivered().size() >= committed.size(); }))
      << sink->delivered().size() << " of " << committed.size() << " delivered";
  StopRelay();

  std::set<std::string> delivered;
  std::map<std::string, std::int64_t> last_seq;
  const auto deliveries = sink->delivered();
  const auto batches = sink->batches();
  // On a failure, the whole story of that stream: batch, seq, id, attempts.
  const auto story = [&](const std::string& stream) {
    std::string text;
    for (std::size_t i = 0; i < deliveries.size(); ++i) {
      if (deliveries[i].stream_key != stream) continue;
      text += "\n  batch " + std::to_string(batches[i]) + " seq " +
              std::to_string(*deliveries[i].stream_seq) + " id " + deliveries[i].id.ToString() +
              " attempts " + std::to_string(deliveries[i].attempts);
    }
    return text;
  };
  for (const auto& envelope : deliveries) {
    const std::string id = envelope.id.ToString();
    EXPECT_FALSE(rolled_back.contains(id)) << "a rolled-back message was published: " << id;
    if (!delivered.insert(id).second) continue;  // duplicates are allowed, not expected here
    auto& last = last_seq[*envelope.stream_key];
    EXPECT_EQ(*envelope.stream_seq, last + 1)
        << "stream " << *envelope.stream_key << story(*envelope.stream_key);
    last = *envelope.stream_seq;
  }
  EXPECT_EQ(delivered, committed);
  EXPECT_EQ(Count("true"), "0");
  EXPECT_EQ(relay_->counters().published.load(), committed.size());
}

TEST_F(RelayTest, AnIdleRelayWakesOnCommitNotOnTheSweep) {
  auto owned = std::make_unique<TestSink>();
  TestSink* sink = owned.get();
  RelayOptions options;
  options.sweep_interval = seconds{60};
  options.publish_timeout = seconds{5};
  StartRelay(std::move(owned), options);
  ASSERT_TRUE(WaitFor([&] { return RelayAsleep(); })) << "the relay never announced idleness";
  for (int i = 0; i < 5; ++i) {
    Enqueue("'t', '{}'");
    // With a 60 s sweep, only the NOTIFY can bring it within 10 s.
    ASSERT_TRUE(WaitFor([&] { return sink->delivered().size() == static_cast<std::size_t>(i + 1); },
                        seconds{10}))
        << "message " << i << " was not published without a sweep";
    std::this_thread::sleep_for(milliseconds{100});
  }
}

// Issue #21: an idle relay with a long sweep wakes for a retry when its backoff ends (the claim
// that found nothing said when it is due), and for an operator's replay (it wakes the relay like
// an enqueue does).
TEST_F(RelayTest, AnIdleRelayWakesForADueRetryAndForAReplayNotOnlyOnTheSweep) {
  using SteadyClock = std::chrono::steady_clock;
  std::atomic<bool> reject{true};
  std::atomic<int> attempts{0};
  std::array<std::atomic<SteadyClock::rep>, 2> attempted_at{};
  auto owned = std::make_unique<TestSink>([&](const Envelope&) -> std::optional<Failure> {
    if (!reject) return std::nullopt;
    const auto attempt = static_cast<std::size_t>(attempts++);
    if (attempt < 2) attempted_at.at(attempt) = SteadyClock::now().time_since_epoch().count();
    return Failure{FailureKind::kRejected, "NO_ROUTE"};
  });
  TestSink* sink = owned.get();
  RelayOptions options;
  options.sweep_interval = seconds{60};
  options.publish_timeout = seconds{5};
  RetryPolicy retry;
  retry.initial_delay = milliseconds{1500};
  retry.max_delay = milliseconds{1500};
  retry.jitter = 0;
  retry.max_attempts = 2;
  StartRelay(std::move(owned), options, retry);
  ASSERT_TRUE(WaitFor([&] { return RelayAsleep(); }));
  const std::string id = Enqueue("'t', '{}'");
  // The first attempt at once, the second when its backoff ends: then it is abandoned.
  ASSERT_TRUE(WaitFor([&] { return Count("status = 'abandoned'") == "1"; }, seconds{10}))
      << "the retry waited for the 60 s sweep; attempts: " << attempts;
  ASSERT_EQ(attempts, 2);
  const SteadyClock::duration waited{attempted_at[1] - attempted_at[0]};
  EXPECT_GE(waited, milliseconds{1400}) << "the retry went before its backoff ended";

  // The operator replays it; the broker takes it now.
  reject = false;
  ASSERT_TRUE(WaitFor([&] { return RelayAsleep(); }));
  const auto admin = postgres::OpenAdmin(PgUrl(), schema_.name());
  MessageFilter filter;
  filter.ids = std::vector<MessageId>{*Uuid::Parse(id)};
  ASSERT_EQ(admin->Replay(filter, /*dry_run=*/false).count, 1);
  EXPECT_TRUE(WaitFor([&] { return Count("true") == "0"; }, seconds{10}))
      << "the replayed message waited for the 60 s sweep";
  EXPECT_EQ(sink->delivered().size(), 1U);
}

// Issue #21: under steady load the relay claims at most once per linger, settling the last batch
// in the same statement; per commit it would send two statements for every few messages.
// Twenty messages per transaction, one transaction every 4 ms: well above the rate from which the
// relay lingers (AdaptiveLinger::kLingerFromRate, 200 msg/s) even when a loaded machine lets the
// writer commit only a fraction of its schedule.
TEST_F(RelayTest, UnderSteadyLoadTheRelayClaimsOncePerLingerAndSettlesInTheClaim) {
  auto owned = std::make_unique<TestSink>();
  TestSink* sink = owned.get();
  RelayOptions options;
  options.linger = milliseconds{100};
  options.sweep_interval = seconds{60};
  RelayStatements();  // creates the extension before anything is counted
  StartRelay(std::move(owned), options);
  const auto run = Steadily(sink, 20, milliseconds{4});
  EXPECT_EQ(Count("true"), "0") << "a published message was kept";
  // One statement per round, a round every 100 ms or as long as a full batch takes at the rate
  // written, whichever is shorter (AdaptiveLinger::Wait), and a few to go idle and wake and
  // while the relay's estimate of the rate climbs past 200 msg/s (a few dozen ms here). Half as
  // many again for a loaded machine (51 against a bound of 50 once, in a full run beside three
  // builds): a relay that did not linger would send one per commit, several hundred.
  const double round =
      std::min(0.1, static_cast<double>(options.batch_size) / (run.written / run.elapsed));
  const double bound = 1.5 * run.elapsed / round + 20;
  EXPECT_LT(static_cast<double>(run.statements), bound)
      << run.statements << " statements for " << run.written << " messages in " << run.elapsed
      << " s";
  std::printf("[ relay ] steady load, linger 100 ms: %d messages, %lld statements in %.1f s\n",
              run.written, static_cast<long long>(run.statements), run.elapsed);
  EXPECT_EQ(relay_->counters().published.load(), static_cast<std::uint64_t>(run.written));
}

// Issue #49: at a moderate rate (80 messages a second, two per transaction) the relay does not
// linger: each commit gets a round of its own at once, though the linger (100 ms) would gather
// them into one claim per 100 ms; the statements are many more than lingering would take.
TEST_F(RelayTest, AtAModerateRateTheRelayDoesNotLinger) {
  auto owned = std::make_unique<TestSink>();
  TestSink* sink = owned.get();
  RelayOptions options;
  options.linger = milliseconds{100};
  options.sweep_interval = seconds{60};
  RelayStatements();  // creates the extension before anything is counted
  StartRelay(std::move(owned), options);
  const auto run = Steadily(sink, 2, milliseconds{25});
  // Lingering would take about one statement per 100 ms (the bound of the test above); a round
  // per commit takes at least one per transaction.
  const double lingering = run.elapsed / 0.1 + 20;
  EXPECT_GT(static_cast<double>(run.statements), lingering)
      << run.statements << " statements for " << run.written << " messages in " << run.elapsed
      << " s";
  std::printf("[ relay ] 80 msg/s, linger 100 ms: %d messages, %lld statements in %.1f s\n",
              run.written, static_cast<long long>(run.statements), run.elapsed);
}

// Issue #13: a writer's transaction held open for 10 s while the relay is idle. It delays no
// writer of another stream (each commits at once and is published within moments), and the relay
// does not poll faster than its bound (10 a second) while it waits for that writer to end.
TEST_F(RelayTest, AWriterHeldOpenDelaysNoOtherWriterAndTheRelayStaysQuiet) {
  auto owned = std::make_unique<TestSink>();
  TestSink* sink = owned.get();
  RelayStatements();  // creates the extension before anything is counted
  // The slow writer enqueues before the relay starts, so the relay, going idle, finds it in flight
  // (it may have read the state from before) and must wait for it to end.
  auto slow = Connect();
  Sql(slow.get(), "BEGIN");
  Sql(slow.get(), "SELECT " + schema_.name() + ".enqueue('t', '{}', stream_key => 'H')");
  const auto slow_started = std::chrono::steady_clock::now();
  RelayOptions options;
  options.sweep_interval = seconds{60};  // only the wait for the slow writer can find its message
  StartRelay(std::move(owned), options);
  ASSERT_TRUE(WaitFor([&] { return RelayAsleep(); })) << "the relay never announced idleness";
  std::this_thread::sleep_for(milliseconds{500});  // past the fast first polls
  const std::int64_t before = RelayStatements();
  const auto quiet_from = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(seconds{3});
  const double quiet_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - quiet_from).count();
  const double per_second = static_cast<double>(RelayStatements() - before) / quiet_seconds;
  std::printf("relay statements while a writer is open and nothing else happens: %.1f/s\n",
              per_second);
  EXPECT_LE(per_second, 12.0) << "at most 10 polls/s for the open writer";
  EXPECT_GE(per_second, 3.0) << "the relay must still be waiting for the open writer";

  // Writers of other streams meanwhile: each commits at once, and each message is published
  // within a bound, long before the slow transaction ends.
  auto other = Connect();
  Sql(other.get(), "SET statement_timeout = '2s'");
  double slowest_commit = 0;
  double slowest_delivery = 0;
  int written = 0;
  while (std::chrono::steady_clock::now() - slow_started < seconds{9}) {
    const auto start = std::chrono::steady_clock::now();
    Sql(other.get(), "BEGIN");
    Sql(other.get(), "SELECT " + schema_.name() + ".enqueue('t', '{}', stream_key => 'O" +
                         std::to_string(written % 7) + "')");
    Sql(other.get(), "COMMIT");
    const auto committed = std::chrono::steady_clock::now();
    ++written;
    ASSERT_TRUE(WaitFor(
        [&] { return sink->delivered().size() == static_cast<std::size_t>(written); }, seconds{5}))
        << "message " << written << " of another stream was not published";
    slowest_commit =
        std::max(slowest_commit, std::chrono::duration<double>(committed - start).count());
    slowest_delivery = std::max(
        slowest_delivery,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - committed).count());
    std::this_thread::sleep_for(milliseconds{50});
  }
  std::printf("%d writers of other streams: slowest commit %.1f ms, slowest delivery %.1f ms\n",
              written, slowest_commit * 1000, slowest_delivery * 1000);
  EXPECT_GE(written, 20);
  EXPECT_LT(slowest_commit, 1.0);
  EXPECT_LT(slowest_delivery, 2.0);
  while (std::chrono::steady_clock::now() - slow_started < seconds{10}) {
    std::this_thread::sleep_for(milliseconds{50});
  }
  Sql(slow.get(), "COMMIT");
  EXPECT_TRUE(
      WaitFor([&] { return sink->delivered().size() == static_cast<std::size_t>(written) + 1; },
              seconds{5}))
      << "the slow writer's message, once committed";
}

TEST_F(RelayTest, APoisonMessageIsAbandonedWhileOtherStreamsFlowAndItsOwnWaits) {
  const auto poison = std::make_shared<std::string>();
  auto owned =
      std::make_unique<TestSink>([poison](const Envelope& envelope) -> std::optional<Failure> {
        if (envelope.id.ToString() == *poison) return Failure{FailureKind::kRejected, "NO_ROUTE"};
        return std::nullopt;
      });
  TestSink* sink = owned.get();
  RetryPolicy retry;
  retry.initial_delay = milliseconds{200};
  retry.max_delay = milliseconds{200};
  retry.max_attempts = 3;
  *poison = Enqueue("'t', '{}', stream_key => 'bad'");
  const std::string behind = Enqueue("'t', '{}', stream_key => 'bad'");
  const std::string other = Enqueue("'t', '{}', stream_key => 'good'");
  StartRelay(std::move(owned), {}, retry);

  // Done when only the poison message is left, abandoned after its 3 attempts.
  ASSERT_TRUE(
      WaitFor([&] { return Count("status <> 'abandoned'") == "0" && Count("true") == "1"; }));
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT status || ' ' || attempts || ' ' || last_error FROM " +
                                       schema_.name() + ".messages WHERE id = '" + *poison + "'"),
            "abandoned 3 rejected: NO_ROUTE");
  // The first batch held all three: `behind` reached the broker next to its failing predecessor
  // (a broker's verdict arrives after the send) and was held back; the retries of the poison
  // message went out alone, and `behind` went again once the poison message was abandoned.
  // `other` flowed at once and only once.
  std::vector<std::string> order;
  for (const auto& envelope : sink->delivered()) order.push_back(envelope.id.ToString());
  EXPECT_EQ(order, (std::vector<std::string>{behind, other, behind}));
  EXPECT_EQ(relay_->counters().failed.load(), 3U);
}

TEST_F(RelayTest, ABrokerOutageSpendsNoAttemptsAndLosesNothing) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto owned = std::make_unique<TestSink>([calls](const Envelope&) -> std::optional<Failure> {
    // Down for the first 20 batches, then back.
    if (calls->load() < 20) return Failure{FailureKind::kUnavailable, "connection refused"};
    return std::nullopt;
  });
  TestSink* sink = owned.get();
  RelayOptions options;
  options.min_backoff = milliseconds{5};
  options.max_backoff = milliseconds{20};
  RetryPolicy retry;
  retry.max_attempts = 1;  // a single spent attempt would abandon
  for (int i = 0; i < 10; ++i) Enqueue("'t', '{}', stream_key => 'k" + std::to_string(i % 3) + "'");
  StartRelay(std::move(owned), options, retry);
  std::thread counter([&] {
    for (int i = 0; i < 2000 && sink->delivered().size() < 10; ++i) {
      *calls = sink->calls();
      std::this_thread::sleep_for(milliseconds{2});
    }
  });
  counter.join();
  ASSERT_TRUE(WaitFor([&] { return sink->delivered().size() == 10; }));
  EXPECT_EQ(Count("status = 'abandoned'"), "0");
  EXPECT_EQ(relay_->counters().failed.load(), 0U);
  EXPECT_GE(relay_->counters().unconfirmed.load(), 10U);
}

TEST_F(RelayTest, AFailureInsideABatchReordersNothing) {
  // s#2 is rejected once; s#3, confirmed in the same batch, must not count as done before s#2.
  auto failed_once = std::make_shared<bool>(false);
  auto owned =
      std::make_unique<TestSink>([failed_once](const Envelope& envelope) -> std::optional<Failure> {
        if (envelope.stream_seq == 2 && !*failed_once) {
          *failed_once = true;
          return Failure{FailureKind::kRejected, "nack"};
        }
        return std::nullopt;
      });
  TestSink* sink = owned.get();
  RetryPolicy retry;
  retry.initial_delay = milliseconds{50};
  for (int i = 0; i < 3; ++i) Enqueue("'t', '{}', stream_key => 's'");
  StartRelay(std::move(owned), {}, retry);
  ASSERT_TRUE(WaitFor([&] { return Count("true") == "0"; }));
  std::vector<std::int64_t> seqs;
  for (const auto& envelope : sink->delivered()) seqs.push_back(*envelope.stream_seq);
  // First pass: 1 and 3 reached the broker (2 was refused); 3 was held back, so after 2 succeeds
  // 3 goes again: the last delivery of each is in order.
  EXPECT_EQ(seqs, (std::vector<std::int64_t>{1, 3, 2, 3}));
  EXPECT_EQ(relay_->counters().held_back.load(), 1U);
}

TEST_F(RelayTest, StopReleasesEveryLease) {
  auto owned = std::make_unique<TestSink>([](const Envelope&) -> std::optional<Failure> {
    std::this_thread::sleep_for(milliseconds{1});  // a slow broker
    return std::nullopt;
  });
  RelayOptions options;
  options.batch_size = 50;
  Sql(schema_.conn(),
      "SELECT " + schema_.name() + ".enqueue('t', '{}') FROM generate_series(1, 2000)");
  StartRelay(std::move(owned), options);
  ASSERT_TRUE(WaitFor([&] { return relay_->counters().published.load() > 100; }));
  StopRelay();
  EXPECT_EQ(Count("status = 'processing'"), "0");
  const auto published = relay_->counters().published.load();
  EXPECT_EQ(std::stoul(Count("true")), 2000U - published);  // the rest waits, none lost
}

// Cuts the relay's database connections three times while it drains 3,000 messages over 20
// streams: every message is delivered, first deliveries in stream order. With partition leases
// nothing reclaims by message lease alone, so what the relay left leased must come back by itself.
void RelayTest::DrainThroughDatabaseOutages(bool with_partition_leases) {
  // The relay's own connections are told apart by application_name, so that only they are cut.
  const std::string app = "relay_" + schema_.name();
  const std::string url =
      PgUrl() + (PgUrl().find('?') == std::string::npos ? "?" : "&") + "application_name=" + app;
  auto owned = std::make_unique<TestSink>([](const Envelope&) -> std::optional<Failure> {
    std::this_thread::sleep_for(std::chrono::microseconds{500});  // a broker that takes its time
    return std::nullopt;
  });
  TestSink* sink = owned.get();
  Sql(schema_.conn(), "SELECT " + schema_.name() +
                          ".enqueue('t', '{}', stream_key => 's' || (g % 20)) FROM "
                          "generate_series(1, 3000) g");
  std::set<std::string> expected;
  auto rows = Sql(schema_.conn(), "SELECT id FROM " + schema_.name() + ".messages");
  for (int r = 0; r < PQntuples(rows.get()); ++r) expected.insert(PQgetvalue(rows.get(), r, 0));

  RelayOptions options;
  options.instance = "db-outage";
  options.batch_size = 100;
  options.min_backoff = milliseconds{10};
  options.max_backoff = milliseconds{50};
  if (with_partition_leases) {
    leases_ = postgres::OpenPartitionLeases(url, schema_.name());
    options.partition_leases = leases_.get();
    options.lease = seconds{4};
    options.publish_timeout = seconds{2};
  }
  SinkMap sinks;
  sinks.emplace("default", std::move(owned));
  StartRelay(std::move(sinks), options, {}, url, url);
  int cuts = 0;
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(milliseconds{300});
    cuts += std::stoi(Scalar(schema_.conn(),
                             "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                             "application_name = '" +
                                 app + "'"));
  }
  ASSERT_TRUE(WaitFor([&] { return Count("true") == "0"; }, seconds{60}))
      << Count("true") << " messages left";
  StopRelay();
  EXPECT_GE(cuts, 3) << "the relay's connections were not cut";
  EXPECT_GE(relay_->counters().store_errors.load(), 1U);
  std::set<std::string> delivered;
  std::map<std::string, std::int64_t> last_seq;
  for (const auto& envelope : sink->delivered()) {
    if (!delivered.insert(envelope.id.ToString()).second) continue;
    auto& last = last_seq[*envelope.stream_key];
    EXPECT_GT(*envelope.stream_seq, last) << "first deliveries out of order";
    last = *envelope.stream_seq;
  }
  EXPECT_EQ(delivered, expected);  // every message, some perhaps twice, none lost
}

// Issue #13, the order hole: a claim whose reply is lost with the connection leaves messages
// leased to this relay that it does not know. The relay gives them back before it claims again;
// otherwise the stream's next message, claimable behind the relay's own leases, would go first.
TEST_F(RelayTest, AClaimWhoseReplyIsLostReordersNoStream) {
  const auto [host, port] = PgHostPort();
  TcpProxy proxy(host, port);
  // Named, so that the test can tell when the relay has gone to sleep (see below).
  const std::string via_proxy =
      PgUrlWith("port=" + std::to_string(proxy.port()) + "&application_name=lost-claim-store");
  const std::string direct = PgUrlWith("application_name=lost-claim-wakeup");

  auto owned = std::make_unique<TestSink>();
  TestSink* sink = owned.get();
  RelayOptions options;
  options.instance = "lost-claim";
  options.batch_size = 1;                // the lost claim takes the stream's first message only
  options.sweep_interval = seconds{60};  // no sweep (or lease reclaim) during the test
  options.lease = seconds{60};
  options.min_backoff = milliseconds{50};
  SinkMap sinks;
  sinks.emplace("default", std::move(owned));
  StartRelay(std::move(sinks), options, {}, via_proxy, direct);
  // Asleep: the idle mark stands, and the last look for work (the claim after the mark) has been
  // answered. Holding replies before that answer would strand the relay in an empty claim.
  ASSERT_TRUE(WaitFor([&] {
    return RelayAsleep() &&
           Scalar(schema_.conn(),
                  "SELECT coalesce(bool_and(s.state = 'idle' AND s.query_start > w.query_start), "
                  "false) FROM pg_stat_activity s, pg_stat_activity w "
                  "WHERE s.application_name = 'lost-claim-store' "
                  "AND w.application_name = 'lost-claim-wakeup' AND w.query LIKE '%relay_idle%'") ==
               "t";
  })) << "the relay never went to sleep";
  ASSERT_TRUE(proxy.AwaitQuietReplies(milliseconds{200}, seconds{5}))
      << "the relay's connection never went quiet";

  // From now on the database's replies to the relay's store connection are held back.
  proxy.SetMode(TcpProxy::Mode::kHoldReplies);
  Sql(schema_.conn(), "BEGIN");
  const std::string first = Enqueue("'t', '{\"n\": 1}', stream_key => 's'");
  const std::string second = Enqueue("'t', '{\"n\": 2}', stream_key => 's'");
  Sql(schema_.conn(), "COMMIT");
  // The claim is committed in the database; its reply never reaches the relay.
  ASSERT_TRUE(WaitFor(
      [&] { return Count("id = '" + first + "' AND status = 'processing'") == "1"; }, seconds{10}))
      << "the relay did not claim the first message";
  EXPECT_EQ(Count("id = '" + second + "' AND status = 'pending'"), "1");
  proxy.DropAll();
  proxy.SetMode(TcpProxy::Mode::kForward);

  ASSERT_TRUE(WaitFor([&] { return Count("true") == "0"; }, seconds{20}))
      << "published " << sink->delivered().size() << " of 2 within 20 s";
  const auto delivered = sink->delivered();
  ASSERT_EQ(delivered.size(), 2U);
  EXPECT_EQ(delivered[0].id.ToString(), first) << "the stream's second message went first";
  EXPECT_EQ(delivered[1].id.ToString(), second);
}

// The same with partition leases and an outage longer than the lease (found by the many-databases
// end-to-end test): the relay's partition leases have expired by the time its store connection is
// back, so the leases it gives back must not be limited to partitions it holds. Its heartbeats
// come back later than its claims (a proxy of their own), so the give-back runs while no
// partition is held; then the heartbeat renews them under the same epochs, and a claim there goes
// behind the caller's own leases: the first message must have gone back by then.
TEST_F(RelayTest, AClaimWhoseReplyIsLostInAnOutageLongerThanThePartitionLeaseReordersNoStream) {
  const auto [host, port] = PgHostPort();
  TcpProxy store_proxy(host, port);
  TcpProxy leases_proxy(host, port);
  const std::string via_store_proxy =
      PgUrlWith("port=" + std::to_string(store_proxy.port()) +
                "&application_name=lost-claim-store&connect_timeout=2");
  const std::string via_leases_proxy = PgUrlWith("port=" + std::to_string(leases_proxy.port()) +
                                                 "&application_name=lost-leases&connect_timeout=2");
  const std::string direct = PgUrlWith("application_name=lost-claim-wakeup");

  auto owned = std::make_unique<TestSink>();
  TestSink* sink = owned.get();
  RelayOptions options;
  options.instance = "lost-claim-leases";
  options.batch_size = 1;                // the lost claim takes the stream's first message only
  options.sweep_interval = seconds{60};  // no sweep (or lease reclaim) during the test
  options.lease = seconds{2};
  options.publish_timeout = seconds{1};
  options.min_backoff = milliseconds{50};
  options.max_backoff = milliseconds{200};
  leases_ = postgres::OpenPartitionLeases(via_leases_proxy, schema_.name());
  options.partition_leases = leases_.get();
  SinkMap sinks;
  sinks.emplace("default", std::move(owned));
  StartRelay(std::move(sinks), options, {}, via_store_proxy, direct);
  ASSERT_TRUE(WaitFor([&] {
    return RelayAsleep() &&
           Scalar(schema_.conn(),
                  "SELECT coalesce(bool_and(s.state = 'idle' AND s.query_start > w.query_start), "
                  "false) FROM pg_stat_activity s, pg_stat_activity w "
                  "WHERE s.application_name = 'lost-claim-store' "
                  "AND w.application_name = 'lost-claim-wakeup' AND w.query LIKE '%relay_idle%'") ==
               "t";
  })) << "the relay never went to sleep";
  ASSERT_TRUE(store_proxy.AwaitQuietReplies(milliseconds{200}, seconds{5}))
      << "the relay's connection never went quiet";

  store_proxy.SetMode(TcpProxy::Mode::kHoldReplies);
  Sql(schema_.conn(), "BEGIN");
  const std::string first = Enqueue("'t', '{\"n\": 1}', stream_key => 's'");
  const std::string second = Enqueue("'t', '{\"n\": 2}', stream_key => 's'");
  Sql(schema_.conn(), "COMMIT");
  ASSERT_TRUE(WaitFor(
      [&] { return Count("id = '" + first + "' AND status = 'processing'") == "1"; }, seconds{10}))
      << "the relay did not claim the first message";
  // The outage: both connections gone for longer than the lease.
  leases_proxy.SetMode(TcpProxy::Mode::kBlackhole);
  leases_proxy.DropAll();
  store_proxy.SetMode(TcpProxy::Mode::kBlackhole);
  store_proxy.DropAll();
  std::this_thread::sleep_for(milliseconds{2500});
  // The claims' connection is back first; the heartbeats' a second later.
  store_proxy.SetMode(TcpProxy::Mode::kForward);
  std::this_thread::sleep_for(milliseconds{1000});
  leases_proxy.SetMode(TcpProxy::Mode::kForward);

  ASSERT_TRUE(WaitFor([&] { return Count("true") == "0"; }, seconds{20}))
      << "published " << sink->delivered().size() << " of 2 within 20 s; left: "
      << Scalar(schema_.conn(),
                "SELECT string_agg(concat_ws(' ', id, status, lease_owner, "
                "lease_until < now(), attempts), '; ') FROM " +
                    schema_.name() + ".messages")
      << "; first " << first;
  // First deliveries in stream order (a message may come twice: the partitions, taken again
  // after their leases expired, come under a new epoch, which fences a completion in flight).
  std::vector<std::string> firsts;
  for (const auto& envelope : sink->delivered()) {
    const std::string id = envelope.id.ToString();
    if (std::find(firsts.begin(), firsts.end(), id) == firsts.end()) firsts.push_back(id);
  }
  ASSERT_EQ(firsts.size(), 2U);
  EXPECT_EQ(firsts[0], first) << "the stream's second message went first";
  EXPECT_EQ(firsts[1], second);
}

// Issue #24: a stream written to two targets is two streams, one per target (stream_seq and
// head-of-line count per target and stream). While b's sink is unavailable, a's copies of the
// stream all go, in order, and nothing of b's; once b is back, b's follow in their order.
TEST_F(RelayTest, AStreamWrittenToTwoTargetsFlowsOnOneWhileTheOtherIsPaused) {
  std::mutex mutex;
  std::map<std::string, std::vector<std::string>> accepted;  // payloads per target, in order
  std::atomic<bool> b_down{true};
  const auto sink_for = [&](std::string target, bool can_be_down) {
    return std::make_unique<TestSink>(
        [&, target, can_be_down](const Envelope& envelope) -> std::optional<Failure> {
          if (can_be_down && b_down)
            return Failure{FailureKind::kUnavailable, "connection refused"};
          std::lock_guard lock(mutex);
          accepted[target].push_back(envelope.payload);
          return std::nullopt;
        });
  };
  SinkMap sinks;
  sinks.emplace("a", sink_for("a", false));
  sinks.emplace("b", sink_for("b", true));
  RelayOptions options;
  options.min_backoff = milliseconds{50};
  options.max_backoff = milliseconds{200};
  options.sweep_interval = milliseconds{100};
  std::vector<std::string> expected;
  Sql(schema_.conn(), "BEGIN");
  for (int i = 1; i <= 6; ++i) {
    Enqueue("'t', '\"s" + std::to_string(i) + "\"', stream_key => 's', targets => ARRAY['a', 'b']");
    expected.push_back("\"s" + std::to_string(i) + "\"");
  }
  Sql(schema_.conn(), "COMMIT");
  EXPECT_EQ(Count("target = 'a' AND stream_seq BETWEEN 1 AND 6"), "6");
  EXPECT_EQ(Count("target = 'b' AND stream_seq BETWEEN 1 AND 6"), "6");
  StartRelay(std::move(sinks), options);
  ASSERT_TRUE(WaitFor([&] { return Count("target = 'a'") == "0"; })) << "a's copies not all out";
  ASSERT_TRUE(WaitFor([&] { return !relay_->paused_targets().empty(); }));
  EXPECT_EQ(relay_->paused_targets(), std::vector<std::string>{"b"});
  {
    std::lock_guard lock(mutex);
    EXPECT_EQ(accepted["a"], expected);
    EXPECT_TRUE(accepted["b"].empty());
  }
  EXPECT_EQ(Count("attempts > 0"), "0") << "an outage spends no attempt";

  b_down = false;
  ASSERT_TRUE(WaitFor([&] { return Count("true") == "0"; })) << Count("true") << " left";
  EXPECT_TRUE(relay_->paused_targets().empty());
  std::lock_guard lock(mutex);
  EXPECT_EQ(accepted["b"], expected);
  EXPECT_EQ(accepted["a"], expected) << "a's copies went once";
}

// Issue #14: a paused target costs the database little. While the only sink is down, writers
// keep writing and the relay does not wake for each of them; once the paused target's messages
// are gone (abandoned by an operator) while its probe is due, the idle relay does not spin.
TEST_F(RelayTest, APausedTargetKeepsTheRelayQuiet) {
  std::atomic<bool> down{true};
  auto owned = std::make_unique<TestSink>([&](const Envelope&) -> std::optional<Failure> {
    if (down) return Failure{FailureKind::kUnavailable, "connection refused"};
    return std::nullopt;
  });
  RelayOptions options;
  options.min_backoff = milliseconds{50};
  options.max_backoff = milliseconds{200};
  options.sweep_interval = seconds{5};
  RelayStatements();  // creates the extension before anything is counted
  StartRelay(std::move(owned), options);
  Enqueue("'t', '{}'");
  ASSERT_TRUE(WaitFor([&] { return !relay_->paused_targets().empty(); }));

  // 200 writers' commits in 2 s while the only sink is paused.
  std::int64_t before = RelayStatements();
  auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) {
    Enqueue("'t', '{}'");
    std::this_thread::sleep_for(milliseconds{10});
  }
  double seconds_taken =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const double while_writing = static_cast<double>(RelayStatements() - before) / seconds_taken;
  // Probing every 200 ms costs a few statements a probe; waking per commit would be 100+/s.
  EXPECT_LT(while_writing, 40.0) << "statements/s while writers wrote to a paused target";
  EXPECT_EQ(Count("attempts > 0"), "0");

  // An operator takes the messages away: the probe finds nothing to publish. A message the probe
  // holds at that moment is skipped (as the admin API skips it) and comes back pending a moment
  // later, so the operator repeats the abandon until nothing else is left.
  ASSERT_TRUE(WaitFor([&] {
    Sql(schema_.conn(), "UPDATE " + schema_.name() +
                            ".messages SET status = 'abandoned', abandoned_at = now(), "
                            "lease_owner = NULL, lease_until = NULL WHERE status <> 'processing'");
    return Count("status <> 'abandoned'") == "0";
  }));
  before = RelayStatements();
  started = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(seconds{2});
  seconds_taken = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const double idle = static_cast<double>(RelayStatements() - before) / seconds_taken;
  EXPECT_LT(idle, 20.0) << "statements/s of an idle relay with a paused target";
  std::printf("[ relay ] paused target: %.1f statements/s while writing, %.1f idle\n",
              while_writing, idle);
}

// Issue #43: a target with max_rate = 200 is published at 200/s (in bursts of about 180) while
// another target drains as fast as it does without it. The window is 5 s (OUTBOX_MAX_RATE_SECONDS
// for a longer one: the is 30 s); the slow target's backlog is older than the fast one's,
// the worst case for the claim, which takes the oldest messages first.
TEST_F(RelayTest, ARateLimitedTargetGoesAtItsRateAndSlowsNoOtherTarget) {
  const char* seconds_env = std::getenv("OUTBOX_MAX_RATE_SECONDS");
  const double window = seconds_env != nullptr ? std::stod(seconds_env) : 5.0;
  constexpr double kRate = 200;
  constexpr int kFast = 20000;
  const auto enqueue = [&](const std::string& target, int count) {
    Scalar(schema_.conn(), "SELECT count(" + schema_.name() + ".enqueue('t', '{}', targets => " +
                               "ARRAY['" + target + "'])) FROM generate_series(1, " +
                               std::to_string(count) + ")");
  };
  struct Timed {
    std::mutex mutex;
    std::vector<std::chrono::steady_clock::time_point> at;
    std::size_t size() {
      std::lock_guard lock(mutex);
      return at.size();
    }
  };
  const auto timed_sink = [](Timed& timed) {
    return std::make_unique<TestSink>([&timed](const Envelope&) -> std::optional<Failure> {
      std::lock_guard lock(timed.mutex);
      timed.at.push_back(std::chrono::steady_clock::now());
      return std::nullopt;
    });
  };
  // How long the fast target's backlog takes to drain, with the slow target's backlog (limited)
  // before it or without it.
  const auto drain_fast = [&](bool with_slow, Timed& slow, Timed& fast, double& fast_seconds,
                              observe::Registry& metrics) {
    SinkMap sinks;
    sinks.emplace("slow", timed_sink(slow));
    sinks.emplace("fast", timed_sink(fast));
    RelayOptions options;
    options.rate_limits = {{"slow", {.max_rate = kRate}}};
    options.metrics = &metrics;
    if (with_slow) enqueue("slow", static_cast<int>(kRate * (window + 5)));
    enqueue("fast", kFast);
    const auto started = std::chrono::steady_clock::now();
    StartRelay(std::move(sinks), options);
    EXPECT_TRUE(WaitFor([&] { return fast.size() == kFast; }, milliseconds{60000}));
    fast_seconds = std::chrono::duration<double>(fast.at.back() - started).count();
  };
  // (All outlive the relays, whose sinks and metrics write to them.)
  Timed unused;
  Timed fast_alone;
  observe::Registry metrics_alone;
  double alone = 0;
  drain_fast(false, unused, fast_alone, alone, metrics_alone);
  StopRelay();
  Timed slow;
  Timed fast_beside;
  observe::Registry metrics;
  double beside = 0;
  drain_fast(true, slow, fast_beside, beside, metrics);
  // The slow target's rate over the window: it goes in bursts (an arrival more than 300 ms after
  // the one before starts one), from the second (the first is the full bucket's) to the start of
  // the last.
  ASSERT_TRUE(WaitFor([&] { return slow.size() > 0; }));
  std::this_thread::sleep_until(slow.at.front() +
                                milliseconds{static_cast<int>(1000 * (window + 1.5))});
  StopRelay();
  const std::uint64_t throttled = relay_->counters().throttled;
  const std::uint64_t claimed = relay_->counters().claimed;
  std::vector<std::size_t> burst_starts;
  for (std::size_t i = 0; i < slow.at.size(); ++i) {
    if (i == 0 || slow.at[i] - slow.at[i - 1] > milliseconds{300}) burst_starts.push_back(i);
  }
  ASSERT_GE(burst_starts.size(), 4U) << slow.at.size() << " sent";
  const std::size_t first = burst_starts[1];
  const std::size_t last = burst_starts.back();
  const double seconds_between =
      std::chrono::duration<double>(slow.at[last] - slow.at[first]).count();
  const double rate = static_cast<double>(last - first) / seconds_between;
  std::printf(
      "[ relay ] max_rate %.0f: %.1f msgs/s over %.1f s (%zu bursts, the first of %zu, then about "
      "%zu); the other target drained %d in %.2f s beside it, %.2f s alone; %llu claimed, %llu "
      "given back throttled\n",
      kRate, rate, seconds_between, burst_starts.size(), burst_starts[1],
      burst_starts[2] - burst_starts[1], kFast, beside, alone,
      static_cast<unsigned long long>(claimed), static_cast<unsigned long long>(throttled));
  EXPECT_GT(rate, kRate * 0.9);
  EXPECT_LT(rate, kRate * 1.1);
  // Generous: the box is shared and noisy; waiting for the slow target would take 100 s.
  EXPECT_LT(beside, alone * 2 + 1.0) << "the fast target was slowed by the limited one";
  EXPECT_EQ(Count("attempts > 0"), "0") << "throttling spends no attempt";
  // The metrics: what was given back, and the time spent throttled (about all of the run).
  const std::string text = metrics.RenderPrometheus();
  EXPECT_NE(text.find("outbox_relay_throttled_total " + std::to_string(throttled) + "\n"),
            std::string::npos)
      << text;
  const std::string series = "outbox_relay_target_throttled_seconds{target=\"slow\"} ";
  const auto at = text.find(series);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_GT(std::stod(text.substr(at + series.size())), window * 0.9);
  EXPECT_EQ(text.find("outbox_relay_target_throttled_seconds{target=\"fast\"}"), std::string::npos);
}

TEST_F(RelayTest, LosingTheDatabaseConnectionLosesNothing) { DrainThroughDatabaseOutages(false); }

TEST_F(RelayTest, LosingTheDatabaseConnectionLosesNothingWithPartitionLeases) {
  DrainThroughDatabaseOutages(true);
}

// Sharing partitions, no relay reclaims by message lease alone, but a lease left behind in a
// partition the relay holds (recording its outcome failed, or a claim's reply was lost) must not
// keep its message from being published for as long as the relay lives.
TEST_F(RelayTest, AnExpiredLeaseLeftInAHeldPartitionIsPublished) {
  auto owned = std::make_unique<TestSink>();
  TestSink* sink = owned.get();
  leases_ = postgres::OpenPartitionLeases(PgUrl(), schema_.name());
  RelayOptions options;
  options.partition_leases = leases_.get();
  options.lease = seconds{4};
  options.publish_timeout = seconds{2};
  options.sweep_interval = milliseconds{50};
  StartRelay(std::move(owned), options);
  const auto holder = [&] {
    return Scalar(schema_.conn(),
                  "SELECT coalesce(min(owner), '') FROM " + schema_.name() + ".partition_leases");
  };
  ASSERT_TRUE(WaitFor([&] { return !holder().empty(); }));
  // A message the relay itself holds under an expired lease, as if the claim's reply was lost:
  // written and leased in one transaction, so the relay never saw it pending.
  Sql(schema_.conn(), "BEGIN");
  const std::string id = Enqueue("'t', '{}'");
  Sql(schema_.conn(), "UPDATE " + schema_.name() +
                          ".messages SET status = 'processing', lease_owner = '" + holder() +
                          "', lease_until = now() - interval '1 second', lease_epoch = 1");
  Sql(schema_.conn(), "COMMIT");
  ASSERT_TRUE(WaitFor([&] { return Count("true") == "0"; }, seconds{10})) << "still leased";
  ASSERT_EQ(sink->delivered().size(), 1U);
  EXPECT_EQ(sink->delivered()[0].id.ToString(), id);
}

// Issue #42: a relay idle for a third of its lease renews its partitions for the idle lease and
// sends no sweep while its heartbeat finds nothing unfinished; a message whose notification was
// lost is found by that heartbeat; and the claim that finds it renews for the short lease at once.
TEST_F(RelayTest, AnIdleRelayRenewsForItsIdleLeaseSkipsItsSweepsAndItsHeartbeatFindsWork) {
  auto owned = std::make_unique<TestSink>();
  TestSink* sink = owned.get();
  RelayStatements();  // creates the extension before anything is counted
  leases_ = postgres::OpenPartitionLeases(PgUrl(), schema_.name());
  RelayOptions options;
  options.partition_leases = leases_.get();
  options.lease = seconds{3};
  options.idle_lease = seconds{9};  // a heartbeat every 2.4-3 s while idle
  options.publish_timeout = seconds{1};
  options.sweep_interval = milliseconds{100};  // a sweeping relay would send about 20 a second
  StartRelay(std::move(owned), options);
  const std::string s = schema_.name();
  const auto longest_lease = [&] {
    return std::stod(Scalar(schema_.conn(),
                            "SELECT coalesce(extract(epoch FROM max(lease_until) - now()), 0) "
                            "FROM " +
                                s + ".partition_leases"));
  };
  ASSERT_TRUE(WaitFor([&] { return longest_lease() > 4.0; }, seconds{15}))
      << "the idle relay never renewed for its idle lease";

  const std::int64_t before = RelayStatements();
  std::this_thread::sleep_for(seconds{3});
  const std::int64_t idle_statements = RelayStatements() - before;
  std::printf("statements of an idle relay in 3 s: %lld\n",
              static_cast<long long>(idle_statements));
  EXPECT_LE(idle_statements, 4) << "at most two heartbeats (and no sweep) in 3 s";
  EXPECT_GE(idle_statements, 1) << "the heartbeat goes on";

  // A notification lost: the relay's idle mark is taken away, so the writer does not notify.
  Sql(schema_.conn(), "SELECT setval('" + s + ".wakeup_woken_gen', (SELECT last_value FROM " + s +
                          ".wakeup_idle_gen))");
  ASSERT_FALSE(RelayAsleep());
  const std::string id = Enqueue("'t', '{}'");
  ASSERT_TRUE(WaitFor([&] { return sink->delivered().size() == 1; }, seconds{10}))
      << "the heartbeat did not find the message whose notification was lost";
  EXPECT_EQ(sink->delivered()[0].id.ToString(), id);
  // Busy, the relay renewed for its short lease at once (and will stretch it again, idle).
  EXPECT_TRUE(WaitFor([&] { return longest_lease() <= 3.2; }, seconds{5}))
      << "still under the idle lease after finding work: " << longest_lease() << " s";
}

// Issue #42: a relay that skips its sweeps while idle still hands surplus partitions over when a
// second relay joins (its heartbeat wakes its loop for that), within a third of its idle lease.
TEST_F(RelayTest, AnIdleRelayUnderItsIdleLeaseHandsHalfItsPartitionsToARelayThatJoins) {
  struct Instance {
    std::unique_ptr<PartitionLeases> leases;
    std::unique_ptr<Relay> relay;
    std::thread thread;
    ~Instance() {
      if (!thread.joinable()) return;
      relay->Stop();
      thread.join();
    }
  };
  std::array<Instance, 2> instances;
  const auto start = [&](Instance& instance, const std::string& name) {
    instance.leases = postgres::OpenPartitionLeases(PgUrl(), schema_.name());
    RelayOptions options;
    options.instance = name;
    options.lease = seconds{3};
    options.idle_lease = seconds{9};
    options.publish_timeout = seconds{1};
    options.sweep_interval = milliseconds{100};
    options.partition_leases = instance.leases.get();
    instance.relay = MakeRelay(options, std::make_unique<TestSink>());
    instance.thread = std::thread([relay = instance.relay.get()] { relay->Run(); });
  };
  const auto owned = [&](std::size_t r) {
    return instances[r].relay->counters().partitions_owned.load();
  };
  start(instances[0], "first");
  // Idle and under its idle lease: its sweeps have stopped.
  ASSERT_TRUE(WaitFor(
      [&] {
        return owned(0) == 64 &&
               Scalar(schema_.conn(),
                      "SELECT min(lease_until) > now() + interval '4 seconds' FROM " +
                          schema_.name() + ".partition_leases") == "t";
      },
      seconds{15}));
  start(instances[1], "second");
  // The first hears of the second at its next heartbeat (at most 3 s away), hands 32 back, and the
  // second, looking every second while below its share, takes them.
  EXPECT_TRUE(WaitFor([&] { return owned(0) == 32 && owned(1) == 32; }, seconds{10}))
      << "not shared: " << owned(0) << " and " << owned(1);
}

// CheckOptions (what outboxd --check-config runs) reads "linger less than half of the lease" as
// outboxd's configuration does, without rounding the half down: lease 1001 ms, linger 500 ms is
// valid (it was refused at start after --check-config had said valid).
TEST(RelayOptionsTest, LingerIsLessThanHalfOfTheLeaseUnrounded) {
  RelayOptions options;
  options.instance = "r";
  options.lease = milliseconds{1001};
  options.publish_timeout = milliseconds{400};
  options.linger = milliseconds{500};
  EXPECT_NO_THROW(Relay::CheckOptions(options));
  options.linger = milliseconds{501};
  EXPECT_THROW(Relay::CheckOptions(options), ConfigError);
  options.lease = milliseconds{1000};
  options.linger = milliseconds{500};
  EXPECT_THROW(Relay::CheckOptions(options), ConfigError);
  options.linger = milliseconds{499};
  EXPECT_NO_THROW(Relay::CheckOptions(options));
}

TEST_F(RelayTest, BadOptionsAreConfigErrors) {
  const auto make = [&](RelayOptions options) {
    SinkMap sinks;
    sinks.emplace("default", std::make_unique<TestSink>());
    postgres::StoreOptions store_options;
    store_options.conninfo = PgUrl();
    store_options.schema = schema_.name();
    Relay relay(options, postgres::OpenStore(store_options),
                postgres::OpenWakeup(PgUrl(), schema_.name()), std::move(sinks));
  };
  RelayOptions options;
  EXPECT_THROW(make(options), ConfigError);  // no instance name
  options.instance = "r";
  options.batch_size = 0;
  EXPECT_THROW(make(options), ConfigError);
  options.batch_size = 10;
  options.publish_timeout = options.lease;
  EXPECT_THROW(make(options), ConfigError);
  // Sharing partitions, a batch must leave room for a heartbeat within the lease.
  const auto leases = postgres::OpenPartitionLeases(PgUrl(), schema_.name());
  options.partition_leases = leases.get();
  options.publish_timeout = options.lease / 2 + milliseconds{1};
  EXPECT_THROW(make(options), ConfigError);
  options.publish_timeout = options.lease / 2;
  EXPECT_NO_THROW(make(options));
  options.linger = milliseconds{-1};
  EXPECT_THROW(make(options), ConfigError);
  options.linger = options.lease / 2;
  EXPECT_THROW(make(options), ConfigError);
  options.linger = milliseconds{0};
  EXPECT_NO_THROW(make(options));
  options.idle_lease = options.lease - milliseconds{1};
  EXPECT_THROW(make(options), ConfigError);
  options.idle_lease = options.lease * 4;
  EXPECT_NO_THROW(make(options));
}

// Two relays on one database, dividing its partitions: each message is published once, each
// stream's messages in order, and a stream changes hands at most at a hand-over.
TEST_F(RelayTest, TwoRelaysSharingPartitionsPublishEveryMessageOnceInOrder) {
  constexpr int kPerPhase = 4000;
  const auto enqueue = [&] {
    Sql(schema_.conn(), "SELECT " + schema_.name() +
                            ".enqueue('t', '{}', stream_key => 's' || (g % 200)) FROM "
                            "generate_series(1, " +
                            std::to_string(kPerPhase) + ") g");
  };
  enqueue();
  struct Instance {
    std::unique_ptr<PartitionLeases> leases;
    TestSink* sink = nullptr;
    std::unique_ptr<Relay> relay;
    std::thread thread;
    void Stop() {
      if (!thread.joinable()) return;
      relay->Stop();
      thread.join();
    }
    ~Instance() { Stop(); }  // also when an assertion returns early
  };
  std::array<Instance, 2> instances;
  const auto start = [&](Instance& instance, const std::string& name) {
    instance.leases = postgres::OpenPartitionLeases(PgUrl(), schema_.name());
    auto sink = std::make_unique<TestSink>([](const Envelope&) -> std::optional<Failure> {
      std::this_thread::sleep_for(std::chrono::microseconds{200});  // a broker taking its time
      return std::nullopt;
    });
    instance.sink = sink.get();
    RelayOptions options;
    options.instance = name;
    options.batch_size = 50;
    options.lease = seconds{4};
    options.publish_timeout = seconds{2};
    options.sweep_interval = milliseconds{50};
    options.partition_leases = instance.leases.get();
    instance.relay = MakeRelay(options, std::move(sink));
    instance.thread = std::thread([relay = instance.relay.get()] { relay->Run(); });
  };
  start(instances[0], "first");
  ASSERT_TRUE(WaitFor([&] { return instances[0].relay->counters().published.load() > 200; }));
  start(instances[1], "second");  // joins mid-run: the first hands half its partitions over
  // The first notices the join at its next heartbeat (lease / 3), so on a fast machine the first
  // phase may be drained before the hand-over: the shares are awaited, then a second phase
  // gives both relays work.
  const auto owned = [&](std::size_t r) {
    return instances[r].relay->counters().partitions_owned.load();
  };
  // Two lease periods, and a second for the sweeps and heartbeats in between.
  ASSERT_TRUE(WaitFor([&] { return owned(0) == 32 && owned(1) == 32; }, seconds{9}))
      << "not fair within two lease periods: " << owned(0) << " and " << owned(1);
  enqueue();
  ASSERT_TRUE(WaitFor([&] { return Count("true") == "0"; }, seconds{60}))
      << Count("true") << " left";
  EXPECT_EQ(owned(0), 32);
  EXPECT_EQ(owned(1), 32);
  for (auto& instance : instances) instance.Stop();
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() +
                                       ".partition_leases WHERE owner IS NOT NULL"),
            "0")
      << "a stopped relay keeps partitions";
  EXPECT_EQ(Scalar(schema_.conn(), "SELECT count(*) FROM " + schema_.name() + ".relay_instances"),
            "0");

  std::set<std::string> delivered;
  std::map<std::string, std::array<std::vector<std::int64_t>, 2>> seqs;  // stream -> per relay
  for (std::size_t r = 0; r < instances.size(); ++r) {
    EXPECT_GT(instances[r].relay->counters().published.load(), 0U) << "relay " << r << " idle";
    for (const auto& envelope : instances[r].sink->delivered()) {
      EXPECT_TRUE(delivered.insert(envelope.id.ToString()).second) << "published twice";
      seqs[*envelope.stream_key][r].push_back(*envelope.stream_seq);
    }
  }
  EXPECT_EQ(delivered.size(), static_cast<std::size_t>(2 * kPerPhase));
  for (const auto& [stream, by_relay] : seqs) {
    for (const auto& list : by_relay) {
      EXPECT_TRUE(std::is_sorted(list.begin(), list.end())) << "stream " << stream;
    }
    // Handed from the first relay to the second (never back: the shares settle once).
    if (!by_relay[0].empty() && !by_relay[1].empty()) {
      EXPECT_LT(by_relay[0].back(), by_relay[1].front()) << "stream " << stream;
    }
  }
}

}  // namespace
}  // namespace outbox::testing

namespace outbox::testing {
namespace {

TEST(PostgresWakeupTest, AWriterThatMayHaveMissedTheMarkEndsTheWaitWhenItEnds) {
  TestSchema schema;
  auto wakeup = postgres::OpenWakeup(PgUrl(), schema.name());
  wakeup->AnnounceIdle();
  const auto soon = [] { return std::chrono::steady_clock::now() + milliseconds{200}; };
  EXPECT_EQ(wakeup->Wait(soon()), WakeReason::kTimeout) << "no writer in flight: nothing to wait";
  wakeup->Withdraw();  // the relay is busy: a writer now reads "not idle" and will not notify
  auto writer = Connect();
  Sql(writer.get(), "BEGIN");
  Sql(writer.get(), "SELECT " + schema.name() + ".enqueue('t', '{}')");
  wakeup->AnnounceIdle();  // the writer is in flight: it may have missed the mark
  std::thread committer([&] {
    std::this_thread::sleep_for(milliseconds{300});
    Sql(writer.get(), "COMMIT");
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(wakeup->Wait(std::chrono::steady_clock::now() + seconds{10}), WakeReason::kWritersDone);
  const auto waited = std::chrono::steady_clock::now() - start;
  committer.join();
  EXPECT_GE(waited, milliseconds{250}) << "it returned before the writer ended";
  EXPECT_LT(waited, seconds{5});
  // Reported once: the next wait sleeps until the deadline.
  EXPECT_EQ(wakeup->Wait(soon()), WakeReason::kTimeout);
}

TEST(PostgresWakeupTest, WaitEndsOnNotifyOnInterruptAndOnTheDeadline) {
  TestSchema schema;
  auto wakeup = postgres::OpenWakeup(PgUrl(), schema.name());
  const auto soon = [] { return std::chrono::steady_clock::now() + milliseconds{200}; };
  const auto later = [] { return std::chrono::steady_clock::now() + seconds{10}; };
  EXPECT_EQ(wakeup->Wait(soon()), WakeReason::kTimeout);  // nothing happened
  Sql(schema.conn(), "SELECT " + schema.name() + ".enqueue('t', '{}')");
  EXPECT_EQ(wakeup->Wait(soon()), WakeReason::kTimeout) << "not idle: the writer must not notify";
  wakeup->AnnounceIdle();
  Sql(schema.conn(), "SELECT " + schema.name() + ".enqueue('t', '{}')");
  EXPECT_EQ(wakeup->Wait(later()), WakeReason::kNotified);
  // Notified means woken: writers are quiet again until the next announcement.
  Sql(schema.conn(), "SELECT " + schema.name() + ".enqueue('t', '{}')");
  EXPECT_EQ(wakeup->Wait(soon()), WakeReason::kTimeout);
  wakeup->Interrupt();
  EXPECT_EQ(wakeup->Wait(later()), WakeReason::kInterrupted);
  // A terminated connection is re-established and reported.
  wakeup->AnnounceIdle();
  Sql(schema.conn(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%" +
                         schema.name() +
                         "%relay_idle%' AND pid <> pg_backend_pid() AND datname = "
                         "current_database()");
  EXPECT_EQ(wakeup->Wait(later()), WakeReason::kReconnected);
  wakeup->AnnounceIdle();
  Sql(schema.conn(), "SELECT " + schema.name() + ".enqueue('t', '{}')");
  EXPECT_EQ(wakeup->Wait(later()), WakeReason::kNotified);
}

// Two relays asleep on one database: one that wakes without a notification and takes its mark
// back must not leave the other deaf.
TEST(PostgresWakeupTest, AWithdrawnMarkLeavesNoOtherRelayDeaf) {
  TestSchema schema;
  auto first = postgres::OpenWakeup(PgUrl(), schema.name());
  auto second = postgres::OpenWakeup(PgUrl(), schema.name());
  const auto later = [] { return std::chrono::steady_clock::now() + seconds{10}; };
  first->AnnounceIdle();
  second->AnnounceIdle();
  second->Withdraw();  // e.g. woken by its sweep, it found work
  // The first is told, looks at the table, and announces again; then a writer wakes it.
  EXPECT_EQ(first->Wait(later()), WakeReason::kNotified);
  first->AnnounceIdle();
  Sql(schema.conn(), "SELECT " + schema.name() + ".enqueue('t', '{}')");
  EXPECT_EQ(first->Wait(later()), WakeReason::kNotified);
  // The second's own notification did not wake itself; the writer's did.
  EXPECT_EQ(second->Wait(later()), WakeReason::kNotified);
}

}  // namespace
}  // namespace outbox::testing

namespace outbox::testing {
namespace {

TEST(RelayHandOffTest, AWriterInTheSameProcessWakesTheRelayWithoutNotify) {
  TestSchema schema;
  HandOffQueue hand_off;
  auto owned = std::make_unique<TestSink>();
  TestSink* sink = owned.get();
  RelayOptions options;
  options.instance = "hand-off";
  options.sweep_interval = std::chrono::seconds{60};
  options.hand_off = &hand_off;
  postgres::StoreOptions store_options;
  store_options.conninfo = PgUrl();
  store_options.schema = schema.name();
  SinkMap sinks;
  sinks.emplace("default", std::move(owned));
  Relay relay(options, postgres::OpenStore(store_options),
              postgres::OpenWakeup(PgUrl(), schema.name()), std::move(sinks));
  std::thread runner([&] { relay.Run(); });
  // Idle now; then suppress the NOTIFY path (mark every sleeping relay woken), so that only the
  // hand-off can wake it.
  const std::string s = schema.name();
  for (int i = 0;
       i < 2000 && Scalar(schema.conn(), "SELECT last_value FROM " + s + ".wakeup_idle_gen") == "1";
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds{5});
  }
  Sql(schema.conn(),
      "SELECT " + s + ".relay_woken((SELECT last_value FROM " + s + ".wakeup_idle_gen))");
  auto app = Connect();
  postgres::Writer writer{schema.name()};
  NewMessage message;
  message.topic = "t";
  message.payload = "{}";
  Sql(app.get(), "BEGIN");
  const MessageId id = writer.Enqueue(app.get(), message);
  Sql(app.get(), "COMMIT");
  hand_off.Offer(std::span{&id, 1});
  bool delivered = false;
  for (int i = 0; i < 1000 && !delivered; ++i) {
    delivered = !sink->delivered().empty();
    std::this_thread::sleep_for(std::chrono::milliseconds{5});
  }
  relay.Stop();
  runner.join();
  ASSERT_TRUE(delivered) << "not woken by the hand-off (the sweep is 60 s away)";
  EXPECT_EQ(sink->delivered().front().id, id);
}

}  // namespace
}  // namespace outbox::testing
