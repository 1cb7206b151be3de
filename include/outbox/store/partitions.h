#pragma once
// The PartitionLeases contract: how relays sharing one database divide its partitions, with no
// coordinator but that database. Every message belongs to one partition (core/partition.h); a
// partition is published by the one relay that holds its lease, so a stream (which lives in one
// partition) is published by one relay at a time, in order.
//
// Each relay calls Heartbeat every Membership::next_heartbeat: it registers the relay (live until
// now + lease), renews the relay's partition leases, hands back what it was asked to release and
// takes free or expired partitions up to its fair share. Fair share: the live relays, ordered by
// owner, get ceil(partitions / live) or floor(...) each, so that the shares add up. A relay over
// its share is told which partitions are surplus; it stops claiming from them, settles what it has
// in flight and releases them with its next call. Every lease write is "if still the owner, or
// expired", judged on the database's clock.
//
// Fencing: taking a partition increments its epoch and, in the same transaction, voids the
// message leases any other owner still held in it (those messages become claimable again, and a
// completion by the old owner no longer matches). Store::Claim with ClaimRequest::partitions
// claims only from partitions still held under the given epochs, and waits for (or is excluded
// by) a concurrent takeover, so a claim is never granted under a lease that was taken over.
//
// A PartitionLeases object is used by one thread at a time (it owns a database connection).
// Errors: StoreError (kUnavailable / kOutcomeUnknown: call again), std::invalid_argument.

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace outbox {

// A partition held under a lease epoch: claims name both, and are refused when the epoch is stale.
struct PartitionLease {
  int partition = 0;
  std::int64_t epoch = 0;
  bool operator==(const PartitionLease&) const = default;
};

// What one heartbeat found and did.
struct Membership {
  int partition_count = 0;  // fixed per database (settings.partition_count)
  int live_instances = 0;   // relays with an unexpired heartbeat, this one included
  int fair_share = 0;       // this relay's share: ceil or floor of partitions / live relays
  // Held now, ascending by partition; includes the surplus.
  std::vector<PartitionLease> owned;
  // Owned beyond the fair share: stop claiming from them and pass them as `release` next time.
  std::vector<int> surplus;
  int acquired = 0;    // partitions this call took (free, released, or expired)
  int taken_over = 0;  // of those, how many were still held by another owner whose lease expired
  int released = 0;    // partitions this call handed back
  // When to call again: a third of the lease, or sooner when another relay's lease is about to
  // expire (so that its partitions are taken over promptly).
  std::chrono::milliseconds next_heartbeat{0};
  // Whether any message is waiting, leased or failed (pending, processing or failed: anything a
  // claim or a sweep could act on), as the heartbeat's statement saw it; nullopt when the store
  // does not say. An idle relay told false skips its sweeps until a heartbeat says true.
  std::optional<bool> unfinished;
};

class PartitionLeases {
 public:
  virtual ~PartitionLeases() = default;

  // One transaction: register or renew `owner`, hand back `release` (messages `owner` still has
  // leased there become pending), renew the rest, take free or expired partitions up to the fair
  // share. `lease` applies to the relay's registration and to its partition leases.
  virtual Membership Heartbeat(std::string_view owner, std::chrono::milliseconds lease,
                               std::span<const int> release) = 0;

  // Clean shutdown: hands back every partition `owner` holds and deregisters it, so that the
  // others take its partitions at their next heartbeat instead of after the lease.
  virtual void Leave(std::string_view owner) = 0;
};

}  // namespace outbox
