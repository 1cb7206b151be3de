#include "outbox/relay/tenant_relays.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <set>
#include <utility>

#include "outbox/core/backoff.h"
#include "outbox/core/error.h"

namespace outbox {
namespace {

// A database that cannot be started is tried again after this, doubling, up to kMaxRetry.
constexpr std::chrono::milliseconds kMinRetry{1000};
constexpr std::chrono::milliseconds kMaxRetry{30000};

}  // namespace

// One database's relays on a thread of their own: built (which reaches the database), run until
// stopped; a build that fails, or a WAL relay that fails for good, is reported and tried again
// with backoff until stopped.
class TenantRelays::Database {
 public:
  Database(NamedDatabase database, const RelayGroup::Settings& settings,
           std::shared_ptr<Dispatcher> dispatcher, RelayGroup::Source source,
           observe::Registry& metrics, LogFn log)
      : database_(std::move(database)),
        settings_(settings),
        dispatcher_(std::move(dispatcher)),
        source_(std::move(source)),
        metrics_(metrics),
        log_(std::move(log)),
        thread_([this] { Loop(); }) {}

  ~Database() { Finish(); }
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  void Stop() {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    if (group_) group_->Stop();
    wake_.notify_all();
  }

  // Stops and waits for the drain.
  void Finish() {
    Stop();
    if (thread_.joinable()) thread_.join();
  }

  [[nodiscard]] const std::string& fingerprint() const { return database_.fingerprint; }

  [[nodiscard]] DatabaseState State() const {
    std::lock_guard lock(mutex_);
    DatabaseState state{.name = database_.name, .relaying = relaying_, .problem = problem_};
    if (relaying_ && group_ && group_->counters().database_failing.load()) {
      state.relaying = false;
      state.problem = "its database does not answer; the relay tries again with backoff";
    }
    if (group_) {
      state.published = group_->counters().published.load();
      state.failed = group_->counters().failed.load();
    }
    return state;
  }

  void AddTo(Totals& totals) const {
    std::lock_guard lock(mutex_);
    if (!group_) return;
    const RelayCounters& counters = group_->counters();
    totals.published += counters.published.load();
    totals.failed += counters.failed.load();
    totals.unconfirmed += counters.unconfirmed.load();
    totals.takeovers += counters.takeovers.load();
    totals.partitions_owned += counters.partitions_owned.load();
  }

 private:
  void Log(LogLevel level, const std::string& message) const {
    if (log_) log_(level, message);
  }

  // Each line this database's relays log names it.
  [[nodiscard]] LogFn Prefixed() const {
    return [log = log_, prefix = "database " + database_.name + ": "](LogLevel level,
                                                                      std::string_view message) {
      if (log) log(level, prefix + std::string{message});
    };
  }

  void Loop() {
    outbox::Backoff backoff(kMinRetry, kMaxRetry);
    while (true) {
      std::shared_ptr<RelayGroup> group;
      try {
        group = std::make_shared<RelayGroup>(settings_, *database_.settings, dispatcher_, source_,
                                             metrics_, Prefixed());
      } catch (const std::exception& error) {
        if (!Failed(error.what(), backoff)) return;
        continue;
      }
      {
        std::lock_guard lock(mutex_);
        if (stopping_) return;
        group_ = group;
        relaying_ = true;
        problem_.clear();
      }
      backoff.Succeeded();
      Log(LogLevel::kInfo,
          "database " + database_.name + ": relaying " + database_.settings->Description());
      bool ok = false;
      try {
        ok = group->Run();
      } catch (const std::exception& error) {
        Log(LogLevel::kError, "database " + database_.name + ": " + error.what());
      }
      {
        std::lock_guard lock(mutex_);
        relaying_ = false;
        if (stopping_) return;
      }
      if (!Failed(ok ? "its relay stopped" : "WAL mode failed (see above)", backoff)) return;
    }
  }

  // Reports `why` (a warning when it is new, then at debug level: a database down for an hour is
  // not a line every 30 s) and waits out the backoff; false when stopped meanwhile.
  bool Failed(const std::string& why, outbox::Backoff& backoff) {
    const auto wait = backoff.Failed();
    std::unique_lock lock(mutex_);
    const bool repeated = problem_ == why;
    problem_ = why;
    lock.unlock();
    Log(repeated ? LogLevel::kDebug : LogLevel::kWarn,
        "database " + database_.name + " is not relayed: " + why + "; trying again in " +
            std::to_string(wait.count()) + " ms");
    lock.lock();
    return !wake_.wait_for(lock, wait, [this] { return stopping_; });
  }

