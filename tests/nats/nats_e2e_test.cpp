// outboxd end to end into NATS JetStream: real PostgreSQL (a schema per test), the real binary
// with [sinks.default] type = "nats", a nats-server of the test's own (JetStream, file storage
// under a temporary directory, a port of its own) and an independent reader (an ordered consumer
// of the stream, nats_test_support.h) once the outbox is drained.
//
// Writers commit and roll back concurrently (8 threads, 500 streams, one transaction in five
// rolled back) while things break: outboxd is killed with SIGKILL holding claimed messages (a new
// one takes them over once their leases expire and publishes them again), then the nats-server is
// stopped and started again on the same port and store. What the stream holds must equal what was
// committed, by message id; nothing rolled back may be there; each key's first deliveries must be
// in stream_seq order; nothing may be abandoned. With the stream's duplicate window (2 minutes)
// longer than anything is republished after, there must be no duplicate on the stream at all;
// with a window of 1 s (deduplication effectively off) the duplicates are counted and printed.
//
// Messages per test: 20,000 (it was 50,000: outboxd is killed once it publishes and the server
// restarted at a third, so the rest only made the writers write longer), or
// OUTBOX_NATS_E2E_MESSAGES. The lease is 4 s, publish_timeout 2 s (at most half of it): the new
// relay waits out the killed one's leases.

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "e2e/frozen_relay.h"
#include "nats_test_support.h"
#include "support/child_process.h"
#include "support/pg_test_support.h"
#include "support/wait.h"
#include "support/wal_slot.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

constexpr const char* kTopic = "orders";
constexpr const char* kStream = "OUTBOX_E2E";
constexpr int kStreams = 500;
constexpr int kWriters = 8;
constexpr seconds kServerOutage{2};

int Messages() {
  const char* text = std::getenv("OUTBOX_NATS_E2E_MESSAGES");
  return text != nullptr && std::atoi(text) > 0 ? std::atoi(text) : 20000;
}

double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// What the stream held, checked against what was written.
struct Verdict {
  std::size_t records = 0;
  std::size_t duplicates = 0;
};

class NatsE2eTest : public ::testing::Test {
 protected:
  // The stream over the test's subjects, keeping ids for `window`.
  // With `wal`: the schema delivers by WAL and outboxd reads its slot (issue #20).
  void Prepare(milliseconds window, bool wal = false) {
    JetStreamClient(server_.url())
        .AddStream({.name = kStream,
                    .subjects = {"e2e.>"},
                    .duplicate_window = window,
                    .file_storage = true});
    if (wal) slot_.emplace(schema_.name());
    config_ = "/tmp/outboxd-nats-" + schema_.name() + ".toml";
    std::ofstream(config_) << Replace(R"([database]
url = "@URL@"
schema = "@SCHEMA@"
@MODE@
[relay]
instance = "nats-e2e"
batch_size = 500
lease = "4s"
publish_timeout = "2s"
sweep_interval = "200ms"
max_backoff = "500ms"
[retry]
initial_delay = "100ms"
max_delay = "200ms"
max_attempts = 10
[sinks.default]
type = "nats"
url = "@NATS@"
subject = "e2e.{topic}"
[http]
listen = ""
)");
  }
  void TearDown() override {
    std::remove(config_.c_str());
    std::remove((config_ + ".log").c_str());
  }

  std::string Replace(std::string text) const {
    const std::vector<std::pair<std::string, std::string>> values = {
        {"@URL@", PgUrl()},
        {"@SCHEMA@", schema_.name()},
        {"@MODE@", slot_ ? "mode = \"wal\"" : ""},
        {"@NATS@", server_.url()}};
    for (const auto& [from, to] : values) text.replace(text.find(from), from.size(), to);
    return text;
  }

