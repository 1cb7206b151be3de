// outboxd end to end into a webhook endpoint: real PostgreSQL (a schema per test), the real
// binary with [sinks.default] type = "http", and a webhook_receiver.py of the test's own (its own
// Standard Webhooks secret; the receiver checks every signature with Python's hmac, and any
// request it refuses 401 fails the test) that answers a share of the requests 503 (no
// Retry-After) and a share 429 with Retry-After: 1, and records every request.
//
// Writers commit and roll back concurrently (8 threads, 200 streams, one transaction in five
// rolled back). Once the outbox is drained, the receiver's record must show: every committed
// message accepted (2xx) at least once; nothing rolled back, nothing no writer enqueued, ever
// received; nothing abandoned; each stream's FIRST acceptances exactly its stream_seq 1, 2, ...,
// which is commit order (and each writer's own messages of a stream in the order it committed
// them); no message sent with more attempts than the 503/429 answers it got explain; and no
// request arriving while a Retry-After said to wait.
//
// EveryCommittedMessageAcceptedInOrderAndRetryAfterHonoured: the endpoint up all along.
// EndpointDownForSecondsLosesNothingAndSpendsNoAttempt: while the writers write, the receiver
// is stopped for OUTBOX_HTTP_OUTAGE_SECONDS (6 by default, the issue's case 30) and a new one
// started on the same port (same secret, same behaviour); what the first one recorded counts too.
// An unreachable endpoint is kUnavailable: no attempt spent. The attempts check shows it (the
// messages' attempts at the end of the outage, and the outbox-attempts of every request after it);
// and with max_attempts = 8 and the relay probing every 250 ms, an outage that spent attempts would
// abandon every message it found.
//
// Messages per test: 10,000 (it was 20,000; 8,000 committed over 200 streams, 40 in each), or
// OUTBOX_HTTP_E2E_MESSAGES. To look into a failure:
// OUTBOX_HTTP_E2E_DUMP=<file> writes the record (seq, t, answered_t, sent_t, status, id, stream
// key, stream_seq, outbox-attempts; tab-separated, one request a line) and keeps outboxd's
// configuration and log (/tmp/outboxd-webhook-<schema>.toml.log).

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "http_test_support.h"
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
constexpr int kStreams = 200;
constexpr int kWriters = 8;
// The endpoint's answers: 10 % 503 without Retry-After (retried with the relay's backoff, an
// attempt spent) and 0.03 % 429 with Retry-After: 1. A 429 makes the sink send nothing more to the
// whole host for the second it asks (sink/http.h), so each one costs the run about a second: at
// 3 % (one request in 33, while up to 200 streams have one in flight) 20,000 messages took over a
// minute and a half of mostly waiting per test, and at 0.1 % (15 to 20 per test) the 429s were
// still two thirds of each test's time. The receiver draws one number a request from a generator
// seeded with the destination's seed (webhook_receiver.py), so which requests it answers 429 is
// known in advance: the seeds below give each test 5 or 6, each a second-long window that the
// Retry-After check looks into (Check fails a test that saw none). With kRatio429 = 0.0003, seed 9
// answers 429 to its requests #864, #2359, #5015, #6012 and #7614 and to no other of its first
// 18,500 (10,000 messages, 8,000 of them committed, make about 8,900 requests; the outage test's
// first receiver gets about 1,200); seed 48 to its #287, #554, #642, #2806 and #6044 and to no
// other of its first 17,000 (the outage test's second receiver gets about 7,700).
constexpr double kRatio503 = 0.10;
constexpr double kRatio429 = 0.0003;
constexpr int kSeed = 9;
constexpr int kSeedAfterOutage = 48;
constexpr double kRetryAfterSeconds = 1.0;
// A 429 is decided by the receiver at answered_t and written to the socket at sent_t; the sink
// counts the second from when it has read that answer, so nothing it sends after that may arrive
// before answered_t + 1 s. Requests it had sent before (or was sending while its event loop had
// not read the answer yet) still arrive after sent_t, and the receiver stamps an arrival only once
// one of its threads has read the request's headers (Python, one GIL, up to 200 connections, two
// cores shared with PostgreSQL, 8 writers and outboxd). The slack covers that: nothing may arrive
// from sent_t + slack until answered_t + 1 s.
constexpr double kWireSlackSeconds = 0.3;
// How long the endpoint is down: OUTBOX_HTTP_OUTAGE_SECONDS, 6 by default (what scripts/test
// runs; the issue's case is 30 s, and nothing in the relay changes with the length: it probes the
// host every 250 ms to 5 s all along; in 6 s several probes fail, each waiting twice as long).
seconds Outage() {
  const char* text = std::getenv("OUTBOX_HTTP_OUTAGE_SECONDS");
  return seconds{text != nullptr && std::atoi(text) > 0 ? std::atoi(text) : 6};
}
// The writers of the outage test spread their transactions over this long, so that they are
// still writing when the endpoint goes down (once a tenth is published, about 2 s after the
// start) and go on while it is down and after it is back (it was the outage + 10 s).
milliseconds OutageWritePace() { return Outage() + seconds{6}; }

