// outboxd with two RabbitMQ sinks, end to end (issue #14): a target whose broker is down or
// refuses everything must not hold back the other target. Real PostgreSQL, real RabbitMQ, the
// real binary; the "dead" broker is a port where nothing listens, brought up later as a TCP proxy
// in front of the real broker.

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "support/amqp_test_client.h"
#include "support/child_process.h"
#include "support/free_port.h"
#include "support/pg_test_support.h"
#include "support/tcp_proxy.h"
#include "support/wait.h"
#include "support/wal_slot.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kPerTarget = 2000;
constexpr int kStreams = 20;

class TargetsE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    healthy_queue_ = "targets_ok_" + schema_.name();
    other_queue_ = "targets_other_" + schema_.name();
    DeclareQueue(healthy_queue_);
    config_path_ = "/tmp/outboxd-" + schema_.name() + ".toml";
  }
  void TearDown() override {
    DeleteQueue(healthy_queue_);
    DeleteQueue(other_queue_);
    std::remove(config_path_.c_str());
    std::remove((config_path_ + ".log").c_str());
  }

  // Sinks "default" (the real broker, to healthy_queue_) and "other" (at `other_url`, to
  // other_queue_).
  // `other_lines`: more keys for [sinks.other].
  void WriteConfig(const std::string& other_url, int max_attempts, bool wal_mode = false,
                   const std::string& other_lines = "") {
    std::ofstream out(config_path_);
    out << "[database]\nurl = \"" << PgUrl() << "\"\nschema = \"" << schema_.name() << "\"\n"
        << (wal_mode ? "mode = \"wal\"\n" : "")
        << "[relay]\ninstance = \"targets\"\nbatch_size = 500\nlease = \"10s\"\n"
        << "publish_timeout = \"3s\"\nsweep_interval = \"200ms\"\nmax_backoff = \"500ms\"\n"
        << "[retry]\ninitial_delay = \"50ms\"\nmax_delay = \"100ms\"\nmax_attempts = "
        << max_attempts << "\n"
        << "[sinks.default]\ntype = \"rabbitmq\"\nurl = \"" << AmqpUrl() << "\"\n"
        << "routing_key = \"" << healthy_queue_ << "\"\n"
        << "[sinks.other]\ntype = \"rabbitmq\"\nurl = \"" << other_url << "\"\n"
        << "routing_key = \"" << other_queue_ << "\"\n"
        << other_lines << "[http]\nlisten = \"\"\n";
  }

  // `other` messages for "other" first (the oldest, so that a claim by age alone would be full
  // of them), then kPerTarget for "default", each over kStreams streams of its own.
  void Enqueue(int other) {
    for (const auto& [target, count] : {std::pair{"other", other}, {"default", kPerTarget}}) {
      Sql(schema_.conn(), "SELECT " + schema_.name() +
                              ".enqueue('t', jsonb_build_object('n', g), " + "stream_key => '" +
                              target + "-' || (g % " + std::to_string(kStreams) + "), target => '" +
                              target + "') FROM generate_series(1, " + std::to_string(count) +
                              ") g");
    }
  }

  // The same messages in WAL mode (the schema delivers by WAL): transactions of 100, the two
  // targets' interleaved, each committed with synchronous_commit (logical decoding sees flushed
  // WAL only).
  void EnqueueWal() {
    for (int first = 0; first < kPerTarget; first += 100) {
      for (const std::string target : {"other", "default"}) {
        Sql(schema_.conn(), "BEGIN");
        Sql(schema_.conn(), "SET LOCAL synchronous_commit = on");
        Sql(schema_.conn(), "SELECT " + schema_.name() +
                                ".enqueue('t', jsonb_build_object('n', g), stream_key => '" +
                                target + "-' || (g % " + std::to_string(kStreams) +
                                "), target => '" + target + "') FROM generate_series(" +
                                std::to_string(first) + ", " + std::to_string(first + 99) + ") g");
        Sql(schema_.conn(), "COMMIT");
      }
    }
  }

  std::int64_t Count(const std::string& where) {
    return std::stoll(Scalar(
        schema_.conn(), "SELECT count(*) FROM " + schema_.name() + ".messages WHERE " + where));
  }

  std::string Log() {
    std::ifstream in(config_path_ + ".log");
    return {std::istreambuf_iterator<char>(in), {}};
  }

  // Every message once (at least), and the first deliveries of each stream in seq order.
  static void ExpectAllInStreamOrder(const Consumer& consumer, const std::string& label) {
    std::set<std::string> seen;
    std::map<std::string, std::int64_t> last;
    for (const auto& delivery : consumer.deliveries()) {
      if (!seen.insert(delivery.message_id).second) continue;
      auto& previous = last[delivery.stream_key];
      EXPECT_GT(delivery.stream_seq, previous) << label << ": stream " << delivery.stream_key;
      previous = delivery.stream_seq;
    }
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(kPerTarget)) << label;
    EXPECT_EQ(last.size(), static_cast<std::size_t>(kStreams)) << label;
  }

  TestSchema schema_;
  std::string healthy_queue_;
  std::string other_queue_;
  std::string config_path_;
};

