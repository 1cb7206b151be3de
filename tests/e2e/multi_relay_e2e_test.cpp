// Several outboxd relays on one database, end to end (issue #5): real PostgreSQL, real RabbitMQ,
// real outboxd processes and an independent consumer that records every delivery. The relays
// divide the partitions by leases (table partition_leases): three relays share 100,000 messages
// fairly, without duplicates and in per-stream order; a relay that joins or leaves cleanly makes
// the ownership converge to the new fair share; the partitions of a relay killed with SIGKILL are
// taken over when its lease expires; a relay frozen with SIGSTOP is fenced (its claimed messages
// are reset, its late completions rejected), holds no locks while frozen, and rejoins when it
// wakes. Nothing committed may be lost, first deliveries must keep each stream's order, and
// duplicates are bounded by what one relay can have claimed (two pipelined batches).
//
// Each outboxd runs as `/usr/bin/env PGAPPNAME=<name> outboxd --config ...`, so that
// pg_stat_activity and pg_locks tell its backends apart.

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "frozen_relay.h"
#include "support/amqp_test_client.h"
#include "support/child_process.h"
#include "support/free_port.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

// The relays' settings. publish_timeout must stay below lease / 2.
constexpr int kBatchSize = 200;
constexpr milliseconds kLease{3000};
constexpr milliseconds kSweep{200};
// Added to every time bound: PostgreSQL, RabbitMQ, three relays, the writers and the consumer
// share a 2-core machine (with other work on it), so a relay's timer may fire late and our polls
// (every 20-50 ms) see a change late.
constexpr milliseconds kMargin{1000};
// "Converges within two lease periods after a join or a leave."
constexpr milliseconds kConverge = 2 * kLease + kMargin;
// "Partitions of a dead relay are taken over within lease + one sweep."
constexpr milliseconds kTakeover = kLease + kSweep + kMargin;
// Claims are pipelined: one relay holds at most two batches at a time.
constexpr std::size_t kMaxClaimed = 2 * kBatchSize;
constexpr int kWriters = 4;
constexpr char kToken[] = "multi-relay-e2e-token";

double Secs(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

// The value of the sample `series` in Prometheus text; -1 when absent.
double Sample(const std::string& metrics, const std::string& series) {
  const std::size_t at = metrics.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(metrics.substr(at + series.size() + 2));
}

std::int64_t Int(PGconn* conn, const std::string& sql) { return std::stoll(Scalar(conn, sql)); }

// The fair share of `live` relays, in owner order: the first (partitions mod live) get one more.
std::vector<int> FairShare(int partitions, int live) {
  std::vector<int> shares;
  for (int i = 0; i < live; ++i) shares.push_back(partitions / live + (i < partitions % live));
  return shares;
}

// One outboxd with a configuration, an HTTP port and a PostgreSQL application_name of its own.
class Relay {
 public:
  Relay(const std::string& instance, const std::string& schema)
      : instance_(instance),
        app_name_("multi_" + schema + "_" + instance),
        config_("/tmp/outboxd-multi-" + schema + "-" + instance + ".toml"),
        port_(FreePort()) {
    std::ofstream out(config_);
    out << "[database]\nurl = \"" << PgUrl() << "\"\nschema = \"" << schema << "\"\n"
        << "[relay]\ninstance = \"" << instance << "\"\nbatch_size = " << kBatchSize << "\n"
        << "lease = \"" << kLease.count() << "ms\"\nsweep_interval = \"" << kSweep.count()
        << "ms\"\npublish_timeout = \"1400ms\"\nshutdown_timeout = \"2s\"\n"
        << "min_backoff = \"50ms\"\nmax_backoff = \"500ms\"\n"
        << "[retry]\ninitial_delay = \"100ms\"\nmax_delay = \"200ms\"\n"
        << "[http]\nlisten = \"127.0.0.1:" << port_ << "\"\ntoken = \"" << kToken << "\"\n"
        << "stats_interval = \"1s\"\nready_max_age = \"5s\"\n"
        << "[sinks.default]\ntype = \"rabbitmq\"\nurl = \"" << AmqpUrl() << "\"\n"
        << "routing_key = \"{topic}\"\n";
    out.close();
    process_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{"/usr/bin/env", "PGAPPNAME=" + app_name_, OUTBOXD_PATH, "--config",
                                 config_},
        config_ + ".log", Ready::Notify());
  }
  ~Relay() {
    process_.reset();  // SIGKILL if still running
    if (!keep_files_) {
      std::remove(config_.c_str());
      std::remove((config_ + ".log").c_str());
    }
  }
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  const std::string& instance() const { return instance_; }
  const std::string& app_name() const { return app_name_; }
  const std::string& config() const { return config_; }
  ChildProcess& process() { return *process_; }
  void KeepFiles() { keep_files_ = true; }

  // GET /metrics; "" when it does not answer.
  std::string Metrics() const {
    httplib::Client client("127.0.0.1", port_);
    client.set_connection_timeout(2, 0);
    client.set_read_timeout(5, 0);
    auto reply = client.Get("/metrics", {{"Authorization", std::string{"Bearer "} + kToken}});
    return reply && reply->status == 200 ? reply->body : "";
  }
  double Metric(const std::string& series) const { return Sample(Metrics(), series); }

  // The last `lines` lines of its log.
  std::string LogTail(std::size_t lines = 30) const {
    std::ifstream in(config_ + ".log");
    std::vector<std::string> all;
    for (std::string line; std::getline(in, line);) all.push_back(line);
    std::string tail;
    for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
      tail += "    " + all[i] + "\n";
    }
    return "  " + config_ + ".log:\n" + tail;
  }

 private:
  std::string instance_;
  std::string app_name_;
  std::string config_;
  int port_;
  bool keep_files_ = false;
  std::unique_ptr<ChildProcess> process_;
};