  const NamedDatabase database_;
  const RelayGroup::Settings& settings_;
  const std::shared_ptr<Dispatcher> dispatcher_;
  const RelayGroup::Source source_;
  observe::Registry& metrics_;
  const LogFn log_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;              // guarded by mutex_
  bool relaying_ = false;              // guarded by mutex_
  std::string problem_ = "starting";   // guarded by mutex_
  std::shared_ptr<RelayGroup> group_;  // guarded by mutex_; kept after Run for its counters
  std::thread thread_;                 // last: starts once the rest is built
};

TenantRelays::TenantRelays(RelayGroup::Settings settings, SinkMap sinks, observe::Registry& metrics,
                           LogFn log)
    : settings_(std::move(settings)), metrics_(metrics), log_(std::move(log)) {
  observe::Registry scratch;
  Relay::CheckOptions(
      TableRelayOptionsOf(settings_.relay, settings_.retry, settings_.retention, scratch));
  dispatcher_ = RelayGroup::MakeDispatcher(settings_, std::move(sinks), metrics_, log_);
}

TenantRelays::~TenantRelays() {
  Stop();
  std::vector<std::unique_ptr<Database>> running;
  {
    std::lock_guard lock(mutex_);
    for (auto& [name, database] : running_) running.push_back(std::move(database));
    running_.clear();
  }
  Retire(running);
}

void TenantRelays::Serve(const std::vector<NamedDatabase>& databases) {
  std::vector<std::unique_ptr<Database>> gone;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    std::set<std::string> named;
    for (const NamedDatabase& database : databases) named.insert(database.name);
    for (auto it = running_.begin(); it != running_.end();) {
      if (!named.contains(it->first)) {
        if (log_) log_(LogLevel::kInfo, "database " + it->first + ": no longer served; draining");
        gone.push_back(std::move(it->second));
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    for (const NamedDatabase& database : databases) {
      auto found = running_.find(database.name);
      if (found != running_.end()) {
        if (found->second->fingerprint() == database.fingerprint) continue;
        if (log_) {
          log_(LogLevel::kInfo, "database " + database.name + ": settings changed; restarting");
        }
        gone.push_back(std::move(found->second));
        running_.erase(found);
      }
      // A label per database up to kMaxLabelledDatabases (kept for a name once given), then one
      // shared by the rest.
      auto label = labels_.find(database.name);
      if (label == labels_.end()) {
        const bool own = labels_.size() < kMaxLabelledDatabases;
        label =
            labels_.emplace(database.name, own ? database.name : std::string{kOtherDatabasesLabel})
                .first;
      }
      RelayGroup::Source source{.database = database.name,
                                .metric_labels = {{"database", label->second}},
                                .metric_series_limit = (kMaxLabelledDatabases + 1) *
                                                       static_cast<std::size_t>(kFailureKindCount)};
      running_.emplace(database.name,
                       std::make_unique<Database>(database, settings_, dispatcher_,
                                                  std::move(source), metrics_, log_));
    }
  }
  Retire(gone);
}

void TenantRelays::Retire(std::vector<std::unique_ptr<Database>>& databases) {
  // Outside the lock: all drain at once, each on its thread; their counts stay in the totals.
  for (auto& database : databases) database->Stop();
  for (auto& database : databases) database->Finish();
  std::lock_guard lock(mutex_);
  for (auto& database : databases) database->AddTo(retired_);
  retired_.partitions_owned = 0;  // a gauge: what is held now
  databases.clear();
}

void TenantRelays::Run() {
  std::unique_lock lock(mutex_);
  stopped_.wait(lock, [this] { return stopping_; });
  std::vector<std::unique_ptr<Database>> running;
  for (auto& [name, database] : running_) running.push_back(std::move(database));
  running_.clear();
  lock.unlock();
  Retire(running);
}

void TenantRelays::Stop() {
  std::lock_guard lock(mutex_);
  stopping_ = true;
  stopped_.notify_all();
}

std::vector<TenantRelays::DatabaseState> TenantRelays::States() const {
  std::lock_guard lock(mutex_);
  std::vector<DatabaseState> states;
  states.reserve(running_.size());
  for (const auto& [name, database] : running_) states.push_back(database->State());
  return states;
}

TenantRelays::Totals TenantRelays::CountersTotal() const {
  std::lock_guard lock(mutex_);
  Totals totals = retired_;
  for (const auto& [name, database] : running_) database->AddTo(totals);
  return totals;
}

std::vector<Relay::PausedTarget> TenantRelays::paused_targets() const {
  return dispatcher_->Paused();
}

}  // namespace outbox