  // outboxd, its database sessions named after the schema (FreezeHoldingAClaim tells them apart).
  std::unique_ptr<ChildProcess> StartOutboxd() {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{"/usr/bin/env", "PGAPPNAME=" + schema_.name(), OUTBOXD_PATH,
                                 "--config", config_},
        config_ + ".log", Ready::Notify());
  }

  // `total` transactions by kWriters threads, each enqueueing one message on one of kStreams
  // streams; every fifth is rolled back. Records the ids either way.
  void Write(int total) {
    std::vector<std::thread> writers;
    writers.reserve(kWriters);
    for (int writer = 0; writer < kWriters; ++writer) {
      writers.emplace_back([this, total, writer] {
        const PgConn conn = Connect();
        std::minstd_rand pick(static_cast<unsigned>(writer) + 1);
        std::vector<std::string> kept;
        std::vector<std::string> dropped;
        for (int n = writer; n < total; n += kWriters) {
          const bool roll_back = n % 5 == 4;
          const std::string stream = "stream-" + std::to_string(pick() % kStreams);
          Sql(conn.get(), "BEGIN");
          auto& ids = roll_back ? dropped : kept;
          ids.push_back(Scalar(conn.get(), "SELECT " + schema_.name() + ".enqueue('" + kTopic +
                                               "', '{\"n\":" + std::to_string(n) +
                                               "}'::jsonb, stream_key => '" + stream + "')"));
          Sql(conn.get(), roll_back ? "ROLLBACK" : "COMMIT");
        }
        const std::lock_guard lock(mutex_);
        committed_.insert(kept.begin(), kept.end());
        rolled_back_.insert(dropped.begin(), dropped.end());
      });
    }
    for (std::thread& writer : writers) writer.join();
  }

  std::int64_t Rows(const std::string& where = "true") {
    const std::string sql = "SELECT count(*) FROM " + schema_.name() + ".messages WHERE " + where;
    return std::stoll(Scalar(schema_.conn(), sql));
  }

  // Every committed message published: the relay deletes a row once JetStream acks it. In WAL
  // mode no row is written: every committed message is in the stream (deduplicated there).
  bool Drained(seconds limit) {
    if (slot_) {
      return WaitUntil([&] { return Stored() >= committed_.size(); }, limit, milliseconds{200});
    }
    return WaitUntil([&] { return Rows() == 0; }, limit, milliseconds{200});
  }

  // Messages in the stream, 0 while the server is unreachable.
  std::uint64_t Stored() {
    try {
      return JetStreamClient(server_.url()).Count(kStream);
    } catch (const std::exception&) {
      return 0;
    }
  }

  std::string Log() {
    std::ifstream in(config_ + ".log");
    return {std::istreambuf_iterator<char>(in), {}};
  }
  std::string LogTail() {
    const std::string log = Log();
    return log.size() > 4000 ? "..." + log.substr(log.size() - 4000) : log;
  }

  // The run: writers, outboxd killed holding a claim and replaced, the nats-server stopped with
  // `server_signal` and started again once a third of the messages are stored. Returns the
  // seconds from the start until everything committed was published.
  double RunWithFaults(int server_signal, int messages = Messages()) {
    const auto started = SteadyClock::now();
    std::jthread writers([&] { Write(messages); });  // joined on the way out, also on failure

    // outboxd killed (SIGKILL) while it holds claimed messages; in WAL mode, once a tenth is
    // stored (what it published past its last recorded position is published again).
    auto relay = StartOutboxd();
    const bool publishing = WaitUntil([&] { return Stored() > 0; }, seconds{60});
    Freeze freeze;
    if (publishing && slot_) {
      WaitUntil([&] { return Stored() >= static_cast<std::uint64_t>(messages / 10); }, seconds{60});
      killed_after_ = Stored();
    } else if (publishing) {
      freeze = FreezeHoldingAClaim(*relay, schema_.conn(), schema_.name(),
                                   [&] { return Rows("status = 'processing'"); });
    }
    relay->Signal(SIGKILL);
    EXPECT_EQ(relay->Wait(seconds{10}), 128 + SIGKILL);
    EXPECT_TRUE(publishing) << "nothing published 60 s after the start\n" << LogTail();
    if (!slot_) {
      EXPECT_GT(freeze.claimed, 0) << "outboxd not caught holding a claim in " << freeze.attempts
                                   << " attempts: " << freeze.problem;
    }
    killed_holding_ = freeze.claimed;
    relay = StartOutboxd();

    // The server stopped and started again, on the same port and store, while outboxd publishes.
    const auto third = static_cast<std::uint64_t>(messages * 4 / 5 / 3);
    const bool progressed = WaitUntil([&] { return Stored() >= third; }, seconds{90});
    EXPECT_TRUE(progressed) << "fewer than " << third << " stored after 90 s\n" << LogTail();
    stored_at_restart_ = Stored();
    server_.Stop(server_signal);
    std::this_thread::sleep_for(kServerOutage);  // a duration, not a wait for a state
    server_.Start();

    writers.join();
    EXPECT_TRUE(Drained(seconds{120})) << Rows() << " rows left\n" << LogTail();
    const double elapsed = SecondsSince(started);
    EXPECT_EQ(relay->Stop(), 0) << LogTail();
    return elapsed;
  }

  // Reads the whole stream back and checks it against what was committed and rolled back.
  Verdict CheckStream() {
    JetStreamClient reader(server_.url());
    const auto messages = reader.ReadAll(kStream, seconds{90});
    Verdict verdict{.records = messages.size()};
    std::set<std::string> seen;
    std::map<std::string, std::int64_t> last_seq;  // by key, of first deliveries
    std::size_t rolled_back = 0;
    std::size_t stray = 0;
    std::size_t out_of_order = 0;
    for (const StoredMessage& message : messages) {
      const std::string id = message.Header("message_id").value_or("");
      if (message.Header("Nats-Msg-Id") != id) {
        ADD_FAILURE() << "Nats-Msg-Id is not the message id " << id;
      }
      if (rolled_back_.contains(id) && ++rolled_back <= 5) {
        ADD_FAILURE() << "rolled-back message in the stream: " << id;
      }
      if (!rolled_back_.contains(id) && !committed_.contains(id) && ++stray <= 5) {
        ADD_FAILURE() << "a message whose id no writer enqueued: '" << id << "'";
      }
      if (!seen.insert(id).second) {
        ++verdict.duplicates;
        continue;
      }
      const std::int64_t seq = std::stoll(message.Header("outbox-stream-seq").value_or("0"));
      std::int64_t& last = last_seq[message.Header("outbox-stream-key").value_or("")];
      if (seq <= last && ++out_of_order <= 5) {
        ADD_FAILURE() << "key " << message.Header("outbox-stream-key").value_or("")
                      << ": first delivery of seq " << seq << " after seq " << last;
      }
      last = seq;
    }
    std::size_t missing = 0;
    for (const std::string& id : committed_) {
      if (!seen.contains(id) && ++missing <= 5) {
        ADD_FAILURE() << "committed, not in the stream: " << id;
      }
    }
    EXPECT_EQ(missing, 0U) << "committed messages missing from the stream";
    EXPECT_EQ(rolled_back, 0U) << "rolled-back messages in the stream";
    EXPECT_EQ(out_of_order, 0U) << "first deliveries out of stream order";
    EXPECT_EQ(stray, 0U) << "messages with ids that no writer enqueued";
    EXPECT_EQ(last_seq.size(), static_cast<std::size_t>(kStreams));
    EXPECT_EQ(Rows("status = 'abandoned'"), 0);
    return verdict;
  }

  void Print(const std::string& what, const Verdict& verdict, double elapsed) {
    std::printf(
        "[ e2e ] nats, %s: %zu committed, %zu rolled back, %zu in the stream, %zu duplicates; "
        "outboxd killed holding %lld claimed messages, nats-server restarted with %llu stored; "
        "%.1f s\n",
        what.c_str(), committed_.size(), rolled_back_.size(), verdict.records, verdict.duplicates,
        static_cast<long long>(killed_holding_),
        static_cast<unsigned long long>(stored_at_restart_), elapsed);
  }

  NatsServer server_;
  TestSchema schema_;
  std::optional<WalSlot> slot_;     // WAL mode; dropped before the schema
  std::uint64_t killed_after_ = 0;  // WAL mode: stored when outboxd was killed
  std::string config_;
  std::mutex mutex_;
  std::set<std::string> committed_;
  std::set<std::string> rolled_back_;
  std::int64_t killed_holding_ = 0;
  std::uint64_t stored_at_restart_ = 0;
};

