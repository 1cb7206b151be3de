#pragma once
// How the broker's answers become outcomes (outbox/core/failure.h), in one place so that each row
// of the table in sink/amqp10.h has its test (tests/amqp10/amqp10_unit_test.cpp). Proton's types
// stay out: the inputs are the disposition and an error condition's name and description.

#include <cstdint>
#include <optional>
#include <string_view>

#include "outbox/core/failure.h"

namespace outbox::amqp10 {

// The outcome of a delivery (AMQP 1.0 section 3.4).
enum class Disposition : std::uint8_t { kAccepted, kRejected, kReleased, kModified };

// The verdict on a delivery the broker settled with `disposition`; `condition` and `description`
// are a rejection's error (empty when it gave none). nullopt: published.
std::optional<Failure> ClassifyDisposition(Disposition disposition, std::string_view condition,
                                           std::string_view description);

// The verdict on a message to `address` that was not sent because the broker refused its link
// (an attach refused, or the link detached with `condition`).
Failure ClassifyLinkRefusal(std::string_view address, std::string_view condition,
                            std::string_view description);

// True for the conditions that are a state of the destination, not of the message (issue #40):
// unavailable, no attempt spent.
bool IsDestinationState(std::string_view condition);

}  // namespace outbox::amqp10
