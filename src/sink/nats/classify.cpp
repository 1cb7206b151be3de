#include "classify.h"

#include <string>

namespace outbox::nats {
namespace {

std::string WithCode(std::string_view text, jsErrCode code) {
  return std::string{text} + " (err_code " + std::to_string(static_cast<int>(code)) + ")";
}

// JetStream answered that it cannot store anything right now, whatever the message: retried
// without spending an attempt, as an unreachable server would be.
bool IsServerUnavailable(jsErrCode code) {
  switch (code) {
    case JSClusterNotAvailErr:  // JetStream system temporarily unavailable
    case JSInsufficientResourcesErr:
    case JSMemoryResourcesExceededErr:
    case JSStorageResourcesExceededErr:
    case JSStreamOfflineErr:
    case JSNotEnabledErr:
    case JSNotEnabledForAccountErr:
      return true;
    default:
      return false;
  }
}

}  // namespace

bool IsConnectionLost(natsStatus status) {
  switch (status) {
    case NATS_CONNECTION_CLOSED:
    case NATS_CONNECTION_DISCONNECTED:
    case NATS_NOT_YET_CONNECTED:
    case NATS_STALE_CONNECTION:
    case NATS_IO_ERROR:
    case NATS_DRAINING:
      return true;
    default:
      return false;
  }
}

std::optional<Failure> ClassifyAck(natsStatus status, jsErrCode code, std::string_view text,
                                   std::string_view subject) {
  if (status == NATS_OK) return std::nullopt;
  if (status == NATS_NO_RESPONDERS) {
    return Failure{
        .kind = FailureKind::kRejected,
        .reason = "no stream listens on subject '" + std::string{subject} + "' (no responders)"};
  }
  if (status == NATS_TIMEOUT) {
    return Failure{.kind = FailureKind::kOutcomeUnknown,
                   .reason = "sent, but no ack from JetStream in time (" + std::string{text} + ")"};
  }
  if (code != 0) {
    if (code == JSStreamMessageExceedsMaximumErr) {
      return Failure{
          .kind = FailureKind::kPermanent,
          .reason = "JetStream: " + WithCode(text, code) + " (the stream's max_msg_size)"};
    }
    if (IsServerUnavailable(code)) {
      return Failure{.kind = FailureKind::kUnavailable,
                     .reason = "not stored, JetStream cannot store now: " + WithCode(text, code)};
    }
    return Failure{.kind = FailureKind::kRejected,
                   .reason = "JetStream refused it: " + WithCode(text, code)};
  }
  if (status == NATS_ERR) {
    return Failure{.kind = FailureKind::kRejected,
                   .reason = "JetStream refused it: " + std::string{text}};
  }
  // The ack could not be read, or the client gave up on it: the message may be stored.
  return Failure{.kind = FailureKind::kOutcomeUnknown,
                 .reason = "sent, but its ack was not understood: " + std::string{text}};
}

Failure ClassifyPublishError(natsStatus status, std::string_view text) {
  const std::string detail{text};
  switch (status) {
    case NATS_MAX_PAYLOAD:
      return Failure{.kind = FailureKind::kPermanent,
                     .reason = "over the server's max_payload: " + detail};
    case NATS_INVALID_SUBJECT:
    case NATS_INVALID_ARG:
      return Failure{.kind = FailureKind::kPermanent, .reason = "cannot be sent: " + detail};
    case NATS_NO_SERVER_SUPPORT:  // a server without headers (before 2.2) has no JetStream either
      return Failure{.kind = FailureKind::kRejected,
                     .reason = "the server cannot take it: " + detail};
    case NATS_CONNECTION_CLOSED:
    case NATS_CONNECTION_DISCONNECTED:
    case NATS_NOT_YET_CONNECTED:
    case NATS_DRAINING:
    case NATS_TIMEOUT:  // stalled with too many publishes awaiting their ack
    case NATS_NO_MEMORY:
    case NATS_INSUFFICIENT_BUFFER:
      return Failure{.kind = FailureKind::kUnavailable, .reason = "not sent: " + detail};
    default:
      // A write that failed part way (NATS_IO_ERROR, ...): the server may have the message.
      return Failure{.kind = FailureKind::kOutcomeUnknown,
                     .reason = "may have been sent: " + detail};
  }
}

}  // namespace outbox::nats
