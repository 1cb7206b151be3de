#include "wal_slot_watch.h"

#include <utility>

#include "outbox/store/store.h"

namespace outbox::relay {
namespace {

// How often a missing slot is logged again while the relay waits for it.
constexpr std::chrono::milliseconds kGoneLogEvery{60000};

}  // namespace

WalSlotWatch::WalSlotWatch(WalLedger& ledger, WalMetrics& metrics, LogFn log)
    : ledger_(ledger), metrics_(metrics), log_(std::move(log)) {}

void WalSlotWatch::Check(const std::string& last_error) {
  const auto now = SteadyClock::now();
  if (now < next_check_) return;
  next_check_ = now + kCheckEvery;
  std::optional<std::string> problem;
  try {
    const WalSlotState state = ledger_.SlotState();
    metrics_.slot_active.Set(state.active ? 1.0 : 0.0);
    metrics_.slot_retained_bytes.Set(static_cast<double>(state.retained_bytes));
    metrics_.slot_unconfirmed_bytes.Set(static_cast<double>(state.unconfirmed_bytes));
    metrics_.slot_flush_lag_seconds.Set(state.flush_lag_seconds.value_or(0.0));
    if (!state.exists) {
      problem = "the replication slot does not exist (outboxctl migrate --wal-slot)";
    } else if (state.wal_status == "lost") {
      problem = "the replication slot is lost (its WAL was removed): see the README, WAL mode";
    } else if (!state.active) {
      problem = "no relay is reading the replication slot" +
                (last_error.empty() ? std::string{} : " (this one: " + last_error + ")");
    }
  } catch (const StoreError& error) {
    problem = "the slot's state could not be read: " + std::string{error.what()};
  }
  SetProblem(std::move(problem));
}

bool WalSlotWatch::Exists() {
  const WalSlotState state = ledger_.SlotState();
  return state.exists && state.wal_status != "lost";
}

bool WalSlotWatch::IsGone() {
  try {
    return !Exists();
  } catch (const StoreError&) {
    return false;
  }
}

void WalSlotWatch::Gone(const std::string& what, Lsn position) {
  const auto now = SteadyClock::now();
  metrics_.slot_missing.Set(1.0);
  if (!gone_since_) {
    gone_since_ = now;
    gone_at_ = position;
  }
  if (now >= next_gone_log_) {
    next_gone_log_ = now + kGoneLogEvery;
    metrics_.registry.RecordError("wal", what);
    if (log_) {
      log_(LogLevel::kError,
           "WAL mode has no slot to read: " + what +
               ". Enqueues in WAL mode fail until it is made again (outboxctl migrate --wal-slot) "
               "or delivery is set to 'table'; messages committed in WAL mode after " +
               FormatLsn(gone_at_) +
               " that this relay had not read when the slot went are not in any slot. Looking "
               "for the slot again every " +
               std::to_string(kCheckEvery.count() / 1000) + " s");
    }
  }
  SetProblem("the replication slot is gone: " + what);
  next_check_ = {};
}

std::optional<std::chrono::seconds> WalSlotWatch::Back() {
  if (!gone_since_) return std::nullopt;
  const auto gone =
      std::chrono::duration_cast<std::chrono::seconds>(SteadyClock::now() - *gone_since_);
  gone_since_.reset();
  metrics_.slot_missing.Set(0.0);
  return gone;
}

std::optional<std::string> WalSlotWatch::Problem() const {
  std::lock_guard lock(mutex_);
  return problem_;
}

void WalSlotWatch::SetProblem(std::optional<std::string> problem) {
  std::lock_guard lock(mutex_);
  problem_ = std::move(problem);
}

}  // namespace outbox::relay
