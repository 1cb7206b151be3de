// outboxd end to end into Redis Streams: real PostgreSQL (a schema per test), the real binary
// with [sinks.default] type = "redis", a redis-server of the test's own (appendonly yes), and an
// independent reader (plain hiredis XRANGE, redis_test_support.h) that reads the stream back once
// the outbox is drained.
//
// Writers commit and roll back concurrently (8 threads, 500 streams, one transaction in five
// rolled back) while things break: outboxd is killed with SIGKILL holding claimed messages
// (frozen_relay.h) and a second one takes them over once their leases expire; while that one
// publishes, the redis-server is restarted on the same port and directory. What the stream holds
// must equal what was committed, by message id; nothing rolled back may be there; each stream's
// first deliveries must be in stream_seq order; nothing may be abandoned.
//
// Durability, and so what a restart may be: an entry is confirmed when Redis has executed the
// command, and is on disk as its appendfsync says. These tests run appendfsync everysec (Redis's
// default and what most run) and restart the server with SIGTERM, a clean shutdown that writes
// and fsyncs the AOF before it exits: nothing confirmed may be lost. A SIGKILL under everysec may
// lose up to a second of confirmed entries, which no sink can prevent; with appendfsync always
// Redis fsyncs before it replies, and ServerKilledWithAppendfsyncAlwaysLosesNothing kills it with
// SIGKILL.
//
// With dedup on (the default), a message published again (its reply lost to the restart, or its
// relay killed before it recorded the outcome) is found by the script: 0 duplicates on the
// stream, asserted. With dedup off, the duplicates are counted and printed, not asserted.
//
// Messages per test: 20,000 (it was 50,000: the faults all come in the first few thousand), or
// OUTBOX_REDIS_E2E_MESSAGES. The lease is 4 s, publish_timeout 2 s (at most half of it): the new
// relay waits out the killed one's leases, and that wait was most of a run with 6 s.

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
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
#include "outbox/core/wire_names.h"
#include "redis_test_support.h"
#include "support/child_process.h"
#include "support/pg_test_support.h"
#include "support/wait.h"
#include "support/wal_slot.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

constexpr const char* kTopic = "orders";  // the stream key: stream = "{topic}"
constexpr int kStreams = 500;
constexpr int kWriters = 8;
constexpr milliseconds kOutage{1000};

int Messages() {
  const char* text = std::getenv("OUTBOX_REDIS_E2E_MESSAGES");
  return text != nullptr && std::atoi(text) > 0 ? std::atoi(text) : 20000;
}

double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// What the stream held, checked against what was written.
struct Verdict {
  std::size_t entries = 0;
  std::size_t duplicates = 0;
};

// What happened to the server during a run.
struct Restart {
  bool done = false;
  std::int64_t entries_before = 0;  // XLEN when it went down
  double down_seconds = 0;
  bool felt = false;  // the relay logged the sink unavailable meanwhile
};

class RedisE2eTest : public ::testing::Test {
 protected:
  void TearDown() override {
    std::remove(config_.c_str());
    std::remove((config_ + ".log").c_str());
  }