TEST_F(TargetsE2eTest, ABrokerThatIsDownHoldsBackOnlyItsOwnTarget) {
  const int dead_port = FreePort();
  WriteConfig("amqp://guest:guest@127.0.0.1:" + std::to_string(dead_port) + "/", 3);
  Enqueue(kPerTarget);
  Consumer healthy(healthy_queue_);
  Outboxd relay(config_path_);
  // A few seconds on a quiet machine (2 s seen); the bound is for a loaded one.
  EXPECT_TRUE(WaitUntil([&] { return healthy.count() >= kPerTarget; }, seconds{30}))
      << healthy.count() << " of " << kPerTarget << " for the healthy target\n"
      << Log();
  // Confirmed by the broker before it is recorded: the last batch's rows go a moment later.
  EXPECT_TRUE(WaitUntil([&] { return Count("target = 'default'") == 0; }, seconds{10}))
      << Count("target = 'default'") << " published rows not deleted";
  // The dead target's messages wait: none spent an attempt or was given up.
  EXPECT_EQ(Count("target = 'other'"), kPerTarget);
  EXPECT_EQ(Count("target = 'other' AND (attempts > 0 OR status IN ('failed', 'abandoned'))"), 0);
  EXPECT_NE(Log().find("sink 'other' is unavailable"), std::string::npos) << Log();

  // The broker comes up: its messages go out, in stream order.
  DeclareQueue(other_queue_);
  Consumer other(other_queue_);
  TcpProxy broker("127.0.0.1", 5672, dead_port);
  EXPECT_TRUE(WaitUntil([&] { return Count("target = 'other'") == 0; }, seconds{30}))
      << Count("target = 'other'") << " still in the outbox\n"
      << Log();
  EXPECT_TRUE(WaitUntil([&] { return other.count() >= kPerTarget; }, seconds{10}));
  EXPECT_EQ(relay.Stop(SIGTERM, seconds{30}), 0) << Log();
  healthy.Stop();
  other.Stop();
  ExpectAllInStreamOrder(healthy, "healthy");
  ExpectAllInStreamOrder(other, "other");
  EXPECT_NE(Log().find("sink 'other' is available again"), std::string::npos) << Log();
}

