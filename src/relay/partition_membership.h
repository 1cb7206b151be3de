#pragma once
// The table relay's share of the partitions, when relays share a database
// (outbox/store/partitions.h): a heartbeat on a thread (and connection) of its own, so that a slow
// batch never lets a live relay's leases expire. It keeps what the last heartbeat found (the
// partitions this relay may claim from, those taken over by another relay, those beyond its fair
// share) and hands partitions back when the relay's loop asks, once their outcomes are recorded
// (the next owner would find them fenced and publish them again).
//
// An idle relay (issue #42: hundreds of idle databases in one process) renews its leases for
// Timing::idle_lease instead of Timing::lease, so its heartbeat comes less often, and (when the
// idle lease is the longer) it is told whether the database holds anything unfinished: while not,
// the relay skips its sweeps, and a heartbeat that finds something wakes it. Its first claim that
// finds work renews at once for the short lease. Heartbeats are spread (each wait 80-100 % of a
// third of the lease), so that the databases of one process do not all heartbeat in the same
// instant.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "outbox/store/partitions.h"
#include "table_report.h"

namespace outbox::relay {

class PartitionMembership {
 public:
  using SteadyClock = std::chrono::steady_clock;
  struct Timing {
    std::chrono::milliseconds lease;
    std::chrono::milliseconds idle_lease;  // at least lease
    std::chrono::milliseconds sweep_interval;
    std::chrono::milliseconds max_backoff;
  };

  // `wake` is called when partitions were gained or lost: an idle relay claims at once.
  PartitionMembership(PartitionLeases& leases, std::string owner, Timing timing,
                      TableReport& report, std::function<void()> wake);
  ~PartitionMembership();  // stops and joins the heartbeat thread
  PartitionMembership(const PartitionMembership&) = delete;
  PartitionMembership& operator=(const PartitionMembership&) = delete;

  void Start();  // the heartbeat thread
  void Stop();   // asks it to end; thread-safe
  void Join();

  // The partitions to claim from (held, minus the surplus), with their lease epochs.
  [[nodiscard]] std::vector<PartitionLease> Claimable() const;
  // Surplus partitions wait to be handed back, and none is being handed back now.
  [[nodiscard]] bool HandBackPending() const;
  // The partitions found taken over since the last call (their leases are void).
  std::set<int> TakeLost();
  // The partitions beyond the fair share, unless a hand-back is already under way.
  [[nodiscard]] std::set<int> Surplus() const;
  // Asks the heartbeat thread to hand `partitions` back now.
  void HandBack(const std::set<int>& partitions);
  // Hands every partition back (at stop).
  void Leave();
  // The relay's loop: idle (about to wait for work) or not (a claim found work). Idle for a whole
  // lease, the heartbeat renews for the idle lease; work after that renews at once.
  void SetIdle(bool idle);
  // The last heartbeat succeeded and found no message waiting, leased or failed: an idle relay
  // needs no sweep (lost notifications are found by the next heartbeat, which then wakes it).
  [[nodiscard]] bool NothingUnfinished() const;

 private:
  void HeartbeatLoop();
  // One heartbeat (on the heartbeat thread); returns when the next is due.
  SteadyClock::time_point Heartbeat(const std::vector<int>& release);

  PartitionLeases& leases_;
  const std::string owner_;
  const Timing timing_;
  // The heartbeat stands in for an idle relay's sweeps (an idle lease longer than the lease).
  const bool replaces_sweeps_;
  TableReport& report_;
  const std::function<void()> wake_;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool stop_ = false;                      // guarded by mutex_, as everything below
  std::set<int> owned_;                    // held as of the last heartbeat
  bool failed_ = false;                    // the last heartbeat failed (the heartbeat thread's)
  std::set<int> surplus_;                  // held beyond the fair share: to hand back
  std::vector<PartitionLease> claimable_;  // owned minus surplus, with epochs
  std::set<int> lost_;                     // taken over; not yet dropped from the batch
  std::vector<int> release_;               // to hand back at the next heartbeat (now)
  bool idle_ = false;                      // the relay waits for work
  SteadyClock::time_point idle_since_{};
  bool renew_now_ = false;                  // busy again after an idle lease: heartbeat now
  std::chrono::milliseconds last_lease_{};  // what the last heartbeat asked for
  std::optional<bool> unfinished_;          // the last heartbeat's finding; none after a failure
  std::minstd_rand spread_{std::random_device{}()};  // the heartbeat thread's
};

}  // namespace outbox::relay
