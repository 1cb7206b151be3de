#pragma once
// What becomes of each message of a WAL batch once the sinks have answered: published, or parked
// in outbox.messages (failed or abandoned when rejected; waiting, unattempted, when its target's
// broker is down or it follows a parked message of its stream), or, when no target could take
// anything, nothing: an outage, and the batch is read and published again. The ledger's commit
// (WalLedger::Commit) then makes the decision durable.

#include <optional>
#include <string>
#include <vector>

#include "outbox/core/log.h"
#include "outbox/core/random.h"
#include "outbox/core/retry_policy.h"
#include "outbox/relay/dispatcher.h"
#include "wal_batch.h"

namespace outbox::relay {

class WalSettler {
 public:
  // `retry`: a rejected message is parked due after Delay(1); abandoned at once when
  // max_attempts is 1. `dispatcher`: which targets are paused.
  WalSettler(RetryPolicy retry, const Dispatcher& dispatcher, LogFn log);

  // Fills batch.commit.parked, batch.published and batch.broken from `outcomes` (one per
  // batch.to_publish). Returns what went wrong when it is an outage: nothing may be committed,
  // and the batch must be read and published again.
  std::optional<std::string> Decide(Batch& batch, const std::vector<PublishOutcome>& outcomes);

 private:
  void Log(LogLevel level, const std::string& message) const;

  const RetryPolicy retry_;
  const Dispatcher& dispatcher_;
  LogFn log_;
  UniformRandom random_;
};

}  // namespace outbox::relay