int Messages() {
  const char* text = std::getenv("OUTBOX_HTTP_E2E_MESSAGES");
  return text != nullptr && std::atoi(text) > 0 ? std::atoi(text) : 10000;
}

double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// The destination's behaviour (webhook_receiver.py's PUT /_control/dest/<dest>).
std::string Behaviour(int seed) {
  return R"({"ratio_503": )" + std::to_string(kRatio503) + R"(, "ratio_429": )" +
         std::to_string(kRatio429) + R"(, "retry_after": "1", "retry_after_503": null, "seed": )" +
         std::to_string(seed) + "}";
}

bool Rejected(const ReceivedRequest& request) {
  return request.status && (*request.status == 408 || *request.status == 429 ||
                            (*request.status >= 500 && *request.status < 600));
}

// A committed message: its stream, and which writer committed it when.
struct Written {
  std::string stream;
  int writer = 0;
  int n = 0;  // the writer's commits are in n order
};

// What the receiver's record showed.
struct Verdict {
  std::size_t requests = 0;
  std::size_t accepted = 0;    // answered 2xx
  std::size_t duplicates = 0;  // 2xx beyond a message's first
  std::size_t status_503 = 0;
  std::size_t status_429 = 0;
  std::size_t max_attempts = 0;  // the highest outbox-attempts header sent
  // Retry-After: the 429s checked, the latest arrival within the slack after one (requests that
  // were on the wire), and the earliest arrival after the slack (at least the Retry-After).
  std::size_t retry_after_checked = 0;
  double latest_on_wire = 0;
  std::optional<double> earliest_after_slack;
};

class WebhookE2eTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (!config_.empty() && std::getenv("OUTBOX_HTTP_E2E_DUMP") == nullptr) {
      std::remove(config_.c_str());
      std::remove((config_ + ".log").c_str());
    }
  }

  // A receiver with the test's destination, on `port` (0: any).
  std::unique_ptr<WebhookReceiver> StartReceiver(int port, int seed) {
    return std::make_unique<WebhookReceiver>(
        std::vector<std::string>{secret_}, "127.0.0.1", port,
        std::vector<std::pair<std::string, std::string>>{{dest_, Behaviour(seed)}});
  }

  // Relay settings for a quick run: a message answered 503 is due again 100-200 ms later
  // (retry.*), found by a sweep every 100 ms; the target paused when a whole batch could not be
  // sent (the endpoint asked to wait, or is down) is probed again after 50 ms doubling to 250 ms,
  // so a Retry-After window or the outage's end costs little more than itself. batch_size 1000
  // over 200 streams keeps most streams' next message at hand (one request per stream in flight).
  // max_in_flight 64, the default: the receiver (Python, one GIL) answers no faster over more
  // connections, and its threads only stamp arrivals later (requests on the wire after a 429
  // arrived up to 250 ms after it with 256, up to 120 ms with 64). publish_timeout 5 s (at most
  // half the lease) and request_timeout 3 s bound a batch whose requests hang.
  // With the schema's slot made (slot_), outboxd reads it too (WAL mode, issue #20).
  void WriteConfig(int max_attempts) {
    config_ = "/tmp/outboxd-webhook-" + schema_.name() + ".toml";
    std::ofstream(config_) << "[database]\nurl = \"" << PgUrl() << "\"\nschema = \""
                           << schema_.name() << "\"\n"
                           << (slot_ ? "mode = \"wal\"\n" : "") << R"([relay]
instance = "webhook-e2e"
batch_size = 1000
lease = "10s"
publish_timeout = "5s"
sweep_interval = "100ms"
min_backoff = "50ms"
max_backoff = "250ms"
[retry]
initial_delay = "100ms"
max_delay = "200ms"
)"
                           << "max_attempts = " << max_attempts << R"(
