// The WAL-mode relay (include/outbox/relay/wal_relay.h) in-process against a real PostgreSQL: a
// slot of the test's own schema, writers calling enqueue with delivery = 'wal', a scripted sink.
// What it must keep: nothing lost or invented, stream_seq 1..n in commit order per stream, the
// same numbers after a restart, rejected messages and their streams parked in the table (from
// where the table relay publishes them in order), a target whose broker is down parked while the
// others flow, nothing parked when no target can take anything, one relay per slot.
#include "outbox/relay/wal_relay.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "outbox/core/error.h"
#include "outbox/relay/dispatcher.h"
#include "outbox/relay/relay.h"
#include "outbox/store/postgres.h"
#include "outbox/store/postgres_admin.h"
#include "outbox/store/postgres_wal.h"
#include "support/pg_test_support.h"
#include "support/wait.h"
#include "test_sink.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Waits for a state of the relay, at most `limit` (the relay's own pauses are 20–100 ms here).
bool WaitFor(const std::function<bool()>& done, milliseconds limit = milliseconds{20000}) {
  return WaitUntil(done, limit, milliseconds{10});
}

class WalRelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    postgres::EnsureWalSlot(schema_.conn(), S());
    slot_ready_ = true;
    Sql(schema_.conn(), "UPDATE " + S() + ".settings SET delivery = 'wal'");
  }
  void TearDown() override {
    StopAll();
    if (!slot_ready_) return;
    try {
      postgres::DropWalSlot(schema_.conn(), S());
    } catch (const std::exception& error) {
      ADD_FAILURE() << "the slot of " << S() << " was not dropped: " << error.what();
    }
  }

  const std::string& S() const { return schema_.name(); }

  struct Running {
    std::unique_ptr<WalRelay> relay;
    std::thread thread;
    std::exception_ptr failure;
  };

  static DispatcherOptions TestBackoff() {
    return {.min_backoff = milliseconds{20}, .max_backoff = milliseconds{100}};
  }

  // Starts a WAL relay over `sink` on its own thread; returns its index in relays_.
  std::size_t Start(std::unique_ptr<Sink> sink, WalRelayOptions options = {},
                    SinkMap more_sinks = {}) {
    SinkMap sinks = std::move(more_sinks);
    sinks.emplace("default", std::move(sink));
    return Start(std::make_shared<Dispatcher>(std::move(sinks), TestBackoff()), options);
  }
  // The same, through `dispatcher` (which a table relay may share: StartTableRelay).
  std::size_t Start(std::shared_ptr<Dispatcher> dispatcher, WalRelayOptions options = {}) {
    if (options.instance.empty()) options.instance = "wal-test";
    options.lease = milliseconds{2000};
    options.publish_timeout = milliseconds{1000};
    options.min_backoff = milliseconds{20};
    options.max_backoff = milliseconds{100};
    options.retry.initial_delay = milliseconds{100};
    options.retry.max_delay = milliseconds{200};
    auto running = std::make_unique<Running>();
    auto ledger = postgres::OpenWalLedger(PgUrl(), S());
    if (wrap_ledger_) ledger = wrap_ledger_(std::move(ledger));
    running->relay = std::make_unique<WalRelay>(options, postgres::OpenWalSource(PgUrl(), S()),
                                                std::move(ledger), std::move(dispatcher),
                                                [this](LogLevel, std::string_view line) {
                                                  const std::lock_guard lock(log_mutex_);
                                                  log_.emplace_back(line);
                                                });
    Running* raw = running.get();
    raw->thread = std::thread([raw] {
      try {
        raw->relay->Run();
      } catch (...) {
        raw->failure = std::current_exception();
      }
    });
    relays_.push_back(std::move(running));
    return relays_.size() - 1;
  }
  void Stop(std::size_t index) {
    Running& running = *relays_[index];
    if (!running.thread.joinable()) return;
    running.relay->Stop();
    running.thread.join();
    if (running.failure) {
      try {
        std::rethrow_exception(running.failure);
      } catch (const std::exception& error) {
        ADD_FAILURE() << "the WAL relay failed: " << error.what();
      }
    }
  }
  void StopAll() {
    for (std::size_t i = 0; i < relays_.size(); ++i) Stop(i);
    if (table_thread_.joinable()) {
      table_relay_->Stop();
      table_thread_.join();
    }
  }
  WalRelay& relay(std::size_t index) { return *relays_[index]->relay; }
  // The lines the WAL relays logged that contain `text`.
  std::vector<std::string> Logged(const std::string& text) {
    const std::lock_guard lock(log_mutex_);
    std::vector<std::string> found;
    for (const std::string& line : log_) {
      if (line.find(text) != std::string::npos) found.push_back(line);
    }
    return found;
  }

  // The table relay, for what WAL mode parks.
  void StartTableRelay(std::unique_ptr<Sink> sink) {
    SinkMap sinks;
    sinks.emplace("default", std::move(sink));
    StartTableRelay(std::make_shared<Dispatcher>(std::move(sinks), TestBackoff()));
  }
  void StartTableRelay(std::shared_ptr<Dispatcher> dispatcher) {
    RelayOptions options;
    options.instance = "table-test";
    options.sweep_interval = milliseconds{100};
    options.min_backoff = milliseconds{20};
    options.max_backoff = milliseconds{100};
    postgres::StoreOptions store{.conninfo = PgUrl(), .schema = S()};
    store.retry.initial_delay = milliseconds{50};
    store.retry.max_delay = milliseconds{100};
    table_relay_ =
        std::make_unique<Relay>(options, postgres::OpenStore(store),
                                postgres::OpenWakeup(PgUrl(), S()), std::move(dispatcher));
    table_thread_ = std::thread([this] { table_relay_->Run(); });
  }

  // One committed transaction (synchronous commit: logical decoding sees flushed WAL only) with
  // one message; its id.
  std::string Enqueue(PGconn* conn, const std::string& stream, bool commit = true) {
    Sql(conn, "BEGIN");
    Sql(conn, "SET LOCAL synchronous_commit = on");
    const std::string id =
        Scalar(conn, "SELECT " + S() + ".enqueue('t', '{}', stream_key => '" + stream + "')");
    Sql(conn, commit ? "COMMIT" : "ROLLBACK");
    return id;
  }

  std::string Count(const std::string& where) {
    return Scalar(schema_.conn(), "SELECT count(*) FROM " + S() + ".messages WHERE " + where);
  }

  TestSchema schema_;
  std::mutex log_mutex_;
  std::vector<std::string> log_;  // guarded by log_mutex_
  // Set before Start: what the relay gets instead of the real ledger (a wrapper around it).
  std::function<std::unique_ptr<WalLedger>(std::unique_ptr<WalLedger>)> wrap_ledger_;
  bool slot_ready_ = false;
  std::vector<std::unique_ptr<Running>> relays_;
  std::unique_ptr<Relay> table_relay_;
  std::thread table_thread_;
};

