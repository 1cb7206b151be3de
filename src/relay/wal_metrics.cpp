#include "wal_metrics.h"

namespace outbox::relay {

WalMetrics::WalMetrics(const observe::Scope& into)
    : registry(into.registry()),
      transactions(into.AddCounter("outbox_wal_transactions_total",
                                   "Committed transactions with outbox messages read from the "
                                   "slot and handled (published or parked).")),
      published(
          into.AddCounter("outbox_wal_published_total",
                          "WAL-mode messages confirmed by the broker, their position committed.")),
      parked(into.AddCounter("outbox_wal_parked_total",
                             "WAL-mode messages parked in outbox.messages: rejected by their "
                             "sink, or behind an earlier parked message of their stream.")),
      undecodable(into.AddCounter(
          "outbox_wal_undecodable_total",
          "Logical messages with the outbox prefix that could not be decoded (not relayed).")),
      errors(into.AddCounter("outbox_wal_errors_total",
                             "Database and broker outages the WAL relay met (it reads the slot "
                             "again from its committed position).")),
      lag_bytes(into.AddGauge("outbox_wal_lag_bytes",
                              "WAL the server has sent past this relay's committed position.")),
      lag_seconds(into.AddGauge(
          "outbox_wal_lag_seconds",
          "Age of the oldest transaction read but not yet committed; 0 when caught up.")),
      active(into.AddGauge("outbox_wal_active",
                           "1 while this relay holds the slot's lease and reads it.")),
      slot_active(into.AddGauge(
          "outbox_wal_slot_active",
          "1 while some relay streams the slot (pg_replication_slots.active), as last checked.")),
      slot_retained_bytes(into.AddGauge(
          "outbox_wal_slot_retained_bytes",
          "WAL the server keeps for the slot (its position - restart_lsn), as last checked.")),
      slot_unconfirmed_bytes(
          into.AddGauge("outbox_wal_slot_unconfirmed_bytes",
                        "WAL written since the slot's confirmed position, as last checked.")),
      recovered(into.AddCounter(
          "outbox_wal_recovered_total",
          "WAL-mode messages read back from the WAL files (pg_walinspect) after the slot went, "
          "and published.")),
      slot_missing(into.AddGauge(
          "outbox_wal_slot_missing",
          "1 while the slot this relay read is gone (dropped, or its WAL lost): WAL-mode "
          "enqueues fail until it is made again.")),
      slot_flush_lag_seconds(into.AddGauge(
          "outbox_wal_slot_flush_lag_seconds",
          "How long the reader's confirmations trail the server's WAL, as the server measures "
          "it (pg_stat_replication.flush_lag); 0 when it shows none. As last checked.")),
      batch_seconds(
          into.AddHistogram("outbox_wal_batch_seconds",
                            "Duration of each WAL batch from its read to the ledger's commit "
                            "(with a backlog, its wait for the batch before it included).",
                            observe::LatencyBuckets())) {}

}  // namespace outbox::relay