// kWriters threads committing transactions of `per_transaction` messages (one enqueue_batch call
// each) until `total` messages are committed or Stop(). Writer w writes only the streams s<k>
// with k mod kWriters = w, so writers never wait for each other's stream counters.
class Writers {
 public:
  Writers(const std::string& schema, const std::string& topic, int streams, std::int64_t total,
          int per_transaction, milliseconds pause)
      : schema_(schema),
        topic_(topic),
        streams_(streams),
        total_(total),
        per_transaction_(per_transaction),
        pause_(pause),
        started_(Clock::now()) {
    for (int w = 0; w < kWriters; ++w) threads_.emplace_back([this, w] { Loop(w); });
  }
  ~Writers() { Stop(); }
  Writers(const Writers&) = delete;
  Writers& operator=(const Writers&) = delete;

  void Stop() {
    stop_ = true;
    Join();
  }
  void Join() {
    for (auto& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
    if (!finished_) finished_ = Clock::now();
  }
  double seconds() const { return Secs(finished_.value_or(Clock::now()) - started_); }
  std::size_t count() const {
    std::lock_guard lock(mutex_);
    return committed_.size();
  }
  std::set<std::string> committed() const {
    std::lock_guard lock(mutex_);
    return committed_;
  }
  std::string error() const {
    std::lock_guard lock(mutex_);
    return error_;
  }

 private:
  void Loop(int w) {
    try {
      auto conn = Connect();
      std::mt19937 random(static_cast<unsigned>(w) + 1);
      const std::string sql = "SELECT id FROM " + schema_ + ".enqueue_batch($1::jsonb)";
      for (std::int64_t first = next_.fetch_add(per_transaction_); first < total_ && !stop_;
           first = next_.fetch_add(per_transaction_)) {
        const std::int64_t last = std::min(total_, first + per_transaction_);
        std::string batch = "[";
        for (std::int64_t n = first; n < last; ++n) {
          const int stream =
              w +
              kWriters * static_cast<int>(random() % static_cast<unsigned>(streams_ / kWriters));
          batch += (n == first ? "" : ",") + std::string{"{\"topic\":\""} + topic_ +
                   "\",\"stream_key\":\"s" + std::to_string(stream) +
                   "\",\"payload\":{\"n\":" + std::to_string(n) + "}}";
        }
        batch += "]";
        Sql(conn.get(), "BEGIN");
        const char* values[] = {batch.c_str()};
        PgResult result{
            PQexecParams(conn.get(), sql.c_str(), 1, nullptr, values, nullptr, nullptr, 0)};
        if (PQresultStatus(result.get()) != PGRES_TUPLES_OK) {
          throw std::runtime_error(std::string{"enqueue_batch: "} + PQerrorMessage(conn.get()));
        }
        std::vector<std::string> ids;
        for (int row = 0; row < PQntuples(result.get()); ++row) {
          ids.emplace_back(PQgetvalue(result.get(), row, 0));
        }
        Sql(conn.get(), "COMMIT");
        {
          std::lock_guard lock(mutex_);
          committed_.insert(ids.begin(), ids.end());
        }
        if (pause_.count() > 0) std::this_thread::sleep_for(pause_);
      }
    } catch (const std::exception& error) {
      std::lock_guard lock(mutex_);
      error_ += std::string{error.what()} + "\n";
    }
  }

  std::string schema_;
  std::string topic_;
  int streams_;
  std::int64_t total_;
  int per_transaction_;
  milliseconds pause_;
  Clock::time_point started_;
  std::optional<Clock::time_point> finished_;
  std::atomic<std::int64_t> next_{0};
  std::atomic<bool> stop_{false};
  mutable std::mutex mutex_;
  std::set<std::string> committed_;
  std::string error_;
  std::vector<std::thread> threads_;
};

// What the consumer received, compared with what was committed.
struct Outcome {
  std::size_t committed = 0;
  std::size_t deliveries = 0;
  std::size_t duplicates = 0;
  std::size_t missing = 0;       // committed, never delivered
  std::size_t phantom = 0;       // delivered, never committed
  std::size_t out_of_order = 0;  // first deliveries of a stream not in stream_seq order
  std::size_t streams = 0;
  std::string examples;  // a few of the problems, for the failure message
};

class MultiRelayE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("OUTBOX_HTTP_TOKEN");  // it would win over the token in the configurations
    queue_ = "multi_" + schema_.name();
    DeclareQueue(queue_);
    partitions_ = static_cast<int>(
        Int(schema_.conn(), "SELECT partition_count FROM " + schema_.name() + ".settings"));
  }
  void TearDown() override {
    if (HasFailure()) {
      for (auto& relay : relays_) relay->KeepFiles();
    }
    relays_.clear();
    DeleteQueue(queue_);
  }

  Relay& Start(const std::string& instance) {
    relays_.push_back(std::make_unique<Relay>(instance, schema_.name()));
    return *relays_.back();
  }

  std::string Logs() const {
    std::string logs = "relay logs (kept):\n";
    for (const auto& relay : relays_) logs += relay->LogTail();
    return logs;
  }

  // relay-a, relay-b and relay-c (relays_[0..2]) at their fair shares, `writers` running
  // (`per_transaction` messages over 1,000 streams every `pause`) and `warm` messages delivered,
  // so that a relay has work in hand when it is killed or frozen.
  void StartThreeUnderLoad(Consumer& consumer, std::optional<Writers>& writers, int per_transaction,
                           milliseconds pause, std::size_t warm) {
    const auto started = Clock::now();
    const Relay& a = Start("relay-a");
    const Relay& b = Start("relay-b");
    const Relay& c = Start("relay-c");
    ASSERT_TRUE(WaitForFair({&a, &b, &c}, started, kConverge)) << OwnershipText() << "\n" << Logs();
    writers.emplace(schema_.name(), queue_, 1000, 10'000'000, per_transaction, pause);
    for (const auto until = Clock::now() + seconds{60};
         consumer.count() < warm && Clock::now() < until;) {
      std::this_thread::sleep_for(milliseconds{50});
    }
    ASSERT_GE(consumer.count(), warm) << Logs();
  }

  // Polls until every relay's outbox_published_total exceeds its value in `before` (same order;
  // and 0); false after `limit`. How a test knows that relays are publishing, instead of sleeping.
  bool WaitForPublishing(const std::vector<const Relay*>& relays, const std::vector<double>& before,
                         milliseconds limit, std::string* report) {
    const auto until = Clock::now() + limit;
    while (true) {
      bool all = true;
      report->clear();
      for (std::size_t i = 0; i < relays.size(); ++i) {
        const double published = relays[i]->Metric("outbox_published_total");
        *report += relays[i]->instance() + ": published " + std::to_string(published) +
                   " (before " + std::to_string(before[i]) + "); ";
        all = all && published > std::max(before[i], 0.0);  // -1: it did not answer then
      }
      if (all || Clock::now() > until) return all;
      std::this_thread::sleep_for(milliseconds{50});
    }
  }
  std::vector<double> Published(const std::vector<const Relay*>& relays) {
    std::vector<double> published;
    for (const Relay* relay : relays) published.push_back(relay->Metric("outbox_published_total"));
    return published;
  }

  // Freezes `relay` (SIGSTOP) holding claimed messages: see FreezeHoldingAClaim.
  Freeze FreezeWithAClaim(Relay& relay) {
    return FreezeHoldingAClaim(relay.process(), schema_.conn(), relay.app_name(),
                               [&] { return Processing(relay); });
  }

  std::int64_t Count(const std::string& where) {
    return Int(schema_.conn(),
               "SELECT count(*) FROM " + schema_.name() + ".messages WHERE " + where);
  }
  std::int64_t Processing(const Relay& relay) {
    return Count("status = 'processing' AND lease_owner LIKE '" + relay.instance() + "/%'");
  }

  // Live partition leases per owner, in owner order.
  std::vector<std::pair<std::string, int>> Ownership() {
    auto result = Sql(schema_.conn(), "SELECT owner, count(*) FROM " + schema_.name() +
                                          ".partition_leases WHERE owner IS NOT NULL AND "
                                          "lease_until > now() GROUP BY owner ORDER BY owner "
                                          "COLLATE \"C\"");
    std::vector<std::pair<std::string, int>> owners;
    for (int row = 0; row < PQntuples(result.get()); ++row) {
      owners.emplace_back(PQgetvalue(result.get(), row, 0),
                          std::atoi(PQgetvalue(result.get(), row, 1)));
    }
    return owners;
  }
  std::string OwnershipText() {
    std::string text;
    int owned = 0;
    for (const auto& [owner, count] : Ownership()) {
      text += owner + "=" + std::to_string(count) + " ";
      owned += count;
    }
    return text + "(" + std::to_string(owned) + " of " + std::to_string(partitions_) +
           " partitions under a live lease)";
  }
  // The partitions whose live lease `relay` holds.
  int Owned(const Relay& relay) {
    return static_cast<int>(Int(schema_.conn(), "SELECT count(*) FROM " + schema_.name() +
                                                    ".partition_leases WHERE owner LIKE '" +
                                                    relay.instance() +
                                                    "/%' AND lease_until > now()"));
  }

  // True when exactly `relays` hold live leases, one owner each, in the fair share.
  bool IsFair(const std::vector<const Relay*>& relays) {
    std::vector<std::string> instances;
    for (const Relay* relay : relays) instances.push_back(relay->instance());
    std::sort(instances.begin(), instances.end());
    const auto owners = Ownership();
    if (owners.size() != instances.size()) return false;
    const auto shares = FairShare(partitions_, static_cast<int>(instances.size()));
    for (std::size_t i = 0; i < owners.size(); ++i) {
      if (owners[i].first.rfind(instances[i] + "/", 0) != 0 || owners[i].second != shares[i]) {
        return false;
      }
    }
    return true;
  }

  // Polls (every 20 ms) until IsFair(relays); the time from `since`, or nullopt after `limit`.
  std::optional<Clock::duration> WaitForFair(const std::vector<const Relay*>& relays,
                                             Clock::time_point since, milliseconds limit) {
    while (Clock::now() - since < limit) {
      if (IsFair(relays)) return Clock::now() - since;
      std::this_thread::sleep_for(milliseconds{20});
    }
    return std::nullopt;
  }

  // Polls until every relay's gauges agree with the database: outbox_relay_partitions_owned with
  // its live leases, outbox_relay_live_instances with the number of relays. At most a lease (the
  // gauges follow the heartbeat, every lease / 3) plus the margin.
  bool WaitForGauges(const std::vector<const Relay*>& relays, std::string* report) {
    const auto until = Clock::now() + kLease + kMargin;
    while (true) {
      bool agree = true;
      report->clear();
      for (const Relay* relay : relays) {
        const std::string metrics = relay->Metrics();
        const double owned = Sample(metrics, "outbox_relay_partitions_owned");
        const double live = Sample(metrics, "outbox_relay_live_instances");
        const int database = Owned(*relay);
        *report += relay->instance() + ": partitions_owned " + std::to_string(owned) +
                   " (database " + std::to_string(database) + "), live_instances " +
                   std::to_string(live) + "; ";
        agree = agree && owned == database && live == static_cast<double>(relays.size());
      }
      if (agree || Clock::now() > until) return agree;
      std::this_thread::sleep_for(milliseconds{100});
    }
  }

  // Waits (bounded) until the consumer has received every id `writers` committed.
  bool WaitForAll(const Consumer& consumer, const Writers& writers, seconds limit) {
    const std::size_t expected = writers.count();
    const auto until = Clock::now() + limit;
    while (Clock::now() < until) {
      if (consumer.count() >= expected) {
        std::set<std::string> seen;
        for (const auto& delivery : consumer.deliveries()) seen.insert(delivery.message_id);
        if (seen.size() >= expected) return true;
      }
      std::this_thread::sleep_for(milliseconds{200});
    }
    return false;
  }

  // Compares what the consumer received with what was committed.
  Outcome Check(const Consumer& consumer, const Writers& writers) {
    Outcome outcome;
    const std::set<std::string> committed = writers.committed();
    const auto deliveries = consumer.deliveries();
    outcome.committed = committed.size();
    outcome.deliveries = deliveries.size();
    std::set<std::string> first_seen;
    std::map<std::string, std::int64_t> last_first_seq;
    for (const auto& delivery : deliveries) {
      if (!first_seen.insert(delivery.message_id).second) {
        ++outcome.duplicates;
        continue;
      }
      if (!committed.contains(delivery.message_id)) {
        if (++outcome.phantom <= 3) outcome.examples += "phantom " + delivery.message_id + "\n";
      }
      auto& last = last_first_seq[delivery.stream_key];
      if (delivery.stream_seq <= last) {
        if (++outcome.out_of_order <= 5) {
          outcome.examples += "stream " + delivery.stream_key + ": first delivery of seq " +
                              std::to_string(delivery.stream_seq) + " after seq " +
                              std::to_string(last) + "\n";
        }
      }
      last = std::max(last, delivery.stream_seq);
    }
    outcome.streams = last_first_seq.size();
    for (const auto& id : committed) {
      if (first_seen.contains(id)) continue;
      if (++outcome.missing <= 5) {
        auto row = Sql(schema_.conn(),
                       "SELECT status || ' owner ' || coalesce(lease_owner, '-') "
                       "|| ' partition ' || partition FROM " +
                           schema_.name() + ".messages WHERE id = '" + id + "'");
        outcome.examples += "missing " + id + ": " +
                            (PQntuples(row.get()) == 1 ? PQgetvalue(row.get(), 0, 0) : "no row") +
                            "\n";
      }
    }
    return outcome;
  }

  // The checks every test makes at the end; prints the numbers.
  void ExpectDelivered(const Outcome& outcome, const std::string& test) {
    EXPECT_EQ(outcome.missing, 0U) << outcome.examples;
    EXPECT_EQ(outcome.phantom, 0U) << outcome.examples;
    EXPECT_EQ(outcome.out_of_order, 0U) << outcome.examples;
    EXPECT_EQ(Count("true"), 0) << "messages left in the outbox (all should be published and "
                                   "deleted): "
                                << Count("status = 'pending'") << " pending, "
                                << Count("status = 'processing'") << " processing, "
                                << Count("status = 'failed'") << " failed, "
                                << Count("status = 'abandoned'") << " abandoned";
    std::printf(
        "[ multi ] %s: %zu committed, %zu deliveries, %zu duplicates, %zu missing, %zu phantom, "
        "%zu first deliveries out of order (%zu streams)\n",
        test.c_str(), outcome.committed, outcome.deliveries, outcome.duplicates, outcome.missing,
        outcome.phantom, outcome.out_of_order, outcome.streams);
    std::fflush(stdout);
  }

  TestSchema schema_;
  std::string queue_;
  int partitions_ = 0;
  std::vector<std::unique_ptr<Relay>> relays_;  // destroyed (killed) before the schema is dropped
};

