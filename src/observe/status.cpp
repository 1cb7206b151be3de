#include "outbox/observe/status.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "outbox/config/toml_table.h"
#include "outbox/core/secrets.h"
#include "outbox/core/version.h"
#include "outbox/store/admin.h"

namespace outbox::observe {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// outbox_messages_by_topic: Admin::kTopicGroups (status, target, topic) series, the rest summed
// into one series per status with target and topic "_other" (at most 4 more, within the
// registry's fixed limit).
static_assert(std::size_t{Admin::kTopicGroups} + 4 <= Registry::kMaxSeriesPerFamily);
// After the grouped count timed out, it is not tried again for this long.
constexpr std::chrono::seconds kTopicRetryAfterTimeout{60};
constexpr milliseconds kProbeTimeout{1000};

constexpr std::string_view kByTopicName = "outbox_messages_by_topic";
constexpr std::string_view kByTopicHelp =
    "Messages that are not published, by status, target and topic: the 50 largest groups, the "
    "rest summed into target=\"_other\", topic=\"_other\". Empty while "
    "outbox_messages_by_topic_skipped is 1.";

constexpr std::string_view kSinkReachableName = "outbox_sink_reachable";

// The rates ring: one sample of the relay's counters a second, for the last 15 minutes.
constexpr std::size_t kRateSamples = 900;
constexpr std::chrono::seconds kRateStep{1};

double Seconds(SteadyClock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

std::string SecondsText(SteadyClock::duration duration) {
  std::array<char, 32> text{};
  std::snprintf(text.data(), text.size(), "%.1f s", Seconds(duration));
  return text.data();
}

}  // namespace

bool TcpReachable(const std::string& host, int port, milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses{found, &::freeaddrinfo};
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    const int fd = ::socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                            address->ai_protocol);
    if (fd < 0) continue;
    bool connected = ::connect(fd, address->ai_addr, address->ai_addrlen) == 0;
    if (!connected && errno == EINPROGRESS) {
      pollfd waiting{.fd = fd, .events = POLLOUT, .revents = 0};
      if (::poll(&waiting, 1, static_cast<int>(timeout.count())) == 1) {
        int error = 0;
        socklen_t size = sizeof error;
        connected = ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0;
      }
    }
    ::close(fd);
    if (connected) return true;
  }
  return false;
}

class StatusService::Impl {
 public:
  Impl(StatusOptions options, std::shared_ptr<const StoreSettings> store,
       std::vector<ProbedSink> sinks, Registry& registry, LogFn log, RelayTotalsFn relay,
       PausedTargetsFn paused)
      : options_(std::move(options)),
        store_settings_(std::move(store)),
        registry_(registry),
        log_(std::move(log)),
        relay_(std::move(relay)),
        paused_targets_(std::move(paused)),
        unread_(store_settings_ ? nullptr : std::make_unique<Registry>()),
        ready_(registry.AddGauge("outbox_ready", "1 when /readyz answers 200, else 0.")),
        stats_age_(Counts(registry).AddGauge(
            "outbox_stats_age_seconds",
            "Seconds since the message counts were last read from the database (-1: never).")),
        stats_duration_(Counts(registry).AddGauge(
            "outbox_stats_duration_seconds",
            "How long the last read of the message counts took in the database.")),
        estimated_(Counts(registry).AddGauge(
            "outbox_messages_estimated",
            "1 when a count of outbox_messages was too large to take exactly and is the "
            "database planner's estimate.")),
        oldest_pending_age_(
            Counts(registry).AddGauge("outbox_oldest_pending_age_seconds",
                                      "Age of the oldest pending message (0 when none is "
                                      "pending), on the database's clock.")),
        lease_owners_(Counts(registry).AddGauge(
            "outbox_lease_owners", "Relays (lease owners) holding unexpired leases right now.")),
        live_relays_(Counts(registry).AddGauge(
            "outbox_relays_live",
            "Relays heartbeating on this database (sharing its partitions).")),
        unowned_partitions_(Counts(registry).AddGauge(
            "outbox_partitions_unowned",
            "Partitions no live relay holds: nobody publishes them until one takes them.")),
        streams_held_(Counts(registry).AddGauge(
            "outbox_streams_held",
            "(target, stream) pairs held by an abandoned message under on_abandon = \"hold\": "
            "nothing after it is published until an operator replays or skips it.")),
        by_topic_skipped_(Counts(registry).AddGauge(
            "outbox_messages_by_topic_skipped",
            "1 when outbox_messages_by_topic is empty because the backlog is above the exact-count "
            "limit or the grouped count took too long; 0 when it is current.")) {
    registry
        .AddGauge("outbox_info", "Always 1; the labels describe this outboxd.",
                  {{"version", kVersion}, {"instance", options_.instance}})
        .Set(1);
    for (const std::string_view status :
         {"pending", "processing", "failed", "abandoned", "published"}) {
      by_status_.push_back(&Counts(registry).AddGauge(
          "outbox_messages",
          "Messages in the outbox by status (published: those kept by the retention setting).",
          {{"status", std::string{status}}}));
    }
    Counts(registry).ReplaceGauges(std::string{kByTopicName}, kByTopicHelp, {});
    // One series per sink with a broker to probe: as many as the configuration has.
    registry.AllowSeries(kSinkReachableName, SeriesPerTarget(1, sinks.size()));
    for (ProbedSink& sink : sinks) {
      probes_.push_back(Probe{
          .sink = sink.name,
          .host = std::move(sink.endpoint.host),
          .port = sink.endpoint.port,
          .gauge = &registry.AddGauge(
              kSinkReachableName,
              "1 when the last TCP connection attempt to the sink's broker succeeded.",
              {{"sink", sink.name}}),
      });
    }
  }