// A sink that refuses the message whose id is `poison` (read under `mutex`) with `kind`.
std::unique_ptr<TestSink> Refusing(const std::string& poison, std::mutex& mutex, FailureKind kind,
                                   const std::string& why) {
  return std::make_unique<TestSink>(
      [&poison, &mutex, kind, why](const Envelope& envelope) -> std::optional<Failure> {
        std::lock_guard lock(mutex);
        if (envelope.id.ToString() == poison) return Failure{kind, why};
        return std::nullopt;
      });
}

// Per stream, the stream_seqs of `delivered` in delivery order (first deliveries only).
std::map<std::string, std::vector<std::int64_t>> FirstSeqs(const std::vector<Envelope>& delivered) {
  std::map<std::string, std::vector<std::int64_t>> seqs;
  std::set<MessageId> seen;
  for (const Envelope& envelope : delivered) {
    if (!seen.insert(envelope.id).second) continue;
    seqs[envelope.stream_key.value_or("")].push_back(envelope.stream_seq.value_or(-1));
  }
  return seqs;
}

void ExpectOneToN(const std::map<std::string, std::vector<std::int64_t>>& seqs) {
  for (const auto& [stream, list] : seqs) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      ASSERT_EQ(list[i], static_cast<std::int64_t>(i + 1)) << "stream " << stream << " at " << i;
    }
  }
}

TEST_F(WalRelayTest, PublishesWhatCommitsInCommitOrderWithGapFreeSeqs) {
  auto owned = std::make_unique<TestSink>();
  TestSink* sink = owned.get();
  Start(std::move(owned));
  constexpr int kWriters = 4;
  constexpr int kPerWriter = 150;
  std::mutex mutex;
  std::set<std::string> committed;
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      auto conn = Connect();
      for (int i = 0; i < kPerWriter; ++i) {
        const bool commit = i % 5 != 0;  // a fifth rolls back
        const std::string id = Enqueue(conn.get(), "s" + std::to_string((w + i) % 20), commit);
        if (!commit) continue;
        std::lock_guard lock(mutex);
        committed.insert(id);
      }
    });
  }
  for (auto& writer : writers) writer.join();
  ASSERT_TRUE(WaitFor([&] { return sink->delivered().size() >= committed.size(); }))
      << sink->delivered().size() << " of " << committed.size();
  std::set<std::string> delivered;
  for (const Envelope& envelope : sink->delivered()) delivered.insert(envelope.id.ToString());
  EXPECT_EQ(delivered, committed);
  ExpectOneToN(FirstSeqs(sink->delivered()));
  EXPECT_EQ(Count("true"), "0") << "WAL mode writes no row";
  // The position is recorded and confirmed to the slot.
  EXPECT_TRUE(WaitFor([&] {
    return Scalar(schema_.conn(), "SELECT " + S() + ".wal_position(slot) > '0/0' FROM " + S() +
                                      ".wal_progress") == "t";
  }));
  // Counted once the batch's position is committed, a moment after the sink saw it.
  EXPECT_TRUE(WaitFor([&] { return relay(0).counters().published.load() == committed.size(); }))
      << relay(0).counters().published.load();
  EXPECT_TRUE(relay(0).counters().active.load());
}

TEST_F(WalRelayTest, ARestartReadsAgainFromTheRecordedPositionWithTheSameNumbers) {
  auto first = std::make_unique<TestSink>();
  TestSink* first_sink = first.get();
  const auto index = Start(std::move(first));
  auto conn = Connect();
  for (int i = 0; i < 30; ++i) Enqueue(conn.get(), "s" + std::to_string(i % 3));
  ASSERT_TRUE(WaitFor([&] { return first_sink->delivered().size() == 30; }));
  Stop(index);  // leaves the lease: the next relay takes the slot at once
  for (int i = 30; i < 60; ++i) Enqueue(conn.get(), "s" + std::to_string(i % 3));
  auto second = std::make_unique<TestSink>();
  TestSink* second_sink = second.get();
  Start(std::move(second));
  ASSERT_TRUE(WaitFor([&] { return second_sink->delivered().size() >= 30; }));
  std::vector<Envelope> all = first_sink->delivered();
  for (const Envelope& envelope : second_sink->delivered()) all.push_back(envelope);
  const auto seqs = FirstSeqs(all);
  ExpectOneToN(seqs);
  for (const auto& [stream, list] : seqs) EXPECT_EQ(list.size(), 20U) << stream;
}

TEST_F(WalRelayTest, AnOutageParksNothingAndRepublishesWithTheSameIdsAndSeqs) {
  std::atomic<bool> down{true};
  auto owned = std::make_unique<TestSink>([&](const Envelope&) -> std::optional<Failure> {
    if (down) return Failure{FailureKind::kUnavailable, "broker down"};
    return std::nullopt;
  });
  TestSink* sink = owned.get();
  Start(std::move(owned));
  auto conn = Connect();
  std::set<std::string> committed;
  for (int i = 0; i < 20; ++i) committed.insert(Enqueue(conn.get(), "s" + std::to_string(i % 2)));
  ASSERT_TRUE(WaitFor([&] { return sink->calls() >= 3; })) << "it keeps trying";
  EXPECT_EQ(Count("true"), "0") << "nothing is parked for an outage";
  EXPECT_GT(relay(0).counters().errors.load(), 0U);
  down = false;
  ASSERT_TRUE(WaitFor([&] { return sink->delivered().size() >= 20; }));
  std::set<std::string> delivered;
  for (const Envelope& envelope : sink->delivered()) delivered.insert(envelope.id.ToString());
  EXPECT_EQ(delivered, committed);
  ExpectOneToN(FirstSeqs(sink->delivered()));
}

// Both are outages (nothing parked, the slot read again), but only a broker that could not be
// reached is called unavailable: a publish left without a verdict (no confirm by the deadline) is
// said to be that, so that an operator does not look for a broker that is down.
TEST_F(WalRelayTest, AVerdictThatDidNotComeIsNotCalledAnUnavailableBroker) {
  std::atomic<int> phase{0};  // 0: no verdicts, 1: no broker, 2: fine
  auto owned = std::make_unique<TestSink>([&](const Envelope&) -> std::optional<Failure> {
    if (phase == 0) return Failure{FailureKind::kOutcomeUnknown, "sent, but no confirm"};
    if (phase == 1) return Failure{FailureKind::kUnavailable, "connection refused"};
    return std::nullopt;
  });
  TestSink* sink = owned.get();
  Start(std::move(owned));
  auto conn = Connect();
  std::set<std::string> committed;
  for (int i = 0; i < 5; ++i) committed.insert(Enqueue(conn.get(), "s"));
  ASSERT_TRUE(
      WaitFor([&] { return !Logged("sink 'default' gave no verdict on a message: ").empty(); }));
  EXPECT_TRUE(Logged("is unavailable").empty()) << Logged("is unavailable").front();
  const std::string unconfirmed = Logged("gave no verdict on a message").front();
  EXPECT_NE(
      unconfirmed.find("sent, but no confirm; reading the slot again from the committed position"),
      std::string::npos)
      << unconfirmed;
  phase = 1;
  ASSERT_TRUE(WaitFor([&] { return !Logged("sink 'default' is unavailable: ").empty(); }));
  const std::string unavailable = Logged("is unavailable").front();
  EXPECT_NE(unavailable.find("connection refused"), std::string::npos) << unavailable;
  EXPECT_EQ(Count("true"), "0") << "nothing is parked for either";
  phase = 2;
  ASSERT_TRUE(WaitFor([&] { return sink->delivered().size() >= 5; }));
  std::set<std::string> delivered;
  for (const Envelope& envelope : sink->delivered()) delivered.insert(envelope.id.ToString());
  EXPECT_EQ(delivered, committed);
}