[sinks.default]
type = "http"
max_in_flight = 64
connect_timeout = "1s"
request_timeout = "3s"
)"
                           << "url = \"" << receiver_->BaseUrl() << "/hooks/" << dest_
                           << "\"\nsecrets = [\"" << secret_ << "\"]\n"
                           << "[http]\nlisten = \"\"\n";
  }

  std::unique_ptr<ChildProcess> StartOutboxd() {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{"/usr/bin/env", "PGAPPNAME=" + schema_.name(), OUTBOXD_PATH,
                                 "--config", config_},
        config_ + ".log", Ready::Notify());
  }

  // `total` transactions by kWriters threads, each enqueueing one message on one of kStreams
  // streams; every fifth is rolled back. Spread over `pace` (0: as fast as they go). Records the
  // ids either way.
  void Write(int total, milliseconds pace) {
    writing_ = true;
    const auto start = SteadyClock::now();
    std::vector<std::thread> writers;
    writers.reserve(kWriters);
    for (int writer = 0; writer < kWriters; ++writer) {
      writers.emplace_back([this, total, writer, start, pace] {
        const PgConn conn = Connect();
        std::minstd_rand pick(static_cast<unsigned>(writer) + 1);
        std::vector<std::pair<std::string, Written>> kept;
        std::vector<std::string> dropped;
        for (int n = writer; n < total; n += kWriters) {
          if (pace.count() > 0) {
            std::this_thread::sleep_until(start + milliseconds{pace.count() * n / total});
          }
          const bool roll_back = n % 5 == 4;
          const std::string stream = "stream-" + std::to_string(pick() % kStreams);
          Sql(conn.get(), "BEGIN");
          std::string id = Scalar(conn.get(), "SELECT " + schema_.name() + ".enqueue('" + kTopic +
                                                  "', '{\"n\":" + std::to_string(n) +
                                                  "}'::jsonb, stream_key => '" + stream + "')");
          Sql(conn.get(), roll_back ? "ROLLBACK" : "COMMIT");
          if (roll_back) {
            dropped.push_back(std::move(id));
          } else {
            kept.emplace_back(std::move(id), Written{stream, writer, n});
            committed_count_.fetch_add(1);
          }
        }
        const std::lock_guard lock(mutex_);
        for (auto& [id, written] : kept) {
          ++committed_per_stream_[written.stream];
          committed_.emplace(std::move(id), std::move(written));
        }
        rolled_back_.insert(dropped.begin(), dropped.end());
      });
    }
    for (std::thread& writer : writers) writer.join();
    writing_ = false;
  }

  std::int64_t Rows(const std::string& where = "true") {
    const std::string sql = "SELECT count(*) FROM " + schema_.name() + ".messages WHERE " + where;
    return std::stoll(Scalar(schema_.conn(), sql));
  }

  // Every committed message published or abandoned (abandoned ones stay: checked apart). In
  // WAL mode, once the slot's reader has confirmed the WAL up to the writers' last commit (and
  // what it parked in the table is gone too).
  bool Drained(seconds limit) {
    const auto until = SteadyClock::now() + limit;
    if (slot_) {
      const std::string last_commit = WalSlot::InsertPosition();
      if (!WaitUntil([&] { return slot_->ConfirmedUpTo(last_commit); }, limit, milliseconds{200})) {
        return false;
      }
    }
    const auto left = std::chrono::duration_cast<milliseconds>(until - SteadyClock::now());
    return WaitUntil([&] { return Rows("status <> 'abandoned'") == 0; },
                     std::max(left, milliseconds{0}), milliseconds{200});
  }

  void ExpectNothingAbandoned() {
    EXPECT_EQ(Rows("status = 'abandoned'"), 0)
        << "abandoned, e.g.: "
        << Scalar(schema_.conn(),
                  "SELECT coalesce(string_agg(id::text || ' after ' || attempts || "
                  "' attempts: ' || coalesce(last_error, ''), E'\\n'), '') FROM "
                  "(SELECT * FROM " +
                      schema_.name() + ".messages WHERE status = 'abandoned' LIMIT 5) a");
  }

  std::string Log() {
    std::ifstream in(config_ + ".log");
    return {std::istreambuf_iterator<char>(in), {}};
  }
  std::string LogTail() {
    const std::string log = Log();
    return log.size() > 4000 ? "..." + log.substr(log.size() - 4000) : log;
  }

  // The record (every request, in the order the receivers decided their answers; a first
  // receiver's before its successor's) against what was committed and rolled back.
  Verdict Check(const std::vector<ReceivedRequest>& requests) {
    Verdict verdict{.requests = requests.size()};
    if (const char* dump = std::getenv("OUTBOX_HTTP_E2E_DUMP")) {
      std::ofstream out(dump);
      for (const ReceivedRequest& r : requests) {
        out << r.seq << '\t' << std::to_string(r.t) << '\t' << std::to_string(r.answered_t) << '\t'
            << std::to_string(r.sent_t.value_or(0)) << '\t' << r.status.value_or(0) << '\t'
            << r.id.value_or("") << '\t' << r.stream_key.value_or("") << '\t'
            << r.stream_seq.value_or(-1) << '\t' << r.Header("outbox-attempts").value_or("")
            << '\n';
      }
    }
    std::size_t refused = 0;
    std::size_t unexpected = 0;
    std::size_t rolled_back = 0;
    std::size_t stray = 0;
    std::size_t wrong_stream = 0;
    std::size_t too_many_attempts = 0;
    std::map<std::string, std::size_t> rejections;  // by id, so far
    std::set<std::string> accepted;
    std::map<std::string, std::vector<const ReceivedRequest*>> firsts;  // by stream
    for (const ReceivedRequest& request : requests) {
      const std::string id = request.id.value_or("");
      if ((request.status == 401 || request.signature_ok != true) && ++refused <= 5) {
        ADD_FAILURE() << "the receiver refused the signature of " << id << " (status "
                      << request.status.value_or(0) << ")";
      }
      if (request.status != 200 && request.status != 503 && request.status != 429 &&
          ++unexpected <= 5) {
        ADD_FAILURE() << "answered " << request.status.value_or(0) << ": " << id;
      }
      if (rolled_back_.contains(id)) {
        if (++rolled_back <= 5) ADD_FAILURE() << "a rolled-back message was sent: " << id;
        continue;
      }
      const auto written = committed_.find(id);
      if (written == committed_.end()) {
        if (++stray <= 5) ADD_FAILURE() << "a message whose id no writer enqueued: '" << id << "'";
        continue;
      }
      if (request.stream_key != written->second.stream && ++wrong_stream <= 5) {
        ADD_FAILURE() << id << " sent with outbox-stream-key "
                      << request.stream_key.value_or("(none)") << ", written to "
                      << written->second.stream;
      }
      // Only an answer that refuses the message (429, 5xx) spends an attempt; an endpoint that
      // cannot be reached, or a request without an answer, does not.
      const std::size_t attempts =
          static_cast<std::size_t>(std::stoull(request.Header("outbox-attempts").value_or("0")));
      verdict.max_attempts = std::max(verdict.max_attempts, attempts);
      if (attempts > rejections[id] && ++too_many_attempts <= 5) {
        ADD_FAILURE() << id << " sent with outbox-attempts " << attempts << " after only "
                      << rejections[id] << " answers that refused it";
      }
      if (Rejected(request)) ++rejections[id];
      verdict.status_503 += request.status == 503 ? 1U : 0U;
      verdict.status_429 += request.status == 429 ? 1U : 0U;
      if (!request.ok()) continue;
      ++verdict.accepted;
      if (!accepted.insert(id).second) {
        ++verdict.duplicates;
        continue;
      }
      firsts[written->second.stream].push_back(&request);
    }

    std::size_t missing = 0;
    for (const auto& [id, written] : committed_) {
      if (!accepted.contains(id) && ++missing <= 5) {
        ADD_FAILURE() << "committed, never accepted: " << id << " (" << written.stream << ")";
      }
    }
    // Each stream's first acceptances: stream_seq 1, 2, ..., one per committed message (writers
    // of one stream serialize on its counter until they commit, so this is commit order); and
    // each writer's messages in the order it committed them.
    std::size_t out_of_order = 0;
    std::set<std::string> streams_out_of_order;
    for (const auto& [stream, committed] : committed_per_stream_) {
      const auto& accepted_firsts = firsts[stream];
      std::map<int, int> last_n;  // by writer
      for (std::size_t k = 0; k < accepted_firsts.size(); ++k) {
        const ReceivedRequest& request = *accepted_firsts[k];
        const auto expected = static_cast<std::int64_t>(k) + 1;
        const Written& written = committed_.at(*request.id);
        const auto [last, first] = last_n.try_emplace(written.writer, written.n);
        const bool writer_order = first || last->second < written.n;
        last->second = written.n;
        if (request.stream_seq == expected && writer_order) continue;
        streams_out_of_order.insert(stream);
        if (++out_of_order <= 5) {
          ADD_FAILURE() << stream << ": first acceptance #" << expected << " is stream_seq "
                        << request.stream_seq.value_or(-1) << " (writer " << written.writer
                        << ", its transaction " << written.n << "; receiver seq " << request.seq
                        << ")";
        }
      }
      // (Fewer only when some are missing, reported above.)
      EXPECT_TRUE(accepted_firsts.size() == committed || missing > 0) << stream;
    }

    // Retry-After: nothing arrives in (sent_t + slack, answered_t + Retry-After) of a 429.
    std::vector<std::pair<double, const ReceivedRequest*>> arrivals;
    arrivals.reserve(requests.size());
    for (const ReceivedRequest& request : requests) arrivals.emplace_back(request.t, &request);
    std::sort(arrivals.begin(), arrivals.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::size_t early = 0;
    for (const ReceivedRequest& request : requests) {
      if (request.status != 429) continue;
      EXPECT_EQ(request.retry_after, "1");
      if (!request.sent_t) continue;  // never written (the receiver was stopped): never seen
      ++verdict.retry_after_checked;
      const double answered = request.answered_t;
      const double sent = *request.sent_t;
      auto next = std::upper_bound(arrivals.begin(), arrivals.end(), answered,
                                   [](double t, const auto& arrival) { return t < arrival.first; });
      for (; next != arrivals.end() && next->first <= sent + kWireSlackSeconds; ++next) {
        verdict.latest_on_wire = std::max(verdict.latest_on_wire, next->first - sent);
      }
      if (next == arrivals.end()) continue;
      const double gap = next->first - answered;
      verdict.earliest_after_slack = std::min(verdict.earliest_after_slack.value_or(gap), gap);
      if (gap < kRetryAfterSeconds && ++early <= 5) {
        ADD_FAILURE() << "a request (receiver seq " << next->second->seq << ", "
                      << next->second->id.value_or("") << ") arrived "
                      << static_cast<int>(gap * 1000) << " ms after a 429 with Retry-After: 1 "
                      << "was decided, " << static_cast<int>((next->first - sent) * 1000)
                      << " ms after it was written (receiver seq " << request.seq << ")";
      }
    }

    EXPECT_EQ(refused, 0U) << "requests whose signature the receiver refused";
    EXPECT_EQ(unexpected, 0U) << "requests answered other than 200, 503 or 429";
    EXPECT_EQ(missing, 0U) << "committed messages never accepted";
    EXPECT_EQ(rolled_back, 0U) << "rolled-back messages sent";
    EXPECT_EQ(stray, 0U) << "messages that no writer enqueued";
    EXPECT_EQ(wrong_stream, 0U) << "messages with the wrong stream key";
    EXPECT_EQ(out_of_order, 0U) << "first acceptances out of stream order, in "
                                << streams_out_of_order.size() << " of "
                                << committed_per_stream_.size() << " streams";
    EXPECT_EQ(too_many_attempts, 0U) << "attempts spent that no refusal explains";
    EXPECT_EQ(early, 0U) << "requests that came while a Retry-After said to wait";
    EXPECT_EQ(firsts.size(), committed_per_stream_.size());
    EXPECT_GT(verdict.status_503, 0U);
    EXPECT_GT(verdict.status_429, 0U) << "no 429 at all: the Retry-After check saw nothing";
    return verdict;
  }

  void Print(const std::string& what, const Verdict& verdict, double elapsed) {
    std::printf(
        "[ e2e ] http, %s: %zu committed, %zu rolled back; %zu requests, %zu accepted (%zu "
        "duplicates), %zu answered 503, %zu answered 429 with Retry-After: 1; after each of %zu "
        "429s, requests already on the wire arrived up to %.0f ms after its answer was written "
        "(slack %.0f ms), the next one at least %.0f ms after it was decided (1000 required); "
        "highest outbox-attempts %zu; %.1f s\n",
        what.c_str(), committed_.size(), rolled_back_.size(), verdict.requests, verdict.accepted,
        verdict.duplicates, verdict.status_503, verdict.status_429, verdict.retry_after_checked,
        verdict.latest_on_wire * 1000, kWireSlackSeconds * 1000,
        verdict.earliest_after_slack.value_or(0) * 1000, verdict.max_attempts, elapsed);
    std::fflush(stdout);
  }

  TestSchema schema_;
  std::optional<WalSlot> slot_;  // WAL mode; dropped before the schema
  const std::string secret_ = NewSecret();
  const std::string dest_ = UniqueDestination("e2e");
  std::unique_ptr<WebhookReceiver> receiver_;
  std::string config_;
  std::mutex mutex_;
  std::map<std::string, Written> committed_;  // by id
  std::map<std::string, std::size_t> committed_per_stream_;
  std::set<std::string> rolled_back_;
  std::atomic<std::int64_t> committed_count_{0};
  std::atomic<bool> writing_{false};
};

