#pragma once
// When a failed message is tried again, and when it is given up on.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "outbox/core/random.h"

namespace outbox {

struct RetryPolicy {
  // Delay after the first failed attempt; doubles (by `multiplier`) after each further one.
  std::chrono::milliseconds initial_delay{std::chrono::seconds{1}};
  // Cap of the un-jittered delay.
  std::chrono::milliseconds max_delay{std::chrono::minutes{5}};
  double multiplier = 2.0;
  // Each delay is spread uniformly over [d * (1 - jitter), d * (1 + jitter)] so that messages that
  // failed together do not retry together. The longest possible delay is max_delay * (1 + jitter).
  double jitter = 0.25;
  // Attempts (spent by rejections, see FailureTreatment) after which a message is abandoned.
  int max_attempts = 10;
  // The targets whose on_abandon default is "hold" (outboxd: the sinks that say so): there an
  // abandoned keyed message holds its (target, stream) until an operator replays or skips it,
  // unless its topic's own on_abandon (PostgreSQL: topic_settings) says otherwise. The others
  // "continue": the stream goes on past it.
  std::vector<std::string> hold_targets;

  // A description of the first invalid field, naming it; nullopt when the policy is valid.
  [[nodiscard]] std::optional<std::string> Validate() const;

  // The un-jittered delay after `failed_attempts` (>= 1) failed attempts.
  [[nodiscard]] std::chrono::milliseconds BaseDelay(int failed_attempts) const;
  // The jittered delay after `failed_attempts` failed attempts; `random` yields [0, 1).
  [[nodiscard]] std::chrono::milliseconds Delay(int failed_attempts, UniformRandom& random) const;
  // True when a message that has spent `failed_attempts` attempts must be abandoned.
  [[nodiscard]] bool Exhausted(int failed_attempts) const {
    return failed_attempts >= max_attempts;
  }
};

}  // namespace outbox
