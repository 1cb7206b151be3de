#include "classify.h"

#include <string>

namespace outbox::kafka {
namespace {

std::string Describe(rd_kafka_resp_err_t error) {
  return std::string{rd_kafka_err2name(error)} + " (" + rd_kafka_err2str(error) + ")";
}

// The message can never be written as it is.
bool IsPermanent(rd_kafka_resp_err_t error) {
  switch (error) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_MSG:  // CORRUPT_MESSAGE
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:  // created_at only grows older
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:  // INVALID_TOPIC_EXCEPTION
    case RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS:
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
      return true;
    default:
      return false;
  }
}

// The destination refused the message: it does not exist.
bool IsRejected(rd_kafka_resp_err_t error) {
  switch (error) {
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
      return true;
    default:
      return false;
  }
}

// The brokers could not be reached or did not answer in time, or the client gave up on the
// message before sending it: nothing wrong with the message.
bool IsUnavailable(rd_kafka_resp_err_t error) {
  switch (error) {
    case RD_KAFKA_RESP_ERR__TRANSPORT:
    case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
    case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
    case RD_KAFKA_RESP_ERR__TIMED_OUT:
    case RD_KAFKA_RESP_ERR__RESOLVE:
    case RD_KAFKA_RESP_ERR__DESTROY:
    case RD_KAFKA_RESP_ERR__QUEUE_FULL:
    case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
    case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
    case RD_KAFKA_RESP_ERR__SSL:
    case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
    case RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
    case RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND:
    case RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR:
    case RD_KAFKA_RESP_ERR_THROTTLING_QUOTA_EXCEEDED:
    // The producer may not write there (issue #40): a state of the destination, not of the
    // message; no attempt spent until the ACL is granted.
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::optional<Failure> ClassifyDelivery(rd_kafka_resp_err_t error, rd_kafka_msg_status_t status,
                                        std::string_view fatal) {
  if (error == RD_KAFKA_RESP_ERR_NO_ERROR) return std::nullopt;
  if (!fatal.empty()) {
    return Failure{.kind = FailureKind::kOutcomeUnknown,
                   .reason = "fatal error of the idempotent producer, which is made anew: " +
                             std::string{fatal}};
  }
  // An earlier attempt of this message may have been written (it was sent, and the answer was
  // lost or was an error on a retry): whatever the last error says, it may be on the log.
  if (status != RD_KAFKA_MSG_STATUS_NOT_PERSISTED) {
    return Failure{.kind = FailureKind::kOutcomeUnknown,
                   .reason = "may have been written: " + Describe(error)};
  }
  if (error == RD_KAFKA_RESP_ERR__PURGE_QUEUE) {
    return Failure{.kind = FailureKind::kUnavailable,
                   .reason =
                       "not sent by the deadline (brokers down, unreachable or slow); taken "
                       "back from the client's queue"};
  }
  if (IsPermanent(error))
    return Failure{.kind = FailureKind::kPermanent, .reason = Describe(error)};
  if (IsRejected(error)) return Failure{.kind = FailureKind::kRejected, .reason = Describe(error)};
  if (IsUnavailable(error)) {
    return Failure{.kind = FailureKind::kUnavailable, .reason = "not written: " + Describe(error)};
  }
  // Any other answer of the broker: it refused the message, which was not written.
  return Failure{.kind = FailureKind::kRejected, .reason = Describe(error)};
}

Failure ClassifyProduceError(rd_kafka_resp_err_t error, std::string_view detail) {
  std::string reason = Describe(error);
  if (!detail.empty()) reason += ": " + std::string{detail};
  if (error == RD_KAFKA_RESP_ERR__FATAL) {
    return Failure{
        .kind = FailureKind::kUnavailable,
        .reason = "not sent: the producer had a fatal error and is made anew (" + reason + ")"};
  }
  if (IsPermanent(error)) return Failure{.kind = FailureKind::kPermanent, .reason = reason};
  if (IsRejected(error)) return Failure{.kind = FailureKind::kRejected, .reason = reason};
  return Failure{.kind = FailureKind::kUnavailable, .reason = "not sent: " + reason};
}

}  // namespace outbox::kafka
