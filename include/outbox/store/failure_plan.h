#pragma once
// What a store writes for a failed publish: the one place that turns a Failure, the attempts
// already spent and the RetryPolicy into "retry after this delay" or "abandon". Every store uses
// it, so they cannot disagree.

#include <algorithm>
#include <chrono>
#include <optional>

#include "outbox/core/retry_policy.h"
#include "outbox/store/store.h"

namespace outbox {

struct FailurePlan {
  bool abandon = false;                // status becomes abandoned, with the reason
  bool spend_attempt = false;          // attempts + 1
  std::chrono::milliseconds delay{0};  // claimable again at now + delay (when not abandoned)
};

// nullopt for a failure that leaves the message alone (the lease was lost: its new owner settles
// it). `random` feeds the retry jitter.
inline std::optional<FailurePlan> PlanFailure(const FailedMessage& failed, const RetryPolicy& retry,
                                              UniformRandom& random) {
  const FailureTreatment treatment = failed.failure.treatment();
  if (!treatment.keep_lease) return std::nullopt;
  FailurePlan plan;
  plan.spend_attempt = treatment.spends_attempt;
  const int attempts = failed.attempts + (treatment.spends_attempt ? 1 : 0);
  plan.abandon = treatment.abandon_now || (treatment.spends_attempt && retry.Exhausted(attempts));
  if (treatment.spends_attempt && !plan.abandon) plan.delay = retry.Delay(attempts, random);
  if (!plan.abandon) plan.delay = std::max(plan.delay, failed.failure.retry_after);
  return plan;
}

}  // namespace outbox
