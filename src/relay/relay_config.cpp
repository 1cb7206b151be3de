#include "outbox/relay/relay_config.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <utility>

#include "outbox/core/error.h"

namespace outbox {
namespace {

using config::Fail;
using config::FormatDuration;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr std::size_t kMaxInstanceBytes = 255;
constexpr std::int64_t kMaxBatchSize = 10000;
constexpr milliseconds kHour{std::chrono::hours{1}};
constexpr milliseconds kDay{std::chrono::hours{24}};

// "<hostname>-<pid>": unique per running relay on a host, readable in the lease table.
std::string DefaultInstance() {
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0 || host[0] == '\0') {
    return "outboxd-" + std::to_string(::getpid());
  }
  return std::string{host.data()} + "-" + std::to_string(::getpid());
}

}  // namespace

RelaySection ReadRelaySection(const config::Section& relay, const RelayDefaults& defaults) {
  RelaySection out;
  out.purge_interval = defaults.purge_interval;
  relay.AllowOnly({"instance", "batch_size", "lease", "sweep_interval", "linger", "publish_timeout",
                   "shutdown_timeout", "min_backoff", "max_backoff", "purge_interval",
                   "idle_lease"});
  if (relay.Read("instance", out.instance)) {
    if (out.instance.empty() || out.instance.size() > kMaxInstanceBytes ||
        config::HasControlCharacter(out.instance)) {
      Fail(
          relay.Key("instance"),
          "must be 1 to " + std::to_string(kMaxInstanceBytes) + " bytes without control characters",
          relay.Find("instance"));
    }
  } else {
    out.instance = DefaultInstance();
  }
  relay.ReadInteger("batch_size", 1, kMaxBatchSize, out.batch_size);
  relay.ReadDuration("lease", seconds{1}, kDay, out.lease);
  if (!relay.ReadDuration("sweep_interval", milliseconds{10}, kHour, out.sweep_interval)) {
    out.sweep_interval = defaults.sweep_interval;
  }
  if (!relay.ReadDuration("linger", milliseconds{0}, seconds{1}, out.linger)) {
    out.linger = defaults.linger;
  }
  relay.ReadDuration("publish_timeout", milliseconds{1}, kHour, out.publish_timeout);
  relay.ReadDuration("shutdown_timeout", milliseconds{0}, kHour, out.shutdown_timeout);
  relay.ReadDuration("min_backoff", milliseconds{1}, kHour, out.min_backoff);
  relay.ReadDuration("max_backoff", milliseconds{1}, kHour, out.max_backoff);
  relay.ReadDuration("purge_interval", seconds{1}, kDay, out.purge_interval);
  if (relay.ReadDuration("idle_lease", seconds{1}, kDay, out.idle_lease)) {
    if (out.idle_lease < out.lease) {
      Fail(relay.Key("idle_lease"),
           "must be at least relay.lease (" + FormatDuration(out.lease) + "), got " +
               FormatDuration(out.idle_lease),
           relay.Find("idle_lease"));
    }
  } else {
    out.idle_lease =
        std::min<milliseconds>(out.lease * std::max(defaults.idle_lease_factor, 1), kDay);
  }
  // The relay renews its partition leases between batches: a batch must leave time for that.
  if (out.publish_timeout * 2 > out.lease) {
    Fail(relay.Key("publish_timeout"),
         "must be at most half of relay.lease (" + FormatDuration(out.lease) + "), got " +
             FormatDuration(out.publish_timeout),
         relay.Find("publish_timeout"));
  }
  if (out.linger * 2 >= out.lease) {
    Fail(relay.Key("linger"),
         "must be less than half of relay.lease (" + FormatDuration(out.lease) + "), got " +
             FormatDuration(out.linger),
         relay.Find("linger"));
  }
  if (out.max_backoff < out.min_backoff) {
    Fail(relay.Key("max_backoff"),
         "must be at least relay.min_backoff (" + FormatDuration(out.min_backoff) + "), got " +
             FormatDuration(out.max_backoff),
         relay.Find("max_backoff"));
  }
  return out;
}

void DescribeRelaySection(config::TomlWriter& out, const RelaySection& relay) {
  out.Header("relay");
  out.String("instance", relay.instance);
  out.Integer("batch_size", relay.batch_size);
  out.Duration("lease", relay.lease);
  out.Duration("sweep_interval", relay.sweep_interval);
  out.Duration("linger", relay.linger);
  out.Duration("publish_timeout", relay.publish_timeout);
  out.Duration("shutdown_timeout", relay.shutdown_timeout);
  out.Duration("min_backoff", relay.min_backoff);
  out.Duration("max_backoff", relay.max_backoff);
  out.Duration("purge_interval", relay.purge_interval);
  out.Duration("idle_lease", relay.idle_lease);
}