TEST_F(MultiRelayE2eTest, ThreeRelaysShareAHundredThousandMessagesFairlyInOrder) {
  Consumer consumer(queue_);
  const auto started = Clock::now();
  Relay& a = Start("relay-a");
  Relay& b = Start("relay-b");
  Relay& c = Start("relay-c");
  const std::vector<const Relay*> all{&a, &b, &c};
  const auto converged = WaitForFair(all, started, kConverge);
  ASSERT_TRUE(converged) << "not the fair share of 3 " << Secs(kConverge)
                         << " s after the start: " << OwnershipText() << "\n"
                         << Logs();
  std::printf("[ multi ] 3 relays started: fair share %s after %.2f s\n", OwnershipText().c_str(),
              Secs(*converged));

  // 100,000 messages over 1,000 streams from 4 writers, 100 per transaction, while they relay.
  constexpr std::int64_t kTotal = 100000;
  Writers writers(schema_.name(), queue_, 1000, kTotal, 100, milliseconds{0});
  writers.Join();
  ASSERT_EQ(writers.error(), "");
  ASSERT_EQ(writers.count(), static_cast<std::size_t>(kTotal));
  std::printf("[ multi ] wrote %lld messages in %.1f s (%.0f/s)\n", static_cast<long long>(kTotal),
              writers.seconds(), static_cast<double>(kTotal) / writers.seconds());
  const bool all_delivered = WaitForAll(consumer, writers, seconds{150});
  const double delivered_after = Secs(Clock::now() - started);
  EXPECT_TRUE(all_delivered) << consumer.count() << " of " << kTotal << " delivered\n" << Logs();

  // Who published what, and who owns what at the end.
  EXPECT_TRUE(IsFair(all)) << OwnershipText();
  std::string gauges;
  EXPECT_TRUE(WaitForGauges(all, &gauges)) << gauges;
  // The consumer can see a message before its relay has recorded it (the counter follows the
  // completion): wait, bounded, until every completion is in and the counters have caught up.
  const auto settled_by = Clock::now() + seconds{10};
  const auto published_sum_now = [&] {
    double sum = 0;
    for (const Relay* relay : all) sum += Sample(relay->Metrics(), "outbox_published_total");
    return sum;
  };
  while (Clock::now() < settled_by && (Count("status IN ('pending', 'processing', 'failed')") > 0 ||
                                       published_sum_now() < static_cast<double>(kTotal))) {
    std::this_thread::sleep_for(milliseconds{100});
  }
  double published_sum = 0;
  for (const Relay* relay : all) {
    const std::string metrics = relay->Metrics();
    const double published = Sample(metrics, "outbox_published_total");
    const double lease_lost = Sample(metrics, "outbox_relay_lease_lost_total");
    published_sum += published;
    std::printf(
        "[ multi ] %s: published %.0f (%.1f %%), owns %d partitions, lease_lost %.0f, "
        "rebalances %.0f, takeovers %.0f\n",
        relay->instance().c_str(), published, 100.0 * published / kTotal, Owned(*relay), lease_lost,
        Sample(metrics, "outbox_relay_rebalances_total"),
        Sample(metrics, "outbox_relay_takeovers_total"));
    EXPECT_GE(published, 0.2 * kTotal) << relay->instance() << " published less than 20 %";
    EXPECT_EQ(lease_lost, 0) << relay->instance()
                             << ": no fault, yet its leases were lost (completions rejected)";
  }
  // No fault, no duplicate: every message was published once, by one of them.
  EXPECT_EQ(published_sum, static_cast<double>(kTotal));
  std::printf("[ multi ] %s; all delivered %.1f s after the start\n", OwnershipText().c_str(),
              delivered_after);

  for (Relay* relay : {&a, &b, &c}) EXPECT_EQ(relay->process().Stop(), 0) << relay->LogTail();
  consumer.Stop();
  const Outcome outcome = Check(consumer, writers);
  ExpectDelivered(outcome, "3 relays, 100k messages");
  EXPECT_EQ(outcome.duplicates, 0U) << "no fault was injected\n" << Logs();
}