TEST_F(WebhookE2eTest, EveryCommittedMessageAcceptedInOrderAndRetryAfterHonoured) {
  receiver_ = StartReceiver(0, kSeed);
  WriteConfig(/*max_attempts=*/10);
  const auto started = SteadyClock::now();
  auto relay = StartOutboxd();
  Write(Messages(), milliseconds{0});
  const double written = SecondsSince(started);
  EXPECT_TRUE(Drained(seconds{90})) << Rows() << " rows left\n" << LogTail();
  const double elapsed = SecondsSince(started);
  EXPECT_EQ(relay->Stop(), 0) << LogTail();
  ExpectNothingAbandoned();
  const Verdict verdict = Check(receiver_->Requests(dest_));
  std::printf("[ e2e ] http: the writers took %.1f s\n", written);
  Print("endpoint up", verdict, elapsed);
}

// WAL mode (issue #20): the messages travel in the WAL only; outboxd reads the schema's slot and
// sends through the same HTTP sink. A 503 or 429 rejects a message: the WAL relay parks it and its
// stream in the table, from where the table relay sends them after the retry delay (or the
// Retry-After); what the sink holds back for a host's Retry-After is parked beside it. The same
// record checks hold: every committed message accepted, first acceptances in stream_seq order,
// attempts explained by refusals, nothing early after a Retry-After.
TEST_F(WebhookE2eTest, WalModeEveryCommittedMessageAcceptedInOrderAndRetryAfterHonoured) {
  receiver_ = StartReceiver(0, kSeed);
  slot_.emplace(schema_.name());
  WriteConfig(/*max_attempts=*/10);
  const auto started = SteadyClock::now();
  auto relay = StartOutboxd();
  Write(std::min(Messages(), 10000), milliseconds{0});
  EXPECT_TRUE(Drained(seconds{90})) << Rows() << " rows left\n" << LogTail();
  const double elapsed = SecondsSince(started);
  EXPECT_EQ(relay->Stop(), 0) << LogTail();
  ExpectNothingAbandoned();
  const Verdict verdict = Check(receiver_->Requests(dest_));
  const std::string log = Log();
  std::size_t rejected_parked = 0;
  for (auto at = log.find("failed and is parked"); at != std::string::npos;
       at = log.find("failed and is parked", at + 1)) {
    ++rejected_parked;
  }
  std::printf("[ e2e ] http, WAL mode: %zu rejected messages parked by the WAL relay\n",
              rejected_parked);
  Print("WAL mode, endpoint up", verdict, elapsed);
}