TEST_F(WalRelayTest, ARejectedMessageParksItsStreamOthersFlowAndTheTableRelayKeepsTheOrder) {
  std::atomic<bool> reject{true};
  std::string poison;
  std::mutex mutex;
  auto owned = std::make_unique<TestSink>([&](const Envelope& envelope) -> std::optional<Failure> {
    std::lock_guard lock(mutex);
    if (reject && envelope.id.ToString() == poison) {
      return Failure{FailureKind::kRejected, "NOT_FOUND - no exchange"};
    }
    return std::nullopt;
  });
  TestSink* sink = owned.get();
  auto conn = Connect();
  // The poison is the first message of stream "bad"; its successors must wait for it. (Written
  // before the relay runs, so the sink's verdict reads it unchanged.)
  poison = Enqueue(conn.get(), "bad");
  Start(std::move(owned));
  // Messages of the poison's stream published in the same batch as it reach the broker before its
  // rejection is known (they are "held back": parked and published again after it, as in table
  // mode); the ones read after it is parked do not.
  ASSERT_TRUE(WaitFor([&] { return Count("status = 'failed'") == "1"; }));
  std::vector<std::string> bad_stream{poison};
  for (int i = 0; i < 5; ++i) {
    bad_stream.push_back(Enqueue(conn.get(), "bad"));
    Enqueue(conn.get(), "good");
  }
  ASSERT_TRUE(WaitFor([&] { return Count("stream_key = 'bad'") == "6"; }))
      << Count("stream_key = 'bad'");
  // The last "good" one may come in the batch after the last "bad" one.
  const auto good_delivered = [&] {
    std::size_t n = 0;
    for (const Envelope& envelope : sink->delivered()) {
      if (envelope.stream_key == std::optional<std::string>{"good"}) ++n;
    }
    return n;
  };
  ASSERT_TRUE(WaitFor([&] { return good_delivered() == 5; })) << good_delivered();
  EXPECT_EQ(Count("id = '" + poison +
                  "' AND status = 'failed' AND stream_seq = 1 AND attempts = 1"
                  " AND last_error LIKE '%NOT_FOUND%'"),
            "1");
  EXPECT_EQ(Count("stream_key = 'bad' AND status = 'pending' AND lease_epoch = 1"), "5");
  EXPECT_EQ(Count("stream_key = 'good'"), "0");
  std::vector<std::int64_t> good;
  for (const Envelope& envelope : sink->delivered()) {
    EXPECT_NE(envelope.stream_key, std::optional<std::string>{"bad"}) << "the bad stream waits";
    if (envelope.stream_key == std::optional<std::string>{"good"}) {
      good.push_back(*envelope.stream_seq);
    }
  }
  EXPECT_EQ(good, (std::vector<std::int64_t>{1, 2, 3, 4, 5}));
  // A later message of the bad stream, while its predecessors are parked, is parked too.
  bad_stream.push_back(Enqueue(conn.get(), "bad"));
  ASSERT_TRUE(WaitFor([&] { return Count("stream_key = 'bad'") == "7"; }));

  // The destination is fixed: the table relay publishes the stream in order, seqs 1..7.
  {
    std::lock_guard lock(mutex);
    reject = false;
  }
  auto table_owned = std::make_unique<TestSink>();
  TestSink* table_sink = table_owned.get();
  StartTableRelay(std::move(table_owned));
  ASSERT_TRUE(WaitFor([&] { return table_sink->delivered().size() >= 7; }))
      << table_sink->delivered().size();
  std::vector<std::string> order;
  std::vector<std::int64_t> seqs;
  for (const Envelope& envelope : table_sink->delivered()) {
    order.push_back(envelope.id.ToString());
    seqs.push_back(*envelope.stream_seq);
  }
  EXPECT_EQ(order, bad_stream);
  EXPECT_EQ(seqs, (std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7}));
  // Once the table is empty, the stream flows from the WAL again, numbering on.
  ASSERT_TRUE(WaitFor([&] { return Count("true") == "0"; }));
  Enqueue(conn.get(), "bad");
  ASSERT_TRUE(WaitFor([&] {
    const auto delivered = sink->delivered();
    return !delivered.empty() && delivered.back().stream_key == std::optional<std::string>{"bad"};
  }));
  EXPECT_EQ(sink->delivered().back().stream_seq, std::optional<std::int64_t>{8});
}

// on_abandon = "hold" in WAL mode (issue #43): a message abandoned by the WAL relay is parked
// holding its stream; the stream's later messages are parked behind it (pending, no attempt) while
// other streams flow from the WAL; the table relay publishes none of them until an operator skips
// it, then all of them in order, the first naming the gap.
TEST_F(WalRelayTest, AnAbandonedMessageHoldsItsStreamThroughTheParkedRowsUntilSkipped) {
  std::string poison;
  auto owned = std::make_unique<TestSink>([&](const Envelope& envelope) -> std::optional<Failure> {
    if (envelope.id.ToString() == poison) return Failure{FailureKind::kRejected, "NOT_FOUND"};
    return std::nullopt;
  });
  TestSink* sink = owned.get();
  auto conn = Connect();
  poison = Enqueue(conn.get(), "bad");
  WalRelayOptions options;
  options.retry.max_attempts = 1;
  options.retry.hold_targets = {"default"};
  Start(std::move(owned), options);
  ASSERT_TRUE(WaitFor([&] {
    return Count("id = '" + poison + "' AND status = 'abandoned' AND holds_stream") == "1";
  }));
  std::vector<std::string> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(Enqueue(conn.get(), "bad"));
    Enqueue(conn.get(), "good");
  }
  ASSERT_TRUE(WaitFor([&] { return Count("stream_key = 'bad' AND status = 'pending'") == "3"; }));
  ASSERT_TRUE(WaitFor([&] { return sink->delivered().size() >= 3; }));
  for (const Envelope& envelope : sink->delivered()) {
    EXPECT_EQ(envelope.stream_key, std::optional<std::string>{"good"}) << "the held stream waits";
  }
  EXPECT_EQ(Count("stream_key = 'bad' AND status = 'pending' AND attempts = 0"), "3");

  auto table_owned = std::make_unique<TestSink>();
  TestSink* table_sink = table_owned.get();
  StartTableRelay(std::move(table_owned));
  std::this_thread::sleep_for(milliseconds{300});  // a few of the table relay's sweeps
  EXPECT_TRUE(table_sink->delivered().empty()) << "the table relay holds the stream too";
  auto admin = postgres::OpenAdmin(PgUrl(), S());
  MessageFilter filter;
  filter.ids = std::vector<MessageId>{*Uuid::Parse(poison)};
  EXPECT_EQ(admin->Skip(filter, /*dry_run=*/false).count, 1);
  ASSERT_TRUE(WaitFor([&] { return table_sink->delivered().size() >= 3; }));
  const auto delivered = table_sink->delivered();
  ASSERT_EQ(delivered.size(), 3U);
  for (std::size_t i = 0; i < delivered.size(); ++i) {
    EXPECT_EQ(delivered[i].id.ToString(), held[i]);
  }
  EXPECT_EQ(delivered[0].stream_prev_seq, std::optional<std::int64_t>{0}) << "seq 1 was skipped";
}

