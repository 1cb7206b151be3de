#include "partition_membership.h"

#include <algorithm>
#include <utility>

namespace outbox::relay {
namespace {

// A relay below its fair share of partitions (others are handing theirs back), or whose heartbeat
// failed, heartbeats again this soon at the latest, however long its idle sweep.
constexpr std::chrono::milliseconds kRebalanceLook{1000};

}  // namespace

PartitionMembership::PartitionMembership(PartitionLeases& leases, std::string owner, Timing timing,
                                         TableReport& report, std::function<void()> wake)
    : leases_(leases),
      owner_(std::move(owner)),
      timing_(timing),
      replaces_sweeps_(timing.idle_lease > timing.lease),
      report_(report),
      wake_(std::move(wake)) {}

PartitionMembership::~PartitionMembership() {
  Stop();
  if (thread_.joinable()) thread_.join();
}

void PartitionMembership::Start() {
  thread_ = std::thread([this] { HeartbeatLoop(); });
}

void PartitionMembership::Stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
}

void PartitionMembership::Join() {
  if (thread_.joinable()) thread_.join();
}

std::vector<PartitionLease> PartitionMembership::Claimable() const {
  std::lock_guard lock(mutex_);
  return claimable_;
}

bool PartitionMembership::HandBackPending() const {
  std::lock_guard lock(mutex_);
  return release_.empty() && !surplus_.empty();
}

std::set<int> PartitionMembership::TakeLost() {
  std::lock_guard lock(mutex_);
  std::set<int> lost;
  lost.swap(lost_);
  return lost;
}

std::set<int> PartitionMembership::Surplus() const {
  std::lock_guard lock(mutex_);
  return release_.empty() ? surplus_ : std::set<int>{};
}

void PartitionMembership::HandBack(const std::set<int>& partitions) {
  {
    std::lock_guard lock(mutex_);
    release_.assign(partitions.begin(), partitions.end());
  }
  changed_.notify_all();
}

void PartitionMembership::Leave() {
  try {
    leases_.Leave(owner_);
  } catch (const StoreError& error) {
    report_.StoreFailed(error);
    report_.Log(LogLevel::kWarn,
                "handing back partitions failed (they are free when the lease expires): " +
                    std::string{error.what()});
  }
}

void PartitionMembership::SetIdle(bool idle) {
  bool renew = false;
  {
    std::lock_guard lock(mutex_);
    if (idle == idle_) return;
    idle_ = idle;
    if (idle) idle_since_ = SteadyClock::now();
    renew = !idle && last_lease_ > timing_.lease;
    renew_now_ = renew_now_ || renew;
  }
  if (renew) changed_.notify_all();
}

bool PartitionMembership::NothingUnfinished() const {
  // Elsewhere the sweep keeps its interval, as chosen.
  if (!replaces_sweeps_) return false;
  std::lock_guard lock(mutex_);
  return unfinished_.has_value() && !*unfinished_;
}

void PartitionMembership::HeartbeatLoop() {
  std::unique_lock lock(mutex_);
  auto next = SteadyClock::now();
  while (!stop_) {
    changed_.wait_until(lock, next, [&] {
      return stop_ || !release_.empty() || renew_now_ || SteadyClock::now() >= next;
    });
    if (stop_) return;
    const std::vector<int> release = release_;
    renew_now_ = false;
    lock.unlock();
    next = Heartbeat(release);
    lock.lock();
    release_.clear();
  }
}

