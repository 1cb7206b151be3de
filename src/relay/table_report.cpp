#include "table_report.h"

namespace outbox::relay {
namespace {

constexpr std::array<FailureKind, kFailureKindCount> kFailureKinds{
    FailureKind::kUnavailable, FailureKind::kRejected, FailureKind::kPermanent,
    FailureKind::kLeaseLost, FailureKind::kOutcomeUnknown};

observe::Labels Reason(FailureKind kind) { return {{"reason", std::string{NameOf(kind)}}}; }

}  // namespace

RelayMetrics::RelayMetrics(const observe::Scope& into)
    : registry(into.registry()),
      claimed(into.AddCounter("outbox_relay_claimed_total",
                              "Messages claimed (leased) by this relay.")),
      claim_batch_size(into.AddHistogram("outbox_relay_claim_batch_size",
                                         "Messages per non-empty claim by this relay.",
                                         observe::SizeBuckets())),
      claim_seconds(into.AddHistogram(
          "outbox_relay_claim_seconds",
          "Duration of each claim statement of this relay (it also settles the batch before).",
          observe::LatencyBuckets())),
      published(into.AddCounter(
          "outbox_published_total",
          "Messages confirmed by the broker and recorded as published by this relay.")),
      retries(into.AddCounter(
          "outbox_retries_total",
          "Messages that failed to publish (or were held back) and will be published again.")),
      held_back(into.AddCounter(
          "outbox_held_back_total",
          "Messages sent back unsettled because an earlier message of their stream failed.")),
      throttled(into.AddCounter(
          "outbox_relay_throttled_total",
          "Messages claimed, then given back untouched because their target was over its "
          "max_rate: what a rate limit costs the database.")),
      lease_lost(into.AddCounter(
          "outbox_relay_lease_lost_total",
          "Messages whose lease expired or was taken over before their outcome was recorded.")),
      store_errors(into.AddCounter("outbox_relay_store_errors_total",
                                   "Database calls of the relay that failed.")),
      publish_latency(into.AddHistogram(
          "outbox_publish_latency_seconds",
          "From the writer's transaction (created_at, the database's now()) to the broker's "
          "confirmation, per published message.",
          observe::LatencyBuckets())),
      leases_held(into.AddGauge("outbox_relay_leases_held",
                                "Messages this relay holds leases on right now.")),
      partitions_owned(into.AddGauge(
          "outbox_relay_partitions_owned",
          "Partitions this relay holds the lease of (with several relays per database).")),
      live_instances(into.AddGauge(
          "outbox_relay_live_instances",
          "Relays with a live heartbeat on this database, as of this relay's last heartbeat.")),
      rebalances(into.AddCounter("outbox_relay_rebalances_total",
                                 "Partitions this relay took while free or handed back to make "
                                 "room for another relay.")),
      takeovers(into.AddCounter(
          "outbox_relay_takeovers_total",
          "Partitions this relay took over from another relay whose lease had expired.")) {
  for (const FailureKind kind : kFailureKinds) {
    failures[static_cast<std::size_t>(kind)] = &into.AddCounter(
        "outbox_publish_failures_total", "Failed publishes, by failure kind.", Reason(kind));
  }
  for (const FailureKind kind : {FailureKind::kRejected, FailureKind::kPermanent}) {
    abandoned[static_cast<std::size_t>(kind)] = &into.AddCounter(
        "outbox_abandoned_total",
        "Messages abandoned by this relay: rejected with no attempts left, or permanent.",
        Reason(kind));
  }
}

void TableReport::StoreFailed(const StoreError& error) {
  ++counters.store_errors;
  counters.database_failing = true;
  metrics.store_errors.Increment();
  metrics.registry.RecordError("store", error.what());
}

void TableReport::LeaseLost(const SettleResult& result) {
  counters.lease_lost += result.lease_lost.size();
  metrics.lease_lost.Increment(result.lease_lost.size());
}

void TableReport::LeasesHeld(std::size_t claimed, std::size_t settled) {
  metrics.leases_held.Add(static_cast<double>(claimed) - static_cast<double>(settled));
}

void TableReport::Completed(const SettleResult& result) {
  counters.published += static_cast<std::uint64_t>(result.settled);
  metrics.published.Increment(static_cast<std::uint64_t>(result.settled));
  LeaseLost(result);
}

}  // namespace outbox::relay