// A batch where one target rejects a message while another target's broker is down: the down
// target's messages are parked as waiting (no attempt spent, published by the table relay once
// its sink answers), the rejection is parked as failed, once; the slot moves on, and the healthy
// target's later messages flow while the other stays down.
TEST_F(WalRelayTest, AnOutageOfOneTargetParksItsMessagesBesideARejectionByAnother) {
  std::string poison;
  auto rejecting = std::make_unique<TestSink>([&](const Envelope& envelope) {
    return envelope.id.ToString() == poison
               ? std::optional<Failure>{Failure{FailureKind::kRejected, "NOT_FOUND - no exchange"}}
               : std::nullopt;
  });
  TestSink* healthy = rejecting.get();
  auto down = std::make_unique<TestSink>([&](const Envelope&) -> std::optional<Failure> {
    return Failure{FailureKind::kUnavailable, "broker down"};
  });
  TestSink* other = down.get();
  auto conn = Connect();
  // One transaction, so one batch holds them all (written before the relay runs, so the sink's
  // verdict reads `poison` unchanged).
  Sql(conn.get(), "BEGIN");
  Sql(conn.get(), "SET LOCAL synchronous_commit = on");
  poison = Scalar(conn.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 'bad')");
  for (int i = 0; i < 4; ++i) {
    Sql(conn.get(),
        "SELECT " + S() + ".enqueue('t', '{}', stream_key => 's', targets => " + "ARRAY['other'])");
  }
  Sql(conn.get(), "COMMIT");
  SinkMap more;
  more.emplace("other", std::move(down));
  Start(std::move(rejecting), {}, std::move(more));
  ASSERT_TRUE(WaitFor([&] { return Count("true") == "5"; })) << Count("true");
  EXPECT_EQ(Count("id = '" + poison + "' AND status = 'failed' AND target = 'default'"), "1");
  EXPECT_EQ(Count("target = 'other' AND status = 'pending' AND attempts = 0 AND stream_key = 's'"),
            "4");
  // The first says why; the rest wait behind it.
  EXPECT_EQ(Count("target = 'other' AND last_error LIKE '%broker down%'"), "1");
  EXPECT_EQ(Scalar(schema_.conn(),
                   "SELECT string_agg(stream_seq::text, ',' ORDER BY stream_seq) "
                   "FROM " +
                       S() + ".messages WHERE target = 'other'"),
            "1,2,3,4");
  EXPECT_EQ(relay(0).counters().errors.load(), 0U) << "not an outage: 'default' could publish";
  // The slot moved on: the healthy target's next message flows while 'other' is still down.
  const std::string next = Enqueue(conn.get(), "fresh");
  ASSERT_TRUE(WaitFor([&] {
    for (const Envelope& envelope : healthy->delivered()) {
      if (envelope.id.ToString() == next) return true;
    }
    return false;
  }));
  EXPECT_EQ(other->calls(), 1) << "a paused target is not sent to again before its probe";
}

// With every target down there is nothing to keep flowing: nothing is parked (the WAL is not
// copied into the table), the batch is read and published again once the broker is back.
TEST_F(WalRelayTest, WhenNoTargetCanTakeAnythingNothingIsParked) {
  std::atomic<bool> down{true};
  auto flaky = std::make_unique<TestSink>([&](const Envelope&) -> std::optional<Failure> {
    if (down) return Failure{FailureKind::kUnavailable, "broker down"};
    return std::nullopt;
  });
  TestSink* sink = flaky.get();
  auto conn = Connect();
  std::set<std::string> committed;
  for (int i = 0; i < 4; ++i) committed.insert(Enqueue(conn.get(), "s"));
  Start(std::move(flaky));
  ASSERT_TRUE(WaitFor([&] { return sink->calls() >= 3; })) << "it keeps trying";
  EXPECT_EQ(Count("true"), "0") << "nothing is parked while every target is down";
  EXPECT_GT(relay(0).counters().errors.load(), 0U);
  down = false;
  ASSERT_TRUE(WaitFor([&] { return sink->delivered().size() >= 4; }));
  std::set<std::string> delivered;
  for (const Envelope& envelope : sink->delivered()) delivered.insert(envelope.id.ToString());
  EXPECT_EQ(delivered, committed);
  ExpectOneToN(FirstSeqs(sink->delivered()));
  EXPECT_EQ(Count("true"), "0");
}

