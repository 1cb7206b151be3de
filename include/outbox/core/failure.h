#pragma once
// The one classification of failures used by every store, sink and the relay (STYLE.md point 5).
// Broker and database failures are values of this type, not exceptions.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace outbox {

enum class FailureKind : std::uint8_t {
  // The broker or database is not reachable, or the connection broke before anything was sent.
  // Retry with backoff; no attempt is spent, so an hour-long outage abandons nothing.
  kUnavailable,
  // The broker refused this message (nack, returned as unroutable, queue full). Retry with
  // backoff, one attempt spent; abandoned when the attempts run out.
  kRejected,
  // This message can never succeed as it is (over the broker's size limit, malformed for the
  // target). Abandoned at once with the reason, kept for an operator to replay.
  kPermanent,
  // The caller no longer holds the lease on this message (it expired or another relay took it).
  // Stop: do not complete or fail it; its new owner will.
  kLeaseLost,
  // The message was sent but no confirmation arrived (connection lost, deadline passed). Treated
  // as not published: it is published again, and the inbox removes the duplicate.
  kOutcomeUnknown,
};

inline constexpr int kFailureKindCount = 5;

// What the relay does about a failure of a given kind.
struct FailureTreatment {
  bool spends_attempt;  // counts toward max_attempts
  bool retry;           // the message is published again later
  bool abandon_now;     // the message is abandoned without further attempts
  bool keep_lease;      // the caller may still complete or fail the message
};

constexpr FailureTreatment TreatmentOf(FailureKind kind) {
  switch (kind) {
    case FailureKind::kUnavailable:
      return {.spends_attempt = false, .retry = true, .abandon_now = false, .keep_lease = true};
    case FailureKind::kRejected:
      return {.spends_attempt = true, .retry = true, .abandon_now = false, .keep_lease = true};
    case FailureKind::kPermanent:
      return {.spends_attempt = true, .retry = false, .abandon_now = true, .keep_lease = true};
    case FailureKind::kLeaseLost:
      return {.spends_attempt = false, .retry = false, .abandon_now = false, .keep_lease = false};
    case FailureKind::kOutcomeUnknown:
      return {.spends_attempt = false, .retry = true, .abandon_now = false, .keep_lease = true};
  }
  return {.spends_attempt = true, .retry = false, .abandon_now = true, .keep_lease = true};
}

// Stable lower-case names ("unavailable", "rejected", ...) used in logs, metrics and the database.
std::string_view NameOf(FailureKind kind);
std::optional<FailureKind> ParseFailureKind(std::string_view name);

struct Failure {
  FailureKind kind = FailureKind::kUnavailable;
  std::string reason;  // human-readable, e.g. "NOT_FOUND - no exchange 'orders'"
  // The destination asked not to be sent anything for this long (an HTTP endpoint's
  // Retry-After): the message is not claimed again sooner, whatever the retry policy says. 0: no
  // such request.
  std::chrono::milliseconds retry_after{0};

  [[nodiscard]] FailureTreatment treatment() const { return TreatmentOf(kind); }
  // "rejected: NOT_FOUND - no exchange 'orders'"
  [[nodiscard]] std::string Describe() const;
};

}  // namespace outbox
