#pragma once
// Reading an inbox Delivery from an AMQP 1.0 message as the outbox's AMQP 1.0 sink sends it
// (sink/amqp10.h): message-id = the outbox id (a string), application properties
// outbox-stream-key, outbox-stream-seq and (only after abandoned messages) outbox-stream-prev-seq
// (names in core/wire_names.h). Integer properties may be of any AMQP integer type or a decimal
// string. For consumers written with Qpid Proton's C++ binding; a consumer in another language
// reads the same fields with its own client.

#include <optional>
#include <string>

#include "outbox/inbox/inbox.h"

// Proton's message, declared so that this header does not include Proton's.
namespace proton {
class message;
}  // namespace proton

namespace outbox::inbox {

// The delivery's id, stream key, seq and prev seq; nullopt with `error` set when the message has
// no message-id or it is not a UUID string (it did not come from an outbox, or it was altered).
// An outbox property that is present but unreadable (a seq that is not an integer, a key that is
// not a string) is reported in Delivery::malformed, and Inbox::Process returns kInvalid for it.
std::optional<Delivery> FromAmqp10(const proton::message& message, std::string* error = nullptr);

}  // namespace outbox::inbox