// One heartbeat (on the heartbeat thread); returns when the next is due.
PartitionMembership::SteadyClock::time_point PartitionMembership::Heartbeat(
    const std::vector<int>& release) {
  const auto now = SteadyClock::now();
  std::chrono::milliseconds lease = timing_.lease;
  {
    std::lock_guard lock(mutex_);
    // Idle for a whole lease: a database written to now and then (a message every few seconds)
    // keeps the short lease, and is taken over within it if this relay dies.
    if (idle_ && now - idle_since_ >= timing_.lease) lease = timing_.idle_lease;
    last_lease_ = lease;
  }
  Membership membership;
  try {
    membership = leases_.Heartbeat(owner_, lease, release);
  } catch (const StoreError& error) {
    report_.StoreFailed(error);
    report_.Log(LogLevel::kWarn, "partition heartbeat failed: " + std::string{error.what()});
    failed_ = true;
    {
      std::lock_guard lock(mutex_);
      unfinished_.reset();
    }
    // The claims check the leases themselves: expired ones claim nothing.
    return now + std::min({timing_.sweep_interval, timing_.max_backoff, kRebalanceLook});
  }
  std::set<int> now_owned;
  for (const auto& held : membership.owned) now_owned.insert(held.partition);
  std::set<int> lost;
  bool gained = false;
  bool found_work = false;  // an idle relay that skipped its sweeps has something to do
  {
    std::lock_guard lock(mutex_);
    found_work =
        replaces_sweeps_ && idle_ && unfinished_ == false && membership.unfinished != false;
    unfinished_ = membership.unfinished;
    for (const int partition : owned_) {
      const bool released = std::find(release.begin(), release.end(), partition) != release.end();
      if (!released && !now_owned.contains(partition)) lost.insert(partition);
    }
    for (const int partition : now_owned) gained = gained || !owned_.contains(partition);
    lost_.insert(lost.begin(), lost.end());
    owned_ = std::move(now_owned);
    surplus_ = {membership.surplus.begin(), membership.surplus.end()};
    claimable_.clear();
    for (const auto& held : membership.owned) {
      if (!surplus_.contains(held.partition)) claimable_.push_back(held);
    }
  }
  if (!lost.empty()) {
    report_.Log(LogLevel::kWarn, std::to_string(lost.size()) +
                                     " partitions were taken over by another relay (this relay's "
                                     "lease expired: it stalled or lost the database); first " +
                                     std::to_string(*lost.begin()));
  }
  const int rebalanced = membership.acquired - membership.taken_over + membership.released;
  if (rebalanced > 0) report_.metrics.rebalances.Increment(static_cast<std::uint64_t>(rebalanced));
  if (membership.taken_over > 0) {
    report_.counters.takeovers += static_cast<std::uint64_t>(membership.taken_over);
    report_.metrics.takeovers.Increment(static_cast<std::uint64_t>(membership.taken_over));
  }
  const auto held = membership.owned.size();
  if (membership.acquired > 0 || membership.released > 0 || !lost.empty()) {
    report_.Log(LogLevel::kInfo, "partitions: " + std::to_string(held) + " of " +
                                     std::to_string(membership.partition_count) +
                                     " held (fair share " + std::to_string(membership.fair_share) +
                                     ", " + std::to_string(membership.live_instances) +
                                     " live relays; took " + std::to_string(membership.acquired) +
                                     ", of them " + std::to_string(membership.taken_over) +
                                     " from expired leases; handed back " +
                                     std::to_string(membership.released) + ")");
  }
  report_.counters.partitions_owned = static_cast<int>(held);
  report_.metrics.partitions_owned.Set(static_cast<double>(held));
  report_.metrics.live_instances.Set(static_cast<double>(membership.live_instances));
  // An idle relay claims at once: partitions gained or lost, or held again after failed
  // heartbeats (their leases may have expired meanwhile, and the claims then found nothing).
  const bool recovered = std::exchange(failed_, false);
  // And one with surplus partitions hands them back from its loop (KeepPartitions), which an idle
  // relay that skips its sweeps would not turn otherwise.
  if (gained || !lost.empty() || recovered || found_work || !membership.surplus.empty()) wake_();
  // Below its share, a relay looks again soon: others are handing partitions back.
  auto wait = membership.next_heartbeat;
  // A third of the lease (not sooner, for another relay's expiring lease): 80-100 % of it, so
  // that relays started together drift apart.
  if (wait >= lease / 3) {
    wait = std::chrono::milliseconds{
        std::uniform_int_distribution<std::int64_t>{wait.count() * 4 / 5, wait.count()}(spread_)};
  }
  if (static_cast<int>(held) < membership.fair_share) {
    wait = std::min({wait, timing_.sweep_interval, kRebalanceLook});
  }
  return now + wait;
}

}  // namespace outbox::relay