// Issue #41: WAL mode with two targets, one broker down. The WAL relay and the table relay share
// one dispatcher, as outboxd runs them: the healthy target's messages keep flowing through the
// outage; the down target's wait in the table; when its broker is back, every message of both
// arrives, none invented, each stream's first deliveries in stream_seq order 1..n.
TEST_F(WalRelayTest, WithOneTargetDownTheOtherFlowsAndNothingIsLostOrReordered) {
  std::atomic<bool> down{true};
  auto healthy_owned = std::make_unique<TestSink>();
  TestSink* healthy = healthy_owned.get();
  auto flaky = std::make_unique<TestSink>([&](const Envelope&) -> std::optional<Failure> {
    if (down) return Failure{FailureKind::kUnavailable, "broker down"};
    return std::nullopt;
  });
  TestSink* other = flaky.get();
  SinkMap sinks;
  sinks.emplace("default", std::move(healthy_owned));
  sinks.emplace("other", std::move(flaky));
  auto dispatcher = std::make_shared<Dispatcher>(std::move(sinks), TestBackoff());
  Start(dispatcher);
  StartTableRelay(dispatcher);
  std::set<std::string> to_default;
  std::set<std::string> to_other;
  const auto write = [&](int transactions, int first) {
    auto conn = Connect();
    for (int i = first; i < first + transactions; ++i) {
      Sql(conn.get(), "BEGIN");
      Sql(conn.get(), "SET LOCAL synchronous_commit = on");
      // Both targets get a copy of each message (enqueue returns their ids in target order).
      const std::string ids =
          Scalar(conn.get(), "SELECT array_to_string(" + S() +
                                 ".enqueue('t', '{}', stream_key => 's" + std::to_string(i % 10) +
                                 "', targets => ARRAY['default', 'other']), ',')");
      Sql(conn.get(), "COMMIT");
      const auto comma = ids.find(',');
      ASSERT_NE(comma, std::string::npos) << ids;
      to_default.insert(ids.substr(0, comma));
      to_other.insert(ids.substr(comma + 1));
    }
  };
  write(300, 0);
  const auto delivered_ids = [](const TestSink& sink) {
    std::set<std::string> ids;
    for (const Envelope& envelope : sink.delivered()) ids.insert(envelope.id.ToString());
    return ids;
  };
  ASSERT_TRUE(WaitFor([&] { return delivered_ids(*healthy) == to_default; }))
      << delivered_ids(*healthy).size() << " of " << to_default.size()
      << " delivered to the healthy target while the other is down";
  EXPECT_TRUE(other->delivered().empty());
  EXPECT_GT(std::stoi(Count("target = 'other'")), 0) << "the down target's messages wait";
  // The table relay's counters show a pause whoever made it (/readyz reads them).
  EXPECT_TRUE(table_relay_->counters().broker_unavailable.load());
  EXPECT_EQ(table_relay_->paused_targets(), std::vector<std::string>{"other"});
  EXPECT_EQ(Count("target = 'default'"), "0");
  down = false;
  write(100, 300);
  ASSERT_TRUE(WaitFor([&] {
    return delivered_ids(*other) == to_other && delivered_ids(*healthy) == to_default;
  })) << delivered_ids(*other).size()
      << " of " << to_other.size();
  ExpectOneToN(FirstSeqs(healthy->delivered()));
  ExpectOneToN(FirstSeqs(other->delivered()));
  EXPECT_TRUE(WaitFor([&] { return Count("true") == "0"; })) << Count("true") << " rows left";
}

// Issue #43 in WAL mode: a target with a max_rate is sent what its bucket allows from the slot;
// what is over is parked in the table (no attempt, no outage, no warning per batch) and published
// by the table relay within the same bucket. The other target flows; every stream stays in order.
TEST_F(WalRelayTest, ARateLimitedTargetParksWhatIsOverItsRateAndKeepsItsRate) {
  constexpr double kRate = 200;
  constexpr double kBurst = 20;
  auto healthy_owned = std::make_unique<TestSink>();
  TestSink* healthy = healthy_owned.get();
  std::mutex mutex;
  std::vector<std::chrono::steady_clock::time_point> sent_at;  // the limited target's
  auto limited_owned = std::make_unique<TestSink>([&](const Envelope&) -> std::optional<Failure> {
    std::lock_guard lock(mutex);
    sent_at.push_back(std::chrono::steady_clock::now());
    return std::nullopt;
  });
  TestSink* limited = limited_owned.get();
  SinkMap sinks;
  sinks.emplace("default", std::move(healthy_owned));
  sinks.emplace("other", std::move(limited_owned));
  DispatcherOptions options = TestBackoff();
  options.rate_limits = {{"other", {.max_rate = kRate, .max_burst = kBurst}}};
  auto dispatcher = std::make_shared<Dispatcher>(std::move(sinks), options);
  Start(dispatcher);
  StartTableRelay(dispatcher);
  constexpr int kTransactions = 200;
  {
    auto conn = Connect();
    for (int i = 0; i < kTransactions; ++i) {
      Sql(conn.get(), "BEGIN");
      Sql(conn.get(), "SET LOCAL synchronous_commit = on");
      Scalar(conn.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 's" +
                             std::to_string(i % 10) + "', targets => ARRAY['default', 'other'])");
      Sql(conn.get(), "COMMIT");
    }
  }
  ASSERT_TRUE(WaitFor([&] { return healthy->delivered().size() == kTransactions; }));
  ASSERT_TRUE(WaitFor([&] { return limited->delivered().size() == kTransactions; }))
      << limited->delivered().size() << " of " << kTransactions;
  EXPECT_TRUE(WaitFor([&] { return Count("true") == "0"; })) << Count("true") << " rows left";
  ExpectOneToN(FirstSeqs(healthy->delivered()));
  ExpectOneToN(FirstSeqs(limited->delivered()));
  EXPECT_EQ(relay(0).counters().parked.load() > 0, true) << "nothing was over the rate?";
  EXPECT_TRUE(Logged("parked in the table").empty()) << Logged("parked in the table")[0];
  EXPECT_TRUE(Logged("unavailable").empty()) << Logged("unavailable")[0];
  std::lock_guard lock(mutex);
  const double seconds_taken =
      std::chrono::duration<double>(sent_at.back() - sent_at.front()).count();
  const double rate = (static_cast<double>(sent_at.size()) - kBurst) / seconds_taken;
  std::printf("[ wal ] max_rate %.0f: %.1f msgs/s after the burst, %llu parked\n", kRate, rate,
              static_cast<unsigned long long>(relay(0).counters().parked.load()));
  EXPECT_LT(rate, kRate * 1.1);
  EXPECT_GT(rate, kRate * 0.5) << "the parked ones waited long";
}

// The targets of a batch are published side by side, as the table relay's lanes: a slow broker
// adds nothing to the others' time. Seen as a fact, not a timing: each sink, on its first message,
// waits (up to 5 s) for the other sink to have been called, which one after the other never is.
TEST_F(WalRelayTest, TheTargetsOfABatchArePublishedSideBySide) {
  std::atomic<int> entered{0};
  std::atomic<int> met{0};
  const auto meeting = [&](std::shared_ptr<std::atomic<bool>> first) {
    return [&, first](const Envelope&) -> std::optional<Failure> {
      if (first->exchange(false)) {
        ++entered;
        if (WaitFor([&] { return entered.load() == 2; }, milliseconds{5000})) ++met;
      }
      return std::nullopt;
    };
  };
  auto one = std::make_unique<TestSink>(meeting(std::make_shared<std::atomic<bool>>(true)));
  auto two = std::make_unique<TestSink>(meeting(std::make_shared<std::atomic<bool>>(true)));
  TestSink* first = one.get();
  TestSink* second = two.get();
  auto conn = Connect();
  Sql(conn.get(), "BEGIN");  // one transaction: one batch
  Sql(conn.get(), "SET LOCAL synchronous_commit = on");
  for (int i = 0; i < 3; ++i) {
    Scalar(conn.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 's')");
    Scalar(conn.get(), "SELECT " + S() + ".enqueue('t', '{}', stream_key => 's', targets => " +
                           "ARRAY['other'])");
  }
  Sql(conn.get(), "COMMIT");
  SinkMap more;
  more.emplace("other", std::move(two));
  Start(std::move(one), {}, std::move(more));
  ASSERT_TRUE(WaitFor([&] { return relay(0).counters().published.load() == 6; }))
      << relay(0).counters().published.load();
  EXPECT_EQ(met.load(), 2) << "one sink was not called while the other published";
  EXPECT_EQ(first->delivered().size(), 3U);
  EXPECT_EQ(second->delivered().size(), 3U);
  EXPECT_EQ(first->calls(), 1);
  EXPECT_EQ(second->calls(), 1);
}