  ~Impl() { Stop(); }
  Impl(const Impl&) = delete;

  // Where the series of the store's counts go: `registry`, or nowhere without a store.
  Registry& Counts(Registry& registry) { return unread_ ? *unread_ : registry; }
  Impl& operator=(const Impl&) = delete;

  void SetWalCheck(WalCheckFn check) { wal_check_ = std::move(check); }
  void SetExtraCheck(ExtraCheckFn check) { extra_check_ = std::move(check); }

  void Start() {
    stats_thread_ = std::thread([this] { StatsLoop(); });
    if (options_.serving) rates_thread_ = std::thread([this] { RatesLoop(); });
  }

  void BeginDrain() { draining_ = true; }

  void Stop() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    stop_changed_.notify_all();
    if (stats_thread_.joinable()) stats_thread_.join();
    if (rates_thread_.joinable()) rates_thread_.join();
  }

  RelayTotals Totals() const { return relay_ ? relay_() : RelayTotals{}; }

  Readiness CheckReadiness() {
    Readiness readiness{.ready = true, .report = {}};
    const auto now = SteadyClock::now();
    const milliseconds max_age = options_.ready_max_age;
    const auto line = [&](bool ok, const std::string& text) {
      readiness.ready = readiness.ready && ok;
      readiness.report += text + "\n";
    };
    std::lock_guard lock(mutex_);
    if (draining_) line(false, "relay: draining (shutting down)");
    if (!store_settings_) {
      // No counts to be read: the extra check speaks for the databases.
    } else if (!stats_ok_at_) {
      line(false, "database: not reached yet" + (stats_error_.empty() ? "" : ": " + stats_error_));
    } else if (!stats_error_.empty()) {
      line(false, "database: the last read of the counts failed: " + stats_error_);
    } else if (now - *stats_ok_at_ > max_age) {
      line(false, "database: the counts are " + SecondsText(now - *stats_ok_at_) + " old");
    } else {
      line(true, "database: ok (counts read " + SecondsText(now - *stats_ok_at_) + " ago)");
    }
    for (const Probe& probe : probes_) {
      const std::string name = "sink " + probe.sink + ": ";
      if (!probe.ok_at) {
        line(false, name + "broker not reached yet (TCP " + probe.host + ":" +
                        std::to_string(probe.port) + ")");
      } else if (!probe.last_ok) {
        line(false, name + "broker refuses TCP connections on " + probe.host + ":" +
                        std::to_string(probe.port));
      } else if (now - *probe.ok_at > max_age) {
        line(false, name + "broker last reached " + SecondsText(now - *probe.ok_at) + " ago");
      } else {
        line(true, name + "broker accepts TCP connections");
      }
    }
    if (extra_check_) {
      for (const CheckLine& check : extra_check_()) line(check.ok, check.text);
    }
    if (wal_check_) {
      if (const auto problem = wal_check_()) {
        line(false, "WAL slot: " + *problem);
      } else {
        line(true, "WAL slot: read by a relay");
      }
    }
    if (Totals().broker_unavailable) {
      const std::vector<PausedTarget> paused =
          paused_targets_ ? paused_targets_() : std::vector<PausedTarget>{};
      for (const PausedTarget& target : paused) {
        line(false, "target " + target.name + ": paused, its last batch found no broker" +
                        (target.reason.empty() ? std::string{} : " (" + target.reason + ")") +
                        "; its messages wait, no attempt spent, and the other targets flow");
      }
      if (paused.empty()) {  // resumed since the flag was read, or no names to tell
        line(false,
             "relay: a target is paused, its last batch found no broker "
             "(outbox_relay_target_paused names it); the other targets flow");
      }
    }
    ready_.Set(readiness.ready ? 1.0 : 0.0);
    stats_age_.Set(stats_ok_at_ ? Seconds(now - *stats_ok_at_) : -1.0);
    return readiness;
  }

  Rates RecentRates() const {
    Rates rates;
    rates.step = kRateStep;
    std::lock_guard lock(rates_mutex_);
    const std::size_t first = (rates_next_ + kRateSamples - rates_size_) % kRateSamples;
    for (std::size_t i = 0; i < rates_size_; ++i) {
      const RateSample& sample = rates_[(first + i) % kRateSamples];
      rates.published.push_back(sample.published);
      rates.failed.push_back(sample.failed);
      rates.unconfirmed.push_back(sample.unconfirmed);
    }
    rates.end_unix_ms = rates_end_unix_ms_;
    return rates;
  }

 private:
  struct Probe {
    std::string sink;
    std::string host;  // empty: the URL has no usable host (then never ready)
    int port = 0;
    Gauge* gauge = nullptr;
    std::optional<SteadyClock::time_point> ok_at;  // guarded by mutex_
    bool last_ok = false;                          // guarded by mutex_
    bool probed = false;                           // guarded by mutex_
  };

  struct RateSample {
    std::uint64_t published = 0;
    std::uint64_t failed = 0;
    std::uint64_t unconfirmed = 0;
  };

  void Log(LogLevel level, const std::string& message) const {
    if (log_) log_(level, message);
  }

  // Every stats_interval: the counts on a connection of our own, then the broker probes.
  void StatsLoop() {
    std::unique_ptr<Store> store;
    for (;;) {
      if (options_.serving && store_settings_) {
        if (const auto stats = ReadStats(store)) ReadTopicCounts(*stats);
      }
      ProbeBrokers();
      CheckReadiness();
      std::unique_lock lock(mutex_);
      if (stop_changed_.wait_for(lock, options_.stats_interval, [this] { return stop_; })) {
        return;
      }
    }
  }

  // The counts, or nullopt when they could not be read.
  std::optional<StoreStats> ReadStats(std::unique_ptr<Store>& store) {
    std::optional<StoreStats> read;
    std::string error;
    const auto started = SteadyClock::now();
    try {
      if (!store) store = store_settings_->OpenStore(options_.retry, options_.retention);
      const StoreStats stats = store->Stats();
      stats_duration_.Set(Seconds(SteadyClock::now() - started));
      const std::array<std::int64_t, 5> counts{stats.pending, stats.processing, stats.failed,
                                               stats.abandoned, stats.published};
      for (std::size_t i = 0; i < counts.size(); ++i) {
        by_status_[i]->Set(static_cast<double>(counts[i]));
      }
      estimated_.Set(stats.counts_estimated ? 1.0 : 0.0);
      oldest_pending_age_.Set(stats.oldest_pending_age
                                  ? std::chrono::duration<double>(*stats.oldest_pending_age).count()
                                  : 0.0);
      lease_owners_.Set(static_cast<double>(stats.active_leases));
      live_relays_.Set(static_cast<double>(stats.live_relays));
      unowned_partitions_.Set(static_cast<double>(stats.unowned_partitions));
      streams_held_.Set(static_cast<double>(stats.streams_held));
      read = stats;
    } catch (const std::exception& failure) {
      // Error texts of the store name the database without its password; mask anyway.
      error = RedactKnownSecrets(config::MaskPassword(failure.what()));
      store.reset();  // a fresh connection next time
    }
    bool changed = false;
    {
      std::lock_guard lock(mutex_);
      changed = error != stats_error_;
      stats_error_ = error;
      if (error.empty()) stats_ok_at_ = SteadyClock::now();
    }
    if (!changed) return read;
    if (error.empty()) {
      Log(LogLevel::kInfo, "reading the outbox counts works again");
    } else {
      registry_.RecordError("database", "reading the outbox counts failed: " + error);
      Log(LogLevel::kWarn, "reading the outbox counts failed (readiness fails): " + error);
    }
    return read;
  }

  // outbox_messages_by_topic: Admin::CountByTopic on the stats thread's own Admin, capped to
  // Admin::kTopicGroups series plus "_other". Skipped while any of the statuses that are not
  // published holds Admin::kTopicCountRowLimit rows or more (grouping that many rows would take
  // seconds) and for a while after it ran into its timeout (a quarter of ready_max_age, at most
  // 2 s).
  void ReadTopicCounts(const StoreStats& stats) {
    const std::int64_t limit = Admin::kTopicCountRowLimit;
    const bool too_many = stats.pending >= limit || stats.processing >= limit ||
                          stats.failed >= limit || stats.abandoned >= limit;
    if (too_many || SteadyClock::now() < topic_retry_at_) {
      SetTopicCounts({}, /*skipped=*/true);
      return;
    }
    try {
      // CountByTopic bounds its own statement; with the connection's timeout the same, in one
      // statement (no transaction of its own).
      const auto timeout =
          std::clamp(std::chrono::duration_cast<milliseconds>(options_.ready_max_age / 4),
                     milliseconds{100}, milliseconds{2000});
      if (!topic_admin_) topic_admin_ = store_settings_->OpenAdmin(timeout);
      const auto counts = topic_admin_->CountByTopic(timeout);
      if (!counts) {
        topic_retry_at_ = SteadyClock::now() + kTopicRetryAfterTimeout;
        Log(LogLevel::kWarn,
            "outbox_messages_by_topic: the grouped count took too long; not trying again for "
            "60 s");
        SetTopicCounts({}, /*skipped=*/true);
        return;
      }
      std::vector<std::pair<Labels, double>> series;
      for (const TopicCount& count : *counts) {
        series.push_back({{{"status", std::string{MessageStatusName(count.status)}},
                           {"target", count.target},
                           {"topic", count.topic}},
                          static_cast<double>(count.messages)});
      }
      SetTopicCounts(series, /*skipped=*/false);
    } catch (const std::exception& failure) {
      topic_admin_.reset();  // a fresh connection next time
      SetTopicCounts({}, /*skipped=*/true);
      Log(LogLevel::kDebug, "outbox_messages_by_topic: " + config::MaskPassword(failure.what()));
    }
  }

  void SetTopicCounts(const std::vector<std::pair<Labels, double>>& series, bool skipped) {
    registry_.ReplaceGauges(std::string{kByTopicName}, kByTopicHelp, series);
    by_topic_skipped_.Set(skipped ? 1.0 : 0.0);
  }

  void ProbeBrokers() {
    for (Probe& probe : probes_) {
      const bool ok = !probe.host.empty() && TcpReachable(probe.host, probe.port, kProbeTimeout);
      probe.gauge->Set(ok ? 1.0 : 0.0);
      bool changed = false;
      {
        std::lock_guard lock(mutex_);
        // Logged and recorded once per change, and at the first probe when it fails (a broker
        // that was never reachable used to be reported at every stats interval).
        changed = probe.probed ? ok != probe.last_ok : !ok;
        probe.probed = true;
        probe.last_ok = ok;
        if (ok) probe.ok_at = SteadyClock::now();
      }
      if (!changed) continue;
      const std::string where = probe.host + ":" + std::to_string(probe.port);
      if (ok) {
        Log(LogLevel::kInfo, "sink " + probe.sink + ": the broker at " + where + " is reachable");
      } else {
        registry_.RecordError("unavailable", "sink " + probe.sink + ": the broker at " + where +
                                                 " refuses TCP connections");
        Log(LogLevel::kWarn, "sink " + probe.sink + ": the broker at " + where +
                                 " refuses TCP connections (readiness fails)");
      }
    }
  }

  // Once a second (on the steady clock, without drift): how much the relay's counters grew.
  void RatesLoop() {
    RelayTotals last = Totals();
    auto next = SteadyClock::now() + kRateStep;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        if (stop_changed_.wait_until(lock, next, [this] { return stop_; })) return;
      }
      // After a stall (a suspended host), go on from now rather than catch up in a burst.
      const auto woke = SteadyClock::now();
      next = woke - next > kRateStep ? woke + kRateStep : next + kRateStep;
      const RelayTotals now = Totals();
      std::lock_guard lock(rates_mutex_);
      rates_[rates_next_] = RateSample{.published = now.published - last.published,
                                       .failed = now.failed - last.failed,
                                       .unconfirmed = now.unconfirmed - last.unconfirmed};
      rates_next_ = (rates_next_ + 1) % kRateSamples;
      rates_size_ = std::min(rates_size_ + 1, kRateSamples);
      rates_end_unix_ms_ = std::chrono::duration_cast<milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
      last = now;
    }
  }

  const StatusOptions options_;
  const std::shared_ptr<const StoreSettings> store_settings_;
  Registry& registry_;
  LogFn log_;
  RelayTotalsFn relay_;
  PausedTargetsFn paused_targets_;
  WalCheckFn wal_check_;      // set before Start, read by the stats thread and requests
  ExtraCheckFn extra_check_;  // likewise
  // Without a store, where the series of the counts go instead of `registry_`: they are never
  // read, and a gauge left at 0 would tell an alert that nothing is abandoned.
  std::unique_ptr<Registry> unread_;
  Gauge& ready_;
  Gauge& stats_age_;
  Gauge& stats_duration_;
  Gauge& estimated_;
  Gauge& oldest_pending_age_;
  Gauge& lease_owners_;
  Gauge& live_relays_;
  Gauge& unowned_partitions_;
  Gauge& streams_held_;
  Gauge& by_topic_skipped_;
  std::vector<Gauge*> by_status_;
  std::vector<Probe> probes_;
  std::atomic<bool> draining_{false};

  // The stats thread's own Admin (and connection) for outbox_messages_by_topic.
  std::unique_ptr<Admin> topic_admin_;
  SteadyClock::time_point topic_retry_at_{};

  std::thread stats_thread_;
  std::thread rates_thread_;

  // The rates ring (RatesLoop writes, RecentRates reads).
  mutable std::mutex rates_mutex_;
  std::array<RateSample, kRateSamples> rates_{};  // guarded by rates_mutex_
  std::size_t rates_next_ = 0;                    // guarded by rates_mutex_
  std::size_t rates_size_ = 0;                    // guarded by rates_mutex_
  std::int64_t rates_end_unix_ms_ = 0;            // guarded by rates_mutex_

  std::mutex mutex_;
  std::condition_variable stop_changed_;
  bool stop_ = false;                                   // guarded by mutex_
  std::optional<SteadyClock::time_point> stats_ok_at_;  // guarded by mutex_
  std::string stats_error_;                             // guarded by mutex_
};