TEST_F(MultiRelayE2eTest, ARelayJoiningAndOneLeavingCleanlyRebalanceToTheFairShare) {
  Consumer consumer(queue_);
  const auto started = Clock::now();
  Relay& a = Start("relay-a");
  Relay& b = Start("relay-b");
  const auto two = WaitForFair({&a, &b}, started, kConverge);
  ASSERT_TRUE(two) << OwnershipText() << "\n" << Logs();
  std::printf("[ multi ] 2 relays started: %s after %.2f s\n", OwnershipText().c_str(), Secs(*two));

  // Writing continuously: 4 writers, 50 messages per transaction, a pause of 50 ms after each;
  // the join comes once both relays are publishing.
  Writers writers(schema_.name(), queue_, 1000, 10'000'000, 50, milliseconds{50});
  std::string publishing;
  ASSERT_TRUE(WaitForPublishing({&a, &b}, {0, 0}, seconds{30}, &publishing)) << publishing << "\n"
                                                                             << Logs();

  // A third joins: the fair share of 3 (22/21/21 of 64) within two lease periods.
  const auto joined_at = Clock::now();
  Relay& c = Start("relay-c");
  const auto three = WaitForFair({&a, &b, &c}, joined_at, kConverge);
  EXPECT_TRUE(three) << "not the fair share of 3 " << Secs(kConverge)
                     << " s after relay-c started: " << OwnershipText() << "\n"
                     << Logs();
  if (three) {
    std::printf("[ multi ] join: relay-c started, %s after %.2f s\n", OwnershipText().c_str(),
                Secs(*three));
  }
  std::string gauges;
  EXPECT_TRUE(WaitForGauges({&a, &b, &c}, &gauges)) << gauges;
  // All three publish at the new share before relay-b leaves.
  EXPECT_TRUE(WaitForPublishing({&a, &b, &c}, Published({&a, &b, &c}), kConverge, &publishing))
      << publishing << "\n"
      << Logs();
  const double b_published = b.Metric("outbox_published_total");
  EXPECT_GT(b_published, 0) << b.LogTail();

  // relay-b leaves with SIGTERM while it holds a claim (the SIGTERM is sent while it is frozen
  // with processing rows, and handled when it continues): it hands its partitions and what it
  // claimed back as it exits, and the other two converge to 32/32 within two lease periods.
  const Freeze freeze = FreezeWithAClaim(b);
  ASSERT_GT(freeze.claimed, 0) << "relay-b not caught holding a claim in " << freeze.attempts
                               << " attempts: " << freeze.problem << "\n"
                               << Logs();
  const auto left_at = Clock::now();
  b.process().Signal(SIGTERM);
  b.process().Signal(SIGCONT);
  EXPECT_EQ(b.process().Wait(seconds{15}), 0) << b.LogTail();
  const double exit_seconds = Secs(Clock::now() - left_at);
  EXPECT_EQ(Owned(b), 0) << "relay-b exited but still holds live leases: " << OwnershipText();
  EXPECT_EQ(Processing(b), 0) << "relay-b exited (SIGTERM with " << freeze.claimed
                              << " messages claimed) but messages are still leased to it";
  const auto back_to_two = WaitForFair({&a, &c}, left_at, kConverge);
  EXPECT_TRUE(back_to_two) << "not the fair share of 2 " << Secs(kConverge)
                           << " s after relay-b's SIGTERM: " << OwnershipText() << "\n"
                           << Logs();
  if (back_to_two) {
    std::printf("[ multi ] leave: relay-b exited %.2f s after SIGTERM, %s %.2f s after SIGTERM\n",
                exit_seconds, OwnershipText().c_str(), Secs(*back_to_two));
  }
  EXPECT_TRUE(WaitForGauges({&a, &c}, &gauges)) << gauges;
  // The two left publish what is written after the leave.
  EXPECT_TRUE(WaitForPublishing({&a, &c}, Published({&a, &c}), kConverge, &publishing))
      << publishing << "\n"
      << Logs();

  writers.Stop();
  ASSERT_EQ(writers.error(), "");
  std::printf("[ multi ] wrote %zu messages in %.1f s\n", writers.count(), writers.seconds());
  EXPECT_TRUE(WaitForAll(consumer, writers, seconds{90}))
      << consumer.count() << " of " << writers.count() << " delivered\n"
      << Logs();
  for (const Relay* relay : {&a, &c}) {
    const std::string metrics = relay->Metrics();
    std::printf("[ multi ] %s: published %.0f, lease_lost %.0f, rebalances %.0f, takeovers %.0f\n",
                relay->instance().c_str(), Sample(metrics, "outbox_published_total"),
                Sample(metrics, "outbox_relay_lease_lost_total"),
                Sample(metrics, "outbox_relay_rebalances_total"),
                Sample(metrics, "outbox_relay_takeovers_total"));
  }
  std::printf("[ multi ] relay-b published %.0f before it left\n", b_published);
  EXPECT_EQ(a.process().Stop(), 0) << a.LogTail();
  EXPECT_EQ(c.process().Stop(), 0) << c.LogTail();
  consumer.Stop();
  const Outcome outcome = Check(consumer, writers);
  ExpectDelivered(outcome, "join and leave");
  // A relay over its share settles what it has in flight before it releases a partition, and
  // SIGTERM hands back what was claimed: if a handover ever fenced a claimed batch instead, at
  // most the two pipelined batches of the relays that gave partitions up (relay-a and relay-b at
  // the join, relay-b at the leave) could go out twice.
  EXPECT_LE(outcome.duplicates, 2 * kMaxClaimed);
}