// A permanent rejection is parked as abandoned and holds nothing back; the stream's next message
// carries stream_prev_seq (the seq below the abandoned run: 0 here), as after a claim in table
// mode, so that a consumer's inbox knows seq 1 will not come; the one after it carries none.
TEST_F(WalRelayTest, AMessageAfterAnAbandonedOneCarriesStreamPrevSeq) {
  std::string poison;
  std::mutex mutex;
  auto owned = Refusing(poison, mutex, FailureKind::kPermanent, "too large");
  TestSink* sink = owned.get();
  auto conn = Connect();
  poison = Enqueue(conn.get(), "a");  // before the relay runs, which reads it
  Start(std::move(owned));
  ASSERT_TRUE(WaitFor([&] {
    return Count("id = '" + poison + "' AND status = 'abandoned' AND stream_seq = 1") == "1";
  }));
  const std::string next = Enqueue(conn.get(), "a");
  const std::string after = Enqueue(conn.get(), "a");
  ASSERT_TRUE(WaitFor([&] { return sink->delivered().size() == 2; }));
  const auto delivered = sink->delivered();
  EXPECT_EQ(delivered[0].id.ToString(), next);
  EXPECT_EQ(delivered[0].stream_seq, std::optional<std::int64_t>{2});
  EXPECT_EQ(delivered[0].stream_prev_seq, std::optional<std::int64_t>{0});
  EXPECT_EQ(delivered[1].id.ToString(), after);
  EXPECT_EQ(delivered[1].stream_seq, std::optional<std::int64_t>{3});
  EXPECT_EQ(delivered[1].stream_prev_seq, std::nullopt);
  EXPECT_EQ(Count("true"), "1") << "only the abandoned message is in the table";
}

// Followers sent in the same batch as a message that gets abandoned reached the broker without
// stream_prev_seq: they are parked and published again by the table relay, whose claim sets it
// (as table mode holds them back). Other streams are not touched.
TEST_F(WalRelayTest, FollowersInTheBatchOfAnAbandonedMessageAreRepublishedWithStreamPrevSeq) {
  std::string poison;
  std::mutex mutex;
  auto owned = Refusing(poison, mutex, FailureKind::kPermanent, "too large");
  TestSink* sink = owned.get();
  auto conn = Connect();
  // One transaction, so one batch holds them all (written before the relay runs).
  Sql(conn.get(), "BEGIN");
  Sql(conn.get(), "SET LOCAL synchronous_commit = on");
  const auto enqueue = [&](const std::string& stream) {
    return Scalar(conn.get(),
                  "SELECT " + S() + ".enqueue('t', '{}', stream_key => '" + stream + "')");
  };
  {
    std::lock_guard lock(mutex);
    poison = enqueue("a");
  }
  const std::string follower = enqueue("a");
  const std::string other = enqueue("b");
  Sql(conn.get(), "COMMIT");
  Start(std::move(owned));
  ASSERT_TRUE(WaitFor([&] { return Count("true") == "2"; })) << Count("true");
  EXPECT_EQ(Count("id = '" + poison + "' AND status = 'abandoned' AND stream_seq = 1"), "1");
  EXPECT_EQ(Count("id = '" + follower + "' AND status = 'pending' AND stream_seq = 2"), "1");
  EXPECT_EQ(Count("stream_key = 'b'"), "0");
  auto table_owned = std::make_unique<TestSink>();
  TestSink* table_sink = table_owned.get();
  StartTableRelay(std::move(table_owned));
  ASSERT_TRUE(WaitFor([&] { return table_sink->delivered().size() == 1; }));
  const Envelope republished = table_sink->delivered()[0];
  EXPECT_EQ(republished.id.ToString(), follower);
  EXPECT_EQ(republished.stream_seq, std::optional<std::int64_t>{2});
  EXPECT_EQ(republished.stream_prev_seq, std::optional<std::int64_t>{0});
  bool other_seen = false;
  for (const Envelope& envelope : sink->delivered()) {
    other_seen = other_seen || envelope.id.ToString() == other;
  }
  EXPECT_TRUE(other_seen);
}

// The real ledger, with hooks run before each Commit and each StreamStates (on the relay's
// thread).
class HookedLedger final : public WalLedger {
 public:
  HookedLedger(std::unique_ptr<WalLedger> real, std::function<void(const WalCommit&)> before,
               std::function<void()> before_states = {}, std::function<void()> before_purge = {})
      : real_(std::move(real)),
        before_(std::move(before)),
        before_states_(std::move(before_states)),
        before_purge_(std::move(before_purge)) {}
  std::optional<std::int64_t> Acquire(const std::string& owner, milliseconds duration) override {
    return real_->Acquire(owner, duration);
  }
  void Leave(const std::string& owner, std::int64_t epoch) override { real_->Leave(owner, epoch); }
  Lsn Position() override { return real_->Position(); }
  std::vector<std::int64_t> Seqs(const std::vector<WalStream>& streams) override {
    return real_->Seqs(streams);
  }
  std::vector<WalStreamState> StreamStates(
      const std::vector<std::pair<WalStream, std::int64_t>>& streams) override {
    if (before_states_) before_states_();
    return real_->StreamStates(streams);
  }
  WalSlotState SlotState() override { return real_->SlotState(); }
  std::optional<std::int64_t> EndOtherReader() override { return real_->EndOtherReader(); }
  WalCommitted Commit(const std::string& owner, std::int64_t epoch,
                      const WalCommit& commit) override {
    before_(commit);
    return real_->Commit(owner, epoch, commit);
  }
  std::int64_t Purge() override {
    if (before_purge_) before_purge_();
    return real_->Purge();
  }

 private:
  std::unique_ptr<WalLedger> real_;
  std::function<void(const WalCommit&)> before_;
  std::function<void()> before_states_;
  std::function<void()> before_purge_;
};