TEST_F(WebhookE2eTest, EndpointDownForSecondsLosesNothingAndSpendsNoAttempt) {
  receiver_ = StartReceiver(0, kSeed);
  const int port = receiver_->port();
  WriteConfig(/*max_attempts=*/8);
  const auto started = SteadyClock::now();
  auto relay = StartOutboxd();
  std::thread writers([&] { Write(Messages(), OutageWritePace()); });
  struct Join {
    std::thread& thread;
    ~Join() {
      if (thread.joinable()) thread.join();
    }
  } join{writers};

  // Down once a tenth of the messages went through, while the writers write.
  const std::int64_t tenth = Messages() / 10;
  const bool progressed = WaitUntil([&] { return committed_count_.load() - Rows() >= tenth; },
                                    seconds{60}, milliseconds{100});
  EXPECT_TRUE(progressed) << "fewer than " << tenth << " published after 60 s\n" << LogTail();
  // The first receiver's record must be whole: from now on it leaves every request unanswered
  // (and unrecorded) until it is killed, so that nothing is accepted after the record was read;
  // a request whose answer was being decided meanwhile is recorded within a few ms.
  receiver_->CreateDestination(dest_, R"({"delay_ms": 600000})");
  std::this_thread::sleep_for(milliseconds{300});
  std::vector<ReceivedRequest> requests = receiver_->Requests(dest_);
  const bool writing_at_stop = writing_.load();
  receiver_->Stop();
  const auto down = SteadyClock::now();
  EXPECT_TRUE(writing_at_stop) << "the writers had finished before the endpoint went down";

  // Down for Outage() (a duration, not a wait for a state).
  std::this_thread::sleep_for(Outage() - milliseconds{500});
  const bool felt = Log().find("cannot be reached") != std::string::npos;
  // What the outage did to the messages it found: no attempt beyond the refusals recorded.
  std::map<std::string, std::size_t> refusals;
  for (const ReceivedRequest& request : requests) {
    if (Rejected(request)) ++refusals[request.id.value_or("")];
  }
  const PgResult spent = Sql(schema_.conn(), "SELECT id::text, attempts FROM " + schema_.name() +
                                                 ".messages WHERE attempts > 0");
  std::size_t spent_on_outage = 0;
  for (int row = 0; row < PQntuples(spent.get()); ++row) {
    const std::string id = PQgetvalue(spent.get(), row, 0);
    const auto attempts = std::stoull(PQgetvalue(spent.get(), row, 1));
    if (attempts > refusals[id] && ++spent_on_outage <= 5) {
      ADD_FAILURE() << "during the outage, " << id << " has " << attempts << " attempts after "
                    << refusals[id] << " refusals";
    }
  }
  const std::int64_t pending_at_restart = Rows();
  const std::int64_t abandoned_at_restart = Rows("status = 'abandoned'");
  std::this_thread::sleep_until(down + Outage());
  receiver_ = StartReceiver(port, kSeedAfterOutage);
  const double down_seconds = SecondsSince(down);

  writers.join();
  EXPECT_TRUE(Drained(seconds{75})) << Rows() << " rows left\n" << LogTail();
  const double elapsed = SecondsSince(started);
  EXPECT_EQ(relay->Stop(), 0) << LogTail();
  EXPECT_TRUE(felt) << "outboxd never found the endpoint unreachable\n" << LogTail();
  EXPECT_EQ(spent_on_outage, 0U) << "attempts spent on an unreachable endpoint";
  EXPECT_EQ(abandoned_at_restart, 0);
  ExpectNothingAbandoned();
  const std::size_t before = requests.size();
  std::vector<ReceivedRequest> after = receiver_->Requests(dest_);
  requests.insert(requests.end(), std::make_move_iterator(after.begin()),
                  std::make_move_iterator(after.end()));
  const Verdict verdict = Check(requests);
  std::printf(
      "[ e2e ] http: %zu requests to the first receiver, %zu to the second; down %.1f s with "
      "%lld messages in the outbox at the end of it\n",
      before, requests.size() - before, down_seconds, static_cast<long long>(pending_at_restart));
  Print("endpoint down " + std::to_string(Outage().count()) + " s", verdict, elapsed);
}

}  // namespace
}  // namespace outbox::testing