TEST_F(MultiRelayE2eTest, TheSurvivorsTakeOverTheKilledRelaysPartitionsWhenItsLeaseExpires) {
  Consumer consumer(queue_);
  std::optional<Writers> running;
  ASSERT_NO_FATAL_FAILURE(StartThreeUnderLoad(consumer, running, 50, milliseconds{50}, 5000));
  Writers& writers = *running;
  Relay& a = *relays_[0];
  Relay& b = *relays_[1];
  Relay& c = *relays_[2];
  const double takeovers_before =
      a.Metric("outbox_relay_takeovers_total") + c.Metric("outbox_relay_takeovers_total");
  // Killed with a claim in hand: SIGSTOP it while it holds processing rows, read what it holds
  // once the stop has taken effect (nothing it sent is still running), then SIGKILL. Otherwise
  // the checks below on its claimed messages could pass without anything to fence.
  const Freeze freeze = FreezeWithAClaim(b);
  ASSERT_GT(freeze.claimed, 0) << "relay-b not caught holding a claim in " << freeze.attempts
                               << " attempts: " << freeze.problem << "\n"
                               << Logs();
  const std::string victims =
      "SELECT coalesce(array_agg(partition)::text, '') FROM " + schema_.name() +
      ".partition_leases WHERE owner LIKE 'relay-b/%' AND lease_until > now()";
  const std::string partitions = Scalar(schema_.conn(), victims);
  const std::int64_t processing = freeze.claimed;
  b.process().Signal(SIGKILL);
  const auto killed_at = Clock::now();
  EXPECT_EQ(b.process().Wait(seconds{10}), 128 + SIGKILL);
  ASSERT_NE(partitions, "") << "relay-b held no live lease when it was killed: " << OwnershipText();
  const int lost = static_cast<int>(std::count(partitions.begin(), partitions.end(), ',') + 1);
  std::printf(
      "[ multi ] kill -9 relay-b (caught at attempt %d): it owned %d partitions %s, %lld messages "
      "claimed\n",
      freeze.attempts, lost, partitions.c_str(), static_cast<long long>(processing));

  // Its partitions belong to relay-a and relay-c within lease + one sweep (+ the margin), and its
  // claimed messages are no longer leased to it.
  const std::string taken = "SELECT count(*) FROM " + schema_.name() +
                            ".partition_leases WHERE partition = ANY('" + partitions +
                            "') AND lease_until > now() AND (owner LIKE 'relay-a/%' OR owner "
                            "LIKE 'relay-c/%')";
  std::optional<Clock::duration> taken_after;
  while (Clock::now() - killed_at < kTakeover) {
    if (Int(schema_.conn(), taken) == lost) {
      taken_after = Clock::now() - killed_at;
      break;
    }
    std::this_thread::sleep_for(milliseconds{20});
  }
  EXPECT_TRUE(taken_after) << "relay-b's partitions not taken over " << Secs(kTakeover)
                           << " s after kill -9: " << Int(schema_.conn(), taken) << " of " << lost
                           << "; " << OwnershipText() << "\n"
                           << Logs();
  if (taken_after) {
    std::printf(
        "[ multi ] kill -9: relay-b's %d partitions taken over after %.2f s (bound %.1f s)\n", lost,
        Secs(*taken_after), Secs(kTakeover));
  }
  EXPECT_EQ(Processing(b), 0) << "messages still leased to the dead relay-b after the takeover";
  const auto converged = WaitForFair({&a, &c}, killed_at, kConverge);
  EXPECT_TRUE(converged) << OwnershipText() << "\n" << Logs();
  if (converged) {
    std::printf("[ multi ] kill -9: %s %.2f s after the kill\n", OwnershipText().c_str(),
                Secs(*converged));
  }
  std::string gauges;
  EXPECT_TRUE(WaitForGauges({&a, &c}, &gauges)) << gauges;
  // The counters follow the heartbeat that took over: wait (bounded) for them.
  double takeovers_after = takeovers_before;
  for (const auto until = Clock::now() + kLease + kMargin;
       takeovers_after <= takeovers_before && Clock::now() < until;) {
    std::this_thread::sleep_for(milliseconds{50});
    takeovers_after =
        a.Metric("outbox_relay_takeovers_total") + c.Metric("outbox_relay_takeovers_total");
  }
  EXPECT_GT(takeovers_after, takeovers_before);
  // The survivors publish what is written after the takeover.
  std::string publishing;
  EXPECT_TRUE(WaitForPublishing({&a, &c}, Published({&a, &c}), kConverge, &publishing))
      << publishing << "\n"
      << Logs();

  writers.Stop();
  ASSERT_EQ(writers.error(), "");
  EXPECT_TRUE(WaitForAll(consumer, writers, seconds{90}))
      << consumer.count() << " of " << writers.count() << " delivered\n"
      << Logs();
  std::printf("[ multi ] kill -9: takeovers_total %.0f -> %.0f (relay-a + relay-c)\n",
              takeovers_before, takeovers_after);
  EXPECT_EQ(a.process().Stop(), 0) << a.LogTail();
  EXPECT_EQ(c.process().Stop(), 0) << c.LogTail();
  consumer.Stop();
  const Outcome outcome = Check(consumer, writers);
  ExpectDelivered(outcome, "kill -9 of one of 3");
  EXPECT_LE(outcome.duplicates, kMaxClaimed) << "more than the killed relay could have claimed";
}