// Deduplication on: the stream keeps ids for 2 minutes, longer than any republish comes after
// (the lease is 4 s). The server is killed (SIGKILL), the hardest stop.
TEST_F(NatsE2eTest, KillAndServerRestartLeaveNoDuplicateWithDeduplication) {
  Prepare(std::chrono::minutes{2});
  const double elapsed = RunWithFaults(SIGKILL);
  const Verdict verdict = CheckStream();
  EXPECT_EQ(verdict.duplicates, 0U) << "duplicates on the stream with a 2-minute window";
  EXPECT_EQ(Log().find("duplicate_window"), std::string::npos) << "a warning with a 2 min window";
  Print("dedup on (2 min window), kill -9 of outboxd, nats-server SIGKILL", verdict, elapsed);
}

// Deduplication effectively off: a window of 1 s, shorter than the lease, so that a message
// republished after a takeover is stored again. The duplicates are counted, not failed (the inbox
// removes them); the sink warns about the window at start.
TEST_F(NatsE2eTest, DuplicatesWithDeduplicationEffectivelyOffAreCounted) {
  Prepare(seconds{1});
  const double elapsed = RunWithFaults(SIGTERM);
  const Verdict verdict = CheckStream();
  EXPECT_NE(Log().find("duplicate_window"), std::string::npos)
      << "no warning about a 1 s window with a 4 s lease\n"
      << LogTail();
  Print("dedup off (1 s window), kill -9 of outboxd, nats-server SIGTERM", verdict, elapsed);
}

// WAL mode (issue #20): the messages travel in the WAL only, outboxd reads the schema's slot and
// publishes through the same NATS sink. Killed (SIGKILL) once a tenth is stored, replaced (the
// new one takes the slot over when the lease expires), the nats-server killed and restarted: the
// stream must hold exactly what was committed, once each (2-minute window), every key's first
// deliveries in stream_seq order, and nothing may be parked in the table.
TEST_F(NatsE2eTest, WalModeKillAndServerRestartLoseNothing) {
  Prepare(std::chrono::minutes{2}, /*wal=*/true);
  const int messages = std::min(Messages(), 20000);
  const double elapsed = RunWithFaults(SIGKILL, messages);
  const Verdict verdict = CheckStream();
  EXPECT_EQ(verdict.duplicates, 0U) << "duplicates on the stream with a 2-minute window";
  EXPECT_EQ(Rows(), 0) << "parked in WAL mode without a rejection";
  EXPECT_NE(Log().find("reading the WAL slot"), std::string::npos) << LogTail();
  std::printf("[ e2e ] nats, WAL mode: outboxd killed with %llu stored\n",
              static_cast<unsigned long long>(killed_after_));
  Print("WAL mode, dedup on, kill -9 of outboxd, nats-server SIGKILL", verdict, elapsed);
}

}  // namespace
}  // namespace outbox::testing