  // A redis-server of the test's own with the AOF on, and outboxd's configuration for it. With
  // `wal`: the schema delivers by WAL and outboxd reads its slot (issue #20).
  void Prepare(bool dedup, const std::string& appendfsync, bool wal = false) {
    server_ = std::make_unique<RedisServer>(
        std::vector<std::string>{"--appendonly", "yes", "--appendfsync", appendfsync});
    if (wal) slot_.emplace(schema_.name());
    config_ = "/tmp/outboxd-redis-" + schema_.name() + ".toml";
    std::ofstream(config_) << "[database]\nurl = \"" << PgUrl() << "\"\nschema = \""
                           << schema_.name() << "\"\n"
                           << (wal ? "mode = \"wal\"\n" : "") << R"([relay]
instance = "redis-e2e"
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
type = "redis"
stream = "{topic}"
connect_timeout = "1s"
)"
                           << "url = \"" << server_->url()
                           << "\"\ndedup = " << (dedup ? "true" : "false")
                           << "\n[http]\nlisten = \"\"\n";
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
        std::vector<std::pair<std::string, std::string>> kept;  // id, stream
        std::vector<std::string> dropped;
        for (int n = writer; n < total; n += kWriters) {
          const bool roll_back = n % 5 == 4;
          const std::string stream = "stream-" + std::to_string(pick() % kStreams);
          Sql(conn.get(), "BEGIN");
          std::string id = Scalar(conn.get(), "SELECT " + schema_.name() + ".enqueue('" + kTopic +
                                                  "', '{\"n\":" + std::to_string(n) +
                                                  "}'::jsonb, stream_key => '" + stream + "')");
          if (roll_back) {
            dropped.push_back(std::move(id));
          } else {
            kept.emplace_back(std::move(id), stream);
          }
          Sql(conn.get(), roll_back ? "ROLLBACK" : "COMMIT");
        }
        const std::lock_guard lock(mutex_);
        for (auto& [id, stream] : kept) {
          committed_.insert(id);
          committed_streams_.insert(std::move(stream));
        }
        rolled_back_.insert(dropped.begin(), dropped.end());
      });
    }
    for (std::thread& writer : writers) writer.join();
  }

  std::int64_t Rows(const std::string& where = "true") {
    const std::string sql = "SELECT count(*) FROM " + schema_.name() + ".messages WHERE " + where;
    return std::stoll(Scalar(schema_.conn(), sql));
  }

  // Every committed message published: the relay deletes a row once Redis answered for it. In
  // WAL mode no row is written: every committed message is on the stream (deduplicated there).
  bool Drained(seconds limit) {
    if (slot_) {
      return WaitUntil(
          [&] { return StreamLength() >= static_cast<std::int64_t>(committed_.size()); }, limit,
          milliseconds{200});
    }
    return WaitUntil([&] { return Rows() == 0; }, limit, milliseconds{200});
  }

  // XLEN of the stream; -1 while the server does not answer.
  std::int64_t StreamLength() {
    try {
      return server_->Client().Length(kTopic);
    } catch (const std::runtime_error&) {
      return -1;
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

  // outboxd, started, stopped (SIGSTOP) once it publishes and holds claimed messages, then killed.
  // In WAL mode, killed once a tenth of `messages` is on the stream (what it published past its
  // last recorded position is published again).
  struct Killed {
    bool publishing = false;
    Freeze freeze;
    int status = -1;           // as ChildProcess::Wait says
    std::int64_t entries = 0;  // on the stream when it was killed
  };
  Killed KillHoldingAClaim(int messages) {
    Killed killed;
    auto relay = StartOutboxd();
    killed.publishing = WaitUntil([&] { return StreamLength() > 0; }, seconds{60});
    if (killed.publishing && slot_) {
      WaitUntil([&] { return StreamLength() >= messages / 10; }, seconds{60});
    } else if (killed.publishing) {
      killed.freeze = FreezeHoldingAClaim(*relay, schema_.conn(), schema_.name(),
                                          [&] { return Rows("status = 'processing'"); });
    }
    killed.entries = StreamLength();
    relay->Signal(SIGKILL);
    killed.status = relay->Wait(seconds{10});
    return killed;
  }

  // Once the relay publishes again (the stream grows past `from`), the server goes down: SIGTERM
  // (a clean shutdown) or SIGKILL; then started on the same port and dir.
  Restart RestartServerWhilePublishing(std::int64_t from, bool kill) {
    Restart restart;
    if (!WaitUntil([&] { return StreamLength() > from; }, seconds{60}, milliseconds{5})) {
      return restart;
    }
    restart.entries_before = StreamLength();
    const auto down = SteadyClock::now();
    if (kill) {
      server_->Kill();
    } else {
      server_->Stop();
    }
    // Down at least kOutage, and until the relay has found it down (with few messages it may
    // have nothing to publish at first: then until the killed relay's leases expire).
    std::this_thread::sleep_for(kOutage);
    restart.felt =
        WaitUntil([&] { return Log().find("sink 'default' is unavailable") != std::string::npos; },
                  seconds{20}, milliseconds{50});
    server_->Start();
    restart.down_seconds = SecondsSince(down);
    restart.done = true;
    return restart;
  }

  // Reads the whole stream back and checks it against what was committed and rolled back.
  Verdict CheckStream() {
    const auto entries = server_->Client().ReadStream(kTopic);
    Verdict verdict{.entries = entries.size()};
    std::set<std::string> seen;
    std::map<std::string, std::int64_t> last_seq;  // by stream key, of first deliveries
    std::size_t rolled_back = 0;
    std::size_t stray = 0;
    std::size_t out_of_order = 0;
    for (const StreamEntry& entry : entries) {
      const std::string id = entry.Field("id").value_or("");
      if (rolled_back_.contains(id) && ++rolled_back <= 5) {
        ADD_FAILURE() << "rolled-back message on the stream: " << id;
      }
      if (!rolled_back_.contains(id) && !committed_.contains(id) && ++stray <= 5) {
        ADD_FAILURE() << "an entry whose id no writer enqueued: '" << id << "'";
      }
      if (!seen.insert(id).second) {
        ++verdict.duplicates;
        continue;
      }
      const std::int64_t seq =
          std::stoll(entry.Field(std::string{wire::kStreamSeqHeader}).value_or("0"));
      std::int64_t& last = last_seq[entry.Field(std::string{wire::kStreamKeyHeader}).value_or("")];
      if (seq <= last && ++out_of_order <= 5) {
        ADD_FAILURE() << "stream " << entry.Field(std::string{wire::kStreamKeyHeader}).value_or("")
                      << ": first delivery of seq " << seq << " after seq " << last;
      }
      last = seq;
    }
    std::size_t missing = 0;
    for (const std::string& id : committed_) {
      if (!seen.contains(id) && ++missing <= 5) {
        ADD_FAILURE() << "committed, not on the stream: " << id;
      }
    }
    EXPECT_EQ(missing, 0U) << "committed messages missing from the stream";
    EXPECT_EQ(rolled_back, 0U) << "rolled-back messages on the stream";
    EXPECT_EQ(out_of_order, 0U) << "first deliveries out of stream order";
    EXPECT_EQ(stray, 0U) << "entries with ids that no writer enqueued";
    EXPECT_EQ(last_seq.size(), committed_streams_.size());
    EXPECT_EQ(Rows("status = 'abandoned'"), 0);
    return verdict;
  }

  // The whole run: writers, outboxd killed holding a claim, a second one, the server restarted
  // while it publishes; drained; the stream checked.
  Verdict Run(const std::string& what, bool kill_server, int messages = Messages()) {
    const auto started = SteadyClock::now();
    std::thread writers([&] { Write(messages); });
    const Killed killed = KillHoldingAClaim(messages);
    const bool caught = killed.publishing && (slot_ || killed.freeze.claimed > 0);
    if (!caught) writers.join();
    EXPECT_TRUE(caught) << (killed.publishing ? "outboxd not caught holding a claim in " +
                                                    std::to_string(killed.freeze.attempts) +
                                                    " attempts: " + killed.freeze.problem
                                              : "nothing published 60 s after the start")
                        << "\n"
                        << LogTail();
    if (!caught) return {};
    EXPECT_EQ(killed.status, 128 + SIGKILL);
    auto second = StartOutboxd();
    const Restart restart = RestartServerWhilePublishing(StreamLength(), kill_server);
    writers.join();
    EXPECT_TRUE(restart.done) << "the second outboxd published nothing in 60 s\n" << LogTail();
    EXPECT_TRUE(Drained(seconds{120})) << Rows() << " rows left\n" << LogTail();
    const double elapsed = SecondsSince(started);
    EXPECT_EQ(second->Stop(), 0) << LogTail();
    // The relay felt the restart (so the run is not vacuous about it).
    EXPECT_TRUE(restart.felt) << "the relay never found the server down\n" << LogTail();
    const Verdict verdict = CheckStream();
    std::printf(
        "[ e2e ] redis, %s: %zu committed, %zu rolled back, %zu entries, %zu duplicates; outboxd "
        "killed holding %lld claimed messages (%lld entries on the stream); redis-server %s at "
        "%lld entries, down %.1f s; %.1f s\n",
        what.c_str(), committed_.size(), rolled_back_.size(), verdict.entries, verdict.duplicates,
        static_cast<long long>(killed.freeze.claimed), static_cast<long long>(killed.entries),
        kill_server ? "killed" : "restarted", static_cast<long long>(restart.entries_before),
        restart.down_seconds, elapsed);
    return verdict;
  }

  TestSchema schema_;
  std::optional<WalSlot> slot_;  // WAL mode; dropped before the schema
  std::unique_ptr<RedisServer> server_;
  std::string config_;
  std::mutex mutex_;
  std::set<std::string> committed_;
  std::set<std::string> rolled_back_;
  std::set<std::string> committed_streams_;  // the streams of committed messages
};

TEST_F(RedisE2eTest, DedupOnLeavesNoDuplicateThroughAKilledRelayAndAServerRestart) {
  Prepare(/*dedup=*/true, "everysec");
  const Verdict verdict = Run("dedup on, appendfsync everysec, SIGTERM", /*kill_server=*/false);
  EXPECT_EQ(verdict.duplicates, 0U) << "duplicates on the stream with dedup on";
}

// The same run without deduplication: duplicates are allowed (the inbox removes them), printed.
TEST_F(RedisE2eTest, DedupOffCountsTheDuplicates) {
  Prepare(/*dedup=*/false, "everysec");
  Run("dedup off, appendfsync everysec, SIGTERM", /*kill_server=*/false);
}

// appendfsync always: Redis fsyncs before it replies, so a server killed with SIGKILL loses
// nothing that was confirmed.
TEST_F(RedisE2eTest, ServerKilledWithAppendfsyncAlwaysLosesNothing) {
  Prepare(/*dedup=*/true, "always");
  const Verdict verdict = Run("dedup on, appendfsync always, SIGKILL", /*kill_server=*/true);
  EXPECT_EQ(verdict.duplicates, 0U) << "duplicates on the stream with dedup on";
}

// WAL mode (issue #20): the messages travel in the WAL only; outboxd reads the schema's slot and
// publishes through the same Redis sink, is killed once a tenth is on the stream and replaced
// (the new one takes the slot over when the lease expires), and the server restarts meanwhile.
// The stream must hold what was committed, once each, in stream_seq order; nothing parked.
TEST_F(RedisE2eTest, WalModeLosesNothingThroughAKilledRelayAndAServerRestart) {
  Prepare(/*dedup=*/true, "everysec", /*wal=*/true);
  const Verdict verdict = Run("WAL mode, dedup on, appendfsync everysec, SIGTERM",
                              /*kill_server=*/false, std::min(Messages(), 20000));
  EXPECT_EQ(verdict.duplicates, 0U) << "duplicates on the stream with dedup on";
  EXPECT_EQ(Rows(), 0) << "parked in WAL mode without a rejection";
  EXPECT_NE(Log().find("reading the WAL slot"), std::string::npos) << LogTail();
}

}  // namespace
}  // namespace outbox::testing