TEST_F(MultiRelayE2eTest, AFrozenRelayIsFencedHoldsNoLocksAndRejoinsWhenItWakes) {
  Consumer consumer(queue_);
  std::optional<Writers> running;
  // Faster than in the other tests, so that the relays always have a batch in hand.
  ASSERT_NO_FATAL_FAILURE(StartThreeUnderLoad(consumer, running, 100, milliseconds{20}, 3000));
  Writers& writers = *running;
  Relay& a = *relays_[0];
  Relay& b = *relays_[1];
  Relay& c = *relays_[2];
  const double lease_lost_before = b.Metric("outbox_relay_lease_lost_total");
  ASSERT_GE(lease_lost_before, 0) << "relay-b's /metrics does not answer";

  // SIGSTOP relay-b while it holds a claim, and read what it holds only once the stop has taken
  // effect and nothing it sent before is still running (a claim or a completion in flight
  // would change the processing rows after a read made right after the signal).
  const Freeze freeze = FreezeWithAClaim(b);
  ASSERT_GT(freeze.claimed, 0) << "relay-b not caught holding a claim in " << freeze.attempts
                               << " attempts: " << freeze.problem << "\n"
                               << Logs();
  const std::int64_t processing = freeze.claimed;
  const int attempts = freeze.attempts;
  const Clock::time_point stopped_at = freeze.stopped_at;
  const std::string partitions = Scalar(
      schema_.conn(), "SELECT coalesce(array_agg(partition)::text, '') FROM " + schema_.name() +
                          ".partition_leases WHERE owner LIKE 'relay-b/%' AND lease_until > now()");
  ASSERT_NE(partitions, "") << "the frozen relay-b held no live lease: " << OwnershipText();
  const int frozen = static_cast<int>(std::count(partitions.begin(), partitions.end(), ',') + 1);
  std::printf(
      "[ multi ] SIGSTOP relay-b (attempt %d) holding %lld claimed messages, %d partitions\n",
      attempts, static_cast<long long>(processing), frozen);

  // While it is stopped: its partitions are taken over and its claimed messages reset (the
  // same bound as for a dead relay).
  const std::string taken = "SELECT count(*) FROM " + schema_.name() +
                            ".partition_leases WHERE partition = ANY('" + partitions +
                            "') AND lease_until > now() AND (owner LIKE 'relay-a/%' OR owner "
                            "LIKE 'relay-c/%')";
  std::optional<Clock::duration> taken_after;
  while (Clock::now() - stopped_at < kTakeover) {
    if (Int(schema_.conn(), taken) == frozen && Processing(b) == 0) {
      taken_after = Clock::now() - stopped_at;
      break;
    }
    std::this_thread::sleep_for(milliseconds{20});
  }
  EXPECT_TRUE(taken_after) << "not taken over " << Secs(kTakeover)
                           << " s after SIGSTOP: " << Int(schema_.conn(), taken) << " of " << frozen
                           << " partitions, relay-b still has " << Processing(b) << " processing; "
                           << OwnershipText() << "\n"
                           << Logs();
  if (taken_after) {
    std::printf(
        "[ multi ] SIGSTOP: relay-b's %d partitions taken over, its claimed messages "
        "reset, after %.2f s (bound %.1f s)\n",
        frozen, Secs(*taken_after), Secs(kTakeover));
  }

  // Stopped for three leases; at the end of it, it holds no locks that could block anyone.
  std::this_thread::sleep_for(3 * kLease - (Clock::now() - stopped_at));
  const std::string app = b.app_name();
  const std::int64_t backends =
      Int(schema_.conn(),
          "SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + app + "'");
  const std::int64_t locks =
      Int(schema_.conn(),
          "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s USING (pid) "
          "WHERE s.application_name = '" +
              app + "' AND l.locktype IN ('relation', 'tuple', 'transactionid')");
  const std::int64_t idle_in_transaction =
      Int(schema_.conn(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = '" + app +
                              "' AND state LIKE 'idle in transaction%'");
  const std::string activity =
      Scalar(schema_.conn(),
             "SELECT coalesce(string_agg(state || ': ' || left(query, 80), ' | '), '') FROM "
             "pg_stat_activity WHERE application_name = '" +
                 app + "'");
  EXPECT_GE(backends, 1) << "no backend with application_name " << app << " (PGAPPNAME ignored?)";
  EXPECT_EQ(locks, 0) << activity;
  EXPECT_EQ(idle_in_transaction, 0) << activity;
  std::printf(
      "[ multi ] relay-b stopped %.1f s: %lld backends, %lld relation/tuple/xid locks, "
      "%lld idle in transaction; %s\n",
      Secs(Clock::now() - stopped_at), static_cast<long long>(backends),
      static_cast<long long>(locks), static_cast<long long>(idle_in_transaction),
      OwnershipText().c_str());

  // SIGCONT: its late completions are rejected (lease_lost rises), it rejoins and gets its fair
  // share back within two lease periods, and publishes again.
  b.process().Signal(SIGCONT);
  const auto continued_at = Clock::now();
  double lease_lost_after = lease_lost_before;
  while (Clock::now() - continued_at < kConverge && lease_lost_after <= lease_lost_before) {
    lease_lost_after = b.Metric("outbox_relay_lease_lost_total");
    std::this_thread::sleep_for(milliseconds{100});
  }
  EXPECT_GT(lease_lost_after, lease_lost_before) << b.LogTail();
  const auto rejoined = WaitForFair({&a, &b, &c}, continued_at, kConverge);
  EXPECT_TRUE(rejoined) << "not the fair share of 3 " << Secs(kConverge)
                        << " s after SIGCONT: " << OwnershipText() << "\n"
                        << Logs();
  if (rejoined) {
    std::printf("[ multi ] SIGCONT: relay-b lease_lost %.0f -> %.0f; %s %.2f s after SIGCONT\n",
                lease_lost_before, lease_lost_after, OwnershipText().c_str(), Secs(*rejoined));
  }
  std::string publishing;
  EXPECT_TRUE(WaitForPublishing({&b}, Published({&b}), kConverge, &publishing))
      << "relay-b does not publish after rejoining: " << publishing << "\n"
      << b.LogTail();

  writers.Stop();
  ASSERT_EQ(writers.error(), "");
  EXPECT_TRUE(WaitForAll(consumer, writers, seconds{90}))
      << consumer.count() << " of " << writers.count() << " delivered\n"
      << Logs();
  for (Relay* relay : {&a, &b, &c}) EXPECT_EQ(relay->process().Stop(), 0) << relay->LogTail();
  consumer.Stop();
  const Outcome outcome = Check(consumer, writers);
  ExpectDelivered(outcome, "SIGSTOP of one of 3");
  EXPECT_LE(outcome.duplicates, kMaxClaimed) << "more than the frozen relay could have claimed";
}

}  // namespace
}  // namespace outbox::testing