// A backlog (written before the relay starts) goes in a pipeline: the next batch is read while
// one publishes, and published while the one before is committed, so the broker does not wait
// for the database's round trips. Seen here as a fact, not a timing: the first commit waits
// (up to 10 s) for the second batch's publish to begin, which it would never see if the relay
// committed before publishing on.
TEST_F(WalRelayTest, ABacklogIsPublishedWhileTheBatchBeforeIsCommitted) {
  std::atomic<bool> first{true};
  // Slow on its first message, as a broker is slower than the slot: the next batch arrives
  // meanwhile.
  auto owned = std::make_unique<TestSink>([&](const Envelope&) -> std::optional<Failure> {
    if (first.exchange(false)) std::this_thread::sleep_for(milliseconds{300});
    return std::nullopt;
  });
  TestSink* sink = owned.get();
  std::atomic<int> commits{0};
  std::atomic<int> calls_at_first_commit{0};
  wrap_ledger_ = [&](std::unique_ptr<WalLedger> real) -> std::unique_ptr<WalLedger> {
    return std::make_unique<HookedLedger>(std::move(real), [&](const WalCommit& commit) {
      // The fixture's switch to WAL mode leaves a mark in the slot, alone in a batch at times.
      if (commit.seqs.empty()) return;
      if (commits++ != 0) return;
      WaitFor([&] { return sink->calls() >= 2; }, milliseconds{10000});
      calls_at_first_commit = sink->calls();
    });
  };
  auto conn = Connect();
  std::set<std::string> committed;
  for (int i = 0; i < 60; ++i) committed.insert(Enqueue(conn.get(), "s" + std::to_string(i % 7)));
  Start(std::move(owned), {.instance = "wal-test", .batch_size = 10});
  ASSERT_TRUE(WaitFor([&] { return relay(0).counters().published.load() == 60; }))
      << relay(0).counters().published.load();
  EXPECT_GE(calls_at_first_commit.load(), 2) << "the first commit came before the next publish";
  std::set<std::string> delivered;
  for (const Envelope& envelope : sink->delivered()) delivered.insert(envelope.id.ToString());
  EXPECT_EQ(delivered, committed);
  EXPECT_EQ(sink->delivered().size(), 60U) << "nothing published twice";
  ExpectOneToN(FirstSeqs(sink->delivered()));
}

// A poison inside a backlog: the batch after it was read (and its stream's state in the table
// looked up) before the poison's verdict and the poison's commit. Its messages of the poison's
// stream must still not reach the broker: they are parked behind it, the rest flows.
TEST_F(WalRelayTest, APoisonInABacklogHoldsItsStreamInTheBatchReadAheadOfItsVerdict) {
  std::string poison;
  std::mutex mutex;
  auto owned = std::make_unique<TestSink>([&](const Envelope& envelope) -> std::optional<Failure> {
    std::lock_guard lock(mutex);
    if (envelope.id.ToString() != poison) return std::nullopt;
    // Slow on the poison, so that the next batch is surely read ahead meanwhile.
    std::this_thread::sleep_for(milliseconds{300});
    return Failure{FailureKind::kRejected, "NOT_FOUND - no exchange"};
  });
  TestSink* sink = owned.get();
  auto conn = Connect();
  std::vector<std::string> bad;
  std::vector<std::string> good;
  for (int i = 0; i < 30; ++i) {
    bad.push_back(Enqueue(conn.get(), "bad"));
    good.push_back(Enqueue(conn.get(), "good"));
  }
  {
    std::lock_guard lock(mutex);
    poison = bad[2];  // in the first batch of 10, two bad ones after it
  }
  Start(std::move(owned), {.instance = "wal-test", .batch_size = 10});
  ASSERT_TRUE(WaitFor([&] { return relay(0).counters().transactions.load() == 60; }))
      << relay(0).counters().transactions.load();
  // The poison's batch: its followers there reached the broker before the verdict (held back:
  // parked, published again after it, as in table mode). None of a later batch did.
  const auto poison_call = sink->FirstCall(MessageId::Parse(bad[2]).value());
  ASSERT_TRUE(poison_call.has_value());
  std::map<std::string, int> call_of;
  const auto delivered = sink->delivered();
  const auto calls = sink->batches();
  for (std::size_t i = 0; i < delivered.size(); ++i) {
    call_of.emplace(delivered[i].id.ToString(), calls[i]);
  }
  for (std::size_t i = 0; i < bad.size(); ++i) {
    if (i < 2) {
      EXPECT_TRUE(call_of.contains(bad[i])) << "bad " << i << " is before the poison";
    } else if (i > 2 && call_of.contains(bad[i])) {
      EXPECT_EQ(call_of[bad[i]], *poison_call)
          << "bad " << i << " reached the broker after the poison's batch";
    }
  }
  EXPECT_FALSE(call_of.contains(bad[2]));
  EXPECT_EQ(Count("stream_key = 'bad'"), "28");
  EXPECT_EQ(Count("id = '" + bad[2] + "' AND status = 'failed' AND stream_seq = 3"), "1");
  EXPECT_EQ(Count("stream_key = 'bad' AND status = 'pending'"), "27");
  std::vector<std::int64_t> good_seqs;
  for (const Envelope& envelope : delivered) {
    if (envelope.stream_key == std::optional<std::string>{"good"}) {
      good_seqs.push_back(*envelope.stream_seq);
    }
  }
  std::vector<std::int64_t> expected(30);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(good_seqs, expected) << "the other stream flows, once each, in order";
  EXPECT_GE(sink->calls(), 6);
}

// The table is looked at for a batch's streams (WalLedger::StreamStates) only when the last
// commit did not find it clear: most of the time it holds nothing, and the look is a round trip.
// An abandoned message in it brings the look back for every batch.
TEST_F(WalRelayTest, StreamStatesAreReadOnlyWhileTheTableHoldsSomething) {
  auto owned = std::make_unique<TestSink>([](const Envelope& envelope) -> std::optional<Failure> {
    if (envelope.topic == "bad") return Failure{FailureKind::kPermanent, "too large"};
    return std::nullopt;
  });
  TestSink* sink = owned.get();
  std::atomic<int> looks{0};
  wrap_ledger_ = [&](std::unique_ptr<WalLedger> real) -> std::unique_ptr<WalLedger> {
    return std::make_unique<HookedLedger>(
        std::move(real), [](const WalCommit&) {}, [&] { ++looks; });
  };
  Start(std::move(owned));
  auto conn = Connect();
  // One batch after another, each well within a second of the commit before.
  for (std::size_t i = 1; i <= 5; ++i) {
    Enqueue(conn.get(), "a");
    ASSERT_TRUE(WaitFor([&] { return relay(0).counters().published.load() == i; }));
  }
  EXPECT_EQ(looks.load(), 1) << "only the first batch, before any commit said the table is clear";
  Sql(conn.get(), "BEGIN");
  Sql(conn.get(), "SET LOCAL synchronous_commit = on");
  Scalar(conn.get(), "SELECT " + S() + ".enqueue('bad', '{}', stream_key => 'b')");
  Sql(conn.get(), "COMMIT");
  ASSERT_TRUE(WaitFor([&] { return Count("status = 'abandoned'") == "1"; }));
  const int before = looks.load();
  for (std::size_t i = 6; i <= 8; ++i) {
    Enqueue(conn.get(), "b");
    ASSERT_TRUE(WaitFor([&] { return relay(0).counters().published.load() == i; }));
  }
  EXPECT_EQ(looks.load(), before + 3) << "one look per batch while a message is abandoned";
  // And what the look is for: the stream's next message says its predecessor was abandoned.
  const auto delivered = sink->delivered();
  ASSERT_EQ(delivered.size(), 8U);
  EXPECT_EQ(delivered[5].stream_seq, std::optional<std::int64_t>{2});
  EXPECT_EQ(delivered[5].stream_prev_seq, std::optional<std::int64_t>{0});
  EXPECT_EQ(delivered[6].stream_prev_seq, std::nullopt);
}