StatusService::StatusService(StatusOptions options, std::shared_ptr<const StoreSettings> store,
                             std::vector<ProbedSink> sinks, Registry& registry, LogFn log,
                             RelayTotalsFn relay, PausedTargetsFn paused)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(store), std::move(sinks), registry,
                                   std::move(log), std::move(relay), std::move(paused))) {}

StatusService::~StatusService() = default;

void StatusService::SetWalCheck(WalCheckFn check) { impl_->SetWalCheck(std::move(check)); }
void StatusService::SetExtraCheck(ExtraCheckFn check) { impl_->SetExtraCheck(std::move(check)); }
void StatusService::Start() { impl_->Start(); }
void StatusService::BeginDrain() { impl_->BeginDrain(); }
void StatusService::Stop() { impl_->Stop(); }
StatusService::Readiness StatusService::CheckReadiness() { return impl_->CheckReadiness(); }
RelayTotals StatusService::Totals() const { return impl_->Totals(); }
StatusService::Rates StatusService::RecentRates() const { return impl_->RecentRates(); }

std::string StatusService::RatesJson() const {
  const Rates rates = RecentRates();
  return nlohmann::ordered_json{{"step_seconds", rates.step.count()},
                                {"end_unix_ms", rates.end_unix_ms},
                                {"published", rates.published},
                                {"failed", rates.failed},
                                {"unconfirmed", rates.unconfirmed}}
      .dump();
}

}  // namespace outbox::observe