TEST_F(TargetsE2eTest, ABrokerThatRefusesEverythingHoldsBackOnlyItsOwnTarget) {
  // A queue that takes nothing: every publish to it is nacked (rejected).
  DeclareQueue(other_queue_, {{"x-overflow", "reject-publish"}}, {{"x-max-length", 0}});
  WriteConfig(AmqpUrl(), 3);
  // Fewer: a stream's refused messages are retried one after another (head of line), 3 times each.
  constexpr int kRefused = 200;
  Enqueue(kRefused);
  Consumer healthy(healthy_queue_);
  Outboxd relay(config_path_);
  EXPECT_TRUE(WaitUntil([&] { return healthy.count() >= kPerTarget; }, seconds{30}))
      << healthy.count() << " of " << kPerTarget << " for the healthy target\n"
      << Log();
  // The refused ones follow the usual rules: retried, then abandoned after 3 attempts.
  EXPECT_TRUE(WaitUntil([&] { return Count("status = 'abandoned'") == kRefused; }, seconds{60}))
      << Count("status = 'abandoned'") << " abandoned\n"
      << Log();
  EXPECT_EQ(relay.Stop(SIGTERM, seconds{30}), 0) << Log();
  healthy.Stop();
  ExpectAllInStreamOrder(healthy, "healthy");
  EXPECT_EQ(Count("target = 'other' AND status = 'abandoned' AND attempts = 3"), kRefused);
  EXPECT_EQ(Count("target = 'other' AND last_error NOT LIKE 'rejected%'"), 0)
      << Scalar(schema_.conn(), "SELECT min(last_error) FROM " + schema_.name() + ".messages");
  EXPECT_EQ(ReadyMessages(other_queue_).value_or(1), 0U);
  EXPECT_EQ(Log().find("is unavailable"), std::string::npos) << "a refusal is no outage";
}

// Issue #43: [sinks.other] max_rate = 200. Its messages reach its queue at 200/s (in bursts of
// about 180) while the healthy target's drain at full speed, though the limited target's
// backlog is the older one. 3 s of bursts measured (OUTBOX_MAX_RATE_SECONDS for more).
TEST_F(TargetsE2eTest, ATargetWithAMaxRateIsSentAtThatRateWhileTheOtherDrains) {
  const char* seconds_env = std::getenv("OUTBOX_MAX_RATE_SECONDS");
  const int window = seconds_env != nullptr ? std::stoi(seconds_env) : 3;
  constexpr int kRate = 200;
  DeclareQueue(other_queue_);
  WriteConfig(AmqpUrl(), 3, /*wal_mode=*/false, "max_rate = " + std::to_string(kRate) + "\n");
  const int limited = kRate * (window + 4);
  Enqueue(limited);
  std::mutex mutex;
  std::vector<std::chrono::steady_clock::time_point> arrivals;  // of the limited target's
  std::map<std::string, std::int64_t> last_seq;                 // its streams'
  std::size_t out_of_order = 0;
  Consumer other(other_queue_, [&](Delivery&& delivery) {
    std::lock_guard lock(mutex);
    arrivals.push_back(std::chrono::steady_clock::now());
    auto& last = last_seq[delivery.stream_key];
    if (delivery.stream_seq <= last) ++out_of_order;
    last = delivery.stream_seq;
  });
  Consumer healthy(healthy_queue_);
  const auto started = std::chrono::steady_clock::now();
  Outboxd relay(config_path_);
  EXPECT_TRUE(WaitUntil([&] { return healthy.count() >= kPerTarget; }, seconds{30}))
      << healthy.count() << " of " << kPerTarget << " for the healthy target\n"
      << Log();
  const double healthy_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const std::size_t limited_then = other.count();
  // The bursts: arrivals more than 300 ms after the one before start one.
  ASSERT_TRUE(WaitUntil([&] { return other.count() > 0; }, seconds{10})) << Log();
  std::this_thread::sleep_for(milliseconds{1000 * window + 1500});
  EXPECT_EQ(relay.Stop(SIGTERM, seconds{30}), 0) << Log();
  other.Stop();
  healthy.Stop();
  std::vector<std::size_t> burst_starts;  // indexes into arrivals
  for (std::size_t i = 0; i < arrivals.size(); ++i) {
    if (i == 0 || arrivals[i] - arrivals[i - 1] > milliseconds{300}) burst_starts.push_back(i);
  }
  ASSERT_GE(burst_starts.size(), 4U) << arrivals.size() << " arrivals";
  // From the second burst (the first is the full bucket) to the start of the last one.
  const std::size_t first = burst_starts[1];
  const std::size_t last = burst_starts.back();
  const double seconds_between =
      std::chrono::duration<double>(arrivals[last] - arrivals[first]).count();
  const double rate = static_cast<double>(last - first) / seconds_between;
  std::printf(
      "[ e2e ] max_rate %d: %.1f msgs/s over %.1f s (%zu bursts, the first of %zu, then about "
      "%zu); the healthy "
      "target's %d drained in %.2f s, %zu of the limited target's sent by then\n",
      kRate, rate, seconds_between, burst_starts.size(), burst_starts[1] - burst_starts[0],
      burst_starts[2] - burst_starts[1], kPerTarget, healthy_seconds, limited_then);
  EXPECT_GT(rate, kRate * 0.9);
  EXPECT_LT(rate, kRate * 1.1);
  // Waiting for the limited target would have taken (window + 4) s.
  EXPECT_LT(limited_then, static_cast<std::size_t>(limited / 2))
      << "the healthy target drained only as the limited one did";
  EXPECT_EQ(Count("attempts > 0"), 0) << "throttling spends no attempt";
  EXPECT_EQ(out_of_order, 0U) << "the limited target's streams were reordered";
  EXPECT_EQ(last_seq.size(), static_cast<std::size_t>(kStreams));
  ExpectAllInStreamOrder(healthy, "healthy");
}