// Purging the ledger is housekeeping: when it fails, the relay says so and goes on reading and
// publishing (it used to take it for an outage: the stream closed and read again).
TEST_F(WalRelayTest, APurgeThatFailsIsReportedAndStopsNothing) {
  auto owned = std::make_unique<TestSink>();
  TestSink* sink = owned.get();
  std::atomic<int> purges{0};
  wrap_ledger_ = [&](std::unique_ptr<WalLedger> real) -> std::unique_ptr<WalLedger> {
    return std::make_unique<HookedLedger>(
        std::move(real), [](const WalCommit&) {}, std::function<void()>{},
        [&] {
          ++purges;
          throw StoreError(FailureKind::kUnavailable, "purge: canceling statement");
        });
  };
  Start(std::move(owned));
  auto conn = Connect();
  for (int i = 0; i < 10; ++i) Enqueue(conn.get(), "s" + std::to_string(i % 3));
  ASSERT_TRUE(WaitFor([&] { return relay(0).counters().published.load() == 10; }));
  EXPECT_GE(purges.load(), 1);
  EXPECT_EQ(relay(0).counters().errors.load(), 0U) << "a failed purge is not an outage";
  EXPECT_EQ(sink->delivered().size(), 10U) << "nothing read and published twice";
}

TEST_F(WalRelayTest, OneRelayReadsTheSlotTheOtherStandsByAndTakesOver) {
  auto first = std::make_unique<TestSink>();
  TestSink* first_sink = first.get();
  const auto a = Start(std::move(first), {.instance = "a"});
  ASSERT_TRUE(WaitFor([&] { return relay(a).counters().active.load(); }));
  auto second = std::make_unique<TestSink>();
  TestSink* second_sink = second.get();
  const auto b = Start(std::move(second), {.instance = "b"});
  auto conn = Connect();
  for (int i = 0; i < 10; ++i) Enqueue(conn.get(), "s");
  ASSERT_TRUE(WaitFor([&] { return first_sink->delivered().size() == 10; }));
  EXPECT_FALSE(relay(b).counters().active.load());
  EXPECT_TRUE(second_sink->delivered().empty());
  Stop(a);
  for (int i = 0; i < 10; ++i) Enqueue(conn.get(), "s");
  ASSERT_TRUE(WaitFor([&] { return second_sink->delivered().size() == 10; }));
  EXPECT_TRUE(relay(b).counters().active.load());
  EXPECT_EQ(second_sink->delivered().front().stream_seq, std::optional<std::int64_t>{11});
}

// What /readyz and the outbox_wal_slot_* gauges read: the slot is there, and read while a relay
// streams it.
TEST_F(WalRelayTest, TheSlotIsSeenReadWhileARelayStreamsIt) {
  auto ledger = postgres::OpenWalLedger(PgUrl(), S());
  WalSlotState state = ledger->SlotState();
  EXPECT_TRUE(state.exists);
  EXPECT_FALSE(state.active) << "nobody reads it yet";
  EXPECT_NE(state.wal_status, "lost");
  auto owned = std::make_unique<TestSink>();
  TestSink* sink = owned.get();
  const auto index = Start(std::move(owned));
  ASSERT_TRUE(WaitFor([&] { return ledger->SlotState().active; }));
  // The relay's own check runs every 5 s; its first may have come before it streamed.
  EXPECT_TRUE(WaitFor([&] { return !relay(index).SlotProblem().has_value(); }, seconds{12}))
      << relay(index).SlotProblem().value_or("");
  // What a relay taking the lease over does to a frozen reader, done to this one: its stream
  // ends, and it reads the slot again from its recorded position.
  EXPECT_TRUE(ledger->EndOtherReader().has_value());
  auto conn = Connect();
  const std::string id = Enqueue(conn.get(), "s");
  ASSERT_TRUE(WaitFor([&] {
    const auto delivered = sink->delivered();
    return !delivered.empty() && delivered.back().id.ToString() == id;
  }));
  // The server's measure of how far the reader's confirmations trail: shown once the reader has
  // confirmed WAL the server sent it (the relay confirms within a second of its commit).
  std::optional<double> lag;
  EXPECT_TRUE(WaitFor([&] {
    lag = ledger->SlotState().flush_lag_seconds;
    return lag.has_value();
  })) << "pg_stat_replication.flush_lag never shown";
  EXPECT_GE(lag.value_or(-1), 0.0);
  EXPECT_LT(lag.value_or(99), 10.0);
}

TEST_F(WalRelayTest, BadOptionsAreRefusedByName) {
  const auto make = [&](WalRelayOptions options) {
    SinkMap sinks;
    sinks.emplace("default", std::make_unique<TestSink>());
    WalRelay relay(std::move(options), postgres::OpenWalSource(PgUrl(), S()),
                   postgres::OpenWalLedger(PgUrl(), S()), std::move(sinks));
  };
  const auto key_of = [&](WalRelayOptions options) -> std::string {
    try {
      make(std::move(options));
    } catch (const ConfigError& error) {
      return error.key();
    }
    return "<accepted>";
  };
  EXPECT_EQ(key_of({.instance = ""}), "instance");
  EXPECT_EQ(key_of({.instance = "x", .batch_size = 0}), "batch_size");
  EXPECT_EQ(key_of({.instance = "x", .linger = milliseconds{-1}}), "linger");
  EXPECT_EQ(key_of({.instance = "x", .lease = milliseconds{10}}), "lease");
  EXPECT_EQ(key_of({.instance = "x", .publish_timeout = seconds{60}}), "publish_timeout");
  EXPECT_EQ(key_of({.instance = "x"}), "<accepted>");
}

TEST_F(WalRelayTest, ASchemaWithoutASlotIsRefusedWithTheFix) {
  TestSchema other;
  try {
    postgres::OpenWalSource(PgUrl(), other.name());
    ADD_FAILURE() << "opened a WAL source without a slot";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kPermanent);
    EXPECT_NE(std::string{error.what()}.find("outboxctl migrate --wal-slot"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace outbox::testing