RelayOptions TableRelayOptionsOf(const RelaySection& relay, const RetryPolicy& retry,
                                 const RetentionPolicy& retention, observe::Registry& metrics) {
  RelayOptions options;
  options.instance = relay.instance;
  options.batch_size = relay.batch_size;
  options.lease = relay.lease;
  options.idle_lease = relay.idle_lease;
  options.sweep_interval = relay.sweep_interval;
  options.linger = relay.linger;
  options.publish_timeout = relay.publish_timeout;
  options.min_backoff = relay.min_backoff;
  options.max_backoff = relay.max_backoff;
  options.purge_interval = relay.purge_interval;
  options.retention = retention;
  options.metrics = &metrics;
  options.max_attempts = retry.max_attempts;
  return options;
}

WalRelayOptions WalRelayOptionsOf(const RelaySection& relay, const RetryPolicy& retry,
                                  observe::Registry& metrics) {
  WalRelayOptions options;
  options.instance = relay.instance;
  options.batch_size = relay.batch_size;
  options.linger = relay.linger;
  options.lease = relay.lease;
  options.publish_timeout = relay.publish_timeout;
  options.min_backoff = relay.min_backoff;
  options.max_backoff = relay.max_backoff;
  options.retry = retry;
  options.metrics = &metrics;
  return options;
}

void RelayGroup::Check(const Settings& settings, const StoreSettings& store) {
  observe::Registry registry;
  Relay::CheckOptions(
      TableRelayOptionsOf(settings.relay, settings.retry, settings.retention, registry));
  if (store.WalMode()) {
    WalRelay::CheckOptions(WalRelayOptionsOf(settings.relay, settings.retry, registry));
  }
}

std::shared_ptr<Dispatcher> RelayGroup::MakeDispatcher(const Settings& settings, SinkMap sinks,
                                                       observe::Registry& metrics,
                                                       const LogFn& log) {
  RelayOptions options =
      TableRelayOptionsOf(settings.relay, settings.retry, settings.retention, metrics);
  options.rate_limits = settings.rate_limits;
  return DispatcherFor(std::move(sinks), options, log);
}

// One dispatcher for both relays: one connection, one pause and one memory of what its broker
// asked (an HTTP endpoint's Retry-After) per target, whoever publishes.
RelayGroup::RelayGroup(const Settings& settings, const StoreSettings& store, SinkMap sinks,
                       observe::Registry& metrics, LogFn log)
    : RelayGroup(settings, store, MakeDispatcher(settings, std::move(sinks), metrics, log),
                 Source{}, metrics, log) {}

RelayGroup::RelayGroup(const Settings& settings, const StoreSettings& store,
                       std::shared_ptr<Dispatcher> dispatcher, const Source& source,
                       observe::Registry& metrics, LogFn log)
    : log_(std::move(log)) {
  store.Prepare();
  RelayOptions options =
      TableRelayOptionsOf(settings.relay, settings.retry, settings.retention, metrics);
  // Where several relays may share the database (PostgreSQL): always, so that a second outboxd
  // just works. Null for one relay per database (SQLite).
  partition_leases_ = store.OpenPartitionLeases();
  options.partition_leases = partition_leases_.get();
  options.rate_limits = settings.rate_limits;
  options.database = source.database;
  options.metric_labels = source.metric_labels;
  options.metric_series_limit = source.metric_series_limit;
  table_ = std::make_unique<Relay>(options, store.OpenStore(settings.retry, settings.retention),
                                   store.OpenWakeup(), dispatcher, log_);
  // WAL mode: a second relay reads the slot; the table relay still publishes what WAL mode parks
  // in the table (and the topics left in table mode).
  if (store.WalMode()) {
    WalRelayOptions wal = WalRelayOptionsOf(settings.relay, settings.retry, metrics);
    wal.database = source.database;
    wal.metric_labels = source.metric_labels;
    wal.metric_series_limit = source.metric_series_limit;
    wal_ = std::make_unique<WalRelay>(wal, store.OpenWalSource(), store.OpenWalLedger(),
                                      std::move(dispatcher), log_);
  }
}

RelayGroup::~RelayGroup() = default;

bool RelayGroup::Run() {
  std::atomic<bool> wal_failed{false};
  // Stopped and joined on every way out, also when the table relay throws.
  struct WalThread {
    WalRelay* relay = nullptr;
    std::thread thread;
    ~WalThread() {
      if (!thread.joinable()) return;
      relay->Stop();
      thread.join();
    }
  } wal_thread{wal_.get(), {}};
  if (wal_) {
    wal_thread.thread = std::thread([&] {
      try {
        wal_->Run();
      } catch (const std::exception& error) {
        if (log_) log_(LogLevel::kError, std::string{"WAL mode: "} + error.what());
        wal_failed = true;
        table_->Stop();
      }
    });
  }
  table_->Run();
  if (wal_thread.thread.joinable()) {
    wal_->Stop();
    wal_thread.thread.join();
  }
  return !wal_failed;
}

void RelayGroup::Stop() {
  table_->Stop();
  if (wal_) wal_->Stop();
}

const WalRelayCounters* RelayGroup::wal_counters() const {
  return wal_ ? &wal_->counters() : nullptr;
}

std::optional<std::string> RelayGroup::SlotProblem() const {
  return wal_ ? wal_->SlotProblem() : std::nullopt;
}

}  // namespace outbox