// Issue #41: the same outage in WAL mode, the messages in the WAL only. The healthy target's
// messages keep flowing from the slot; the down target's are parked in the table (unattempted)
// while its lane is paused, and published by the table relay, in stream order, once its broker
// is up. Before, 0 of 2,000 reached the healthy target: the slot waited for the down one.
TEST_F(TargetsE2eTest, ABrokerThatIsDownHoldsBackOnlyItsOwnTargetInWalMode) {
  const WalSlot slot(schema_.name());
  const int dead_port = FreePort();
  WriteConfig("amqp://guest:guest@127.0.0.1:" + std::to_string(dead_port) + "/", 3,
              /*wal_mode=*/true);
  Consumer healthy(healthy_queue_);
  Outboxd relay(config_path_);
  EnqueueWal();
  EXPECT_TRUE(WaitUntil([&] { return healthy.count() >= kPerTarget; }, seconds{30}))
      << healthy.count() << " of " << kPerTarget << " for the healthy target\n"
      << Log();
  EXPECT_TRUE(WaitUntil([&] { return Count("target = 'other'") == kPerTarget; }, seconds{30}))
      << Count("target = 'other'") << " of the down target's messages parked\n"
      << Log();
  EXPECT_EQ(Count("target = 'default'"), 0) << "the healthy target's messages stay in the WAL";
  EXPECT_EQ(Count("target = 'other' AND (attempts > 0 OR status IN ('failed', 'abandoned'))"), 0);
  EXPECT_NE(Log().find("sink 'other' is unavailable"), std::string::npos) << Log();

  DeclareQueue(other_queue_);
  Consumer other(other_queue_);
  TcpProxy broker("127.0.0.1", 5672, dead_port);
  EXPECT_TRUE(WaitUntil([&] { return Count("target = 'other'") == 0; }, seconds{30}))
      << Count("target = 'other'") << " still in the outbox\n"
      << Log();
  EXPECT_TRUE(WaitUntil([&] { return other.count() >= kPerTarget; }, seconds{10}));
  EXPECT_EQ(relay.Stop(SIGTERM, seconds{30}), 0) << Log();
  healthy.Stop();
  other.Stop();
  ExpectAllInStreamOrder(healthy, "healthy");
  ExpectAllInStreamOrder(other, "other");
}

}  // namespace
}  // namespace outbox::testing
