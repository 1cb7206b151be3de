#pragma once
// How an idle relay learns that messages were committed, without polling. Implemented by each
// store (PostgreSQL: LISTEN/NOTIFY plus an idle mark that writers read without locking; see
// sql/006_wakeup.sql).
//
// Protocol, run by the relay when a claim comes back short:
//   1. AnnounceIdle();     // writers that commit from now on notify
//   2. claim again;        // catches what committed before writers could see the mark
//   3. if nothing: reason = Wait(now + sweep interval), then claim again. Announce again only
//      after kNotified or kReconnected (the mark was used up, or may have been missed); after the
//      other reasons it still stands.
//   4. when a claim finds work while the mark stands: Withdraw(), so that a busy relay's writers
//      do not notify.
// A writer that may have read the state from before AnnounceIdle and not yet committed would
// commit without notifying: Wait also returns (kWritersDone) once all such writers have ended,
// found by polling at a bounded rate, so that the relay looks once more.
//
// Threading: one thread calls AnnounceIdle, Withdraw and Wait; Interrupt may be called from any
// thread.

#include <cstdint>

#include "outbox/core/clock.h"

namespace outbox {

enum class WakeReason : std::uint8_t {
  kTimeout,      // the deadline passed
  kNotified,     // a writer committed messages (the idle mark is used up)
  kWritersDone,  // the writers that could have missed the mark have all ended
  kInterrupted,  // Interrupt() was called
  kReconnected,  // the connection was lost and re-established: notifications may be lost
};

class Wakeup {
 public:
  virtual ~Wakeup() = default;

  // Marks the relay idle. Throws StoreError when the database is unreachable.
  virtual void AnnounceIdle() = 0;

  // Takes back the idle mark of a relay that found work before any notification. Throws
  // StoreError when the database is unreachable (the mark then stands: writers notify more often
  // than needed, nothing is missed).
  virtual void Withdraw() = 0;

  // Blocks until one of WakeReason's events or the deadline. A lost connection is re-established
  // (kReconnected) or, if that fails, waited out without spinning.
  virtual WakeReason Wait(Deadline deadline) = 0;

  // Makes the current or next Wait return at once. Thread-safe; never throws.
  virtual void Interrupt() = 0;
};

}  // namespace outbox
