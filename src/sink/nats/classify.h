#pragma once
// How libnats' answers become outcomes (outbox/core/failure.h), in one place so that each row of
// the table in sink/nats.h has its test (tests/nats/nats_unit_test.cpp).

#include <nats/nats.h>

#include <optional>
#include <string_view>

#include "outbox/core/failure.h"

namespace outbox::nats {

// The verdict on an asynchronous JetStream publish, from its ack handler: `status` NATS_OK for a
// pub ack (stored, or a duplicate JetStream had stored before), else the jsPubAckErr's Err,
// ErrCode and ErrText. `subject` is where it was published.
std::optional<Failure> ClassifyAck(natsStatus status, jsErrCode code, std::string_view text,
                                   std::string_view subject);

// The verdict on a publish that js_PublishMsgAsync refused (it kept the message: no ack will
// come), with libnats' error text.
Failure ClassifyPublishError(natsStatus status, std::string_view text);

// True when `status` says the connection is gone (closed, disconnected, broken): what was not
// sent is then unavailable, and the connection is made anew.
bool IsConnectionLost(natsStatus status);

}  // namespace outbox::nats
