#pragma once
// How an idle relay learns that messages were committed, without polling. Implemented by each
// store (PostgreSQL: LISTEN/NOTIFY plus an idle flag that writers check).
//
// Protocol, run by the relay when a claim comes back short:
//   1. safe = AnnounceIdle();   // writers will now notify
//   2. claim again;             // catches what committed before writers could see the flag
//   3. if nothing: Wait(until now + (safe ? sweep interval : a few milliseconds))
// `safe` is false while a writer that may not have seen the flag is still to commit; its message
// would then arrive without a notification, so the relay must look again soon.
//
// Threading: one thread calls AnnounceIdle and Wait; Interrupt may be called from any thread.

#include "outbox/core/clock.h"

namespace outbox {

class Wakeup {
 public:
  virtual ~Wakeup() = default;

  // Marks the relay idle. Returns true when every writer that could have missed the mark has
  // finished. Throws StoreError when the database is unreachable.
  virtual bool AnnounceIdle() = 0;

  // Blocks until a notification arrives, Interrupt() is called or `deadline` passes. Returns true
  // unless the deadline passed. A lost connection is re-established and counts as a wake-up.
  virtual bool Wait(Deadline deadline) = 0;

  // Makes the current or next Wait return at once. Thread-safe; never throws.
  virtual void Interrupt() = 0;
};

}  // namespace outbox
