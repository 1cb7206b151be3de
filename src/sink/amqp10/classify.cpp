#include "classify.h"

#include <string>

namespace outbox::amqp10 {
namespace {

// "amqp:not-found: no queue 'x'" (or one of them alone, or `fallback`).
std::string Condition(std::string_view condition, std::string_view description,
                      std::string_view fallback) {
  if (condition.empty() && description.empty()) return std::string{fallback};
  if (condition.empty()) return std::string{description};
  if (description.empty()) return std::string{condition};
  return std::string{condition} + ": " + std::string{description};
}

}  // namespace

bool IsDestinationState(std::string_view condition) {
  // The relay's credentials or permissions (Service Bus: a SAS key without Send rights; RabbitMQ:
  // no write permission on the exchange), a quota or throttling, an entity locked by another
  // client: granting, waiting or unlocking fixes them, the message is not at fault.
  return condition == "amqp:unauthorized-access" || condition == "amqp:resource-limit-exceeded" ||
         condition == "amqp:resource-locked" || condition == "com.microsoft:server-busy";
}

std::optional<Failure> ClassifyDisposition(Disposition disposition, std::string_view condition,
                                           std::string_view description) {
  switch (disposition) {
    case Disposition::kAccepted:
      return std::nullopt;
    case Disposition::kRejected:
      if (condition == "amqp:link:message-size-exceeded") {
        return Failure{.kind = FailureKind::kPermanent,
                       .reason = "rejected by the broker as too large: " +
                                 Condition(condition, description, "")};
      }
      if (IsDestinationState(condition)) {
        return Failure{.kind = FailureKind::kUnavailable,
                       .reason = "not taken, the destination refuses the relay for now: " +
                                 Condition(condition, description, "")};
      }
      return Failure{.kind = FailureKind::kRejected,
                     .reason = "rejected by the broker: " +
                               Condition(condition, description, "no error condition given")};
    case Disposition::kReleased:
      // Not taken, no fault of the message (RabbitMQ 4: no queue bound for it). An attempt is
      // spent all the same: see sink/amqp10.h.
      return Failure{.kind = FailureKind::kRejected,
                     .reason = "released by the broker (not taken: e.g. nothing bound to take it)"};
    case Disposition::kModified:
      return Failure{.kind = FailureKind::kRejected,
                     .reason = "modified by the broker (not taken, delivery failed)"};
  }
  return Failure{.kind = FailureKind::kOutcomeUnknown, .reason = "an unknown disposition"};
}

Failure ClassifyLinkRefusal(std::string_view address, std::string_view condition,
                            std::string_view description) {
  const std::string what = "the broker refused the link to '" + std::string{address} + "': " +
                           Condition(condition, description, "detached without an error condition");
  if (IsDestinationState(condition)) {
    return Failure{.kind = FailureKind::kUnavailable, .reason = "not sent: " + what};
  }
  return Failure{.kind = FailureKind::kRejected, .reason = "not sent: " + what};
}

}  // namespace outbox::amqp10
