#pragma once
// Reading an inbox Delivery from a RabbitMQ message as the outbox's RabbitMQ sink sends it:
// message_id property = the outbox id, headers outbox-stream-key, outbox-stream-seq and (only
// after abandoned messages) outbox-stream-prev-seq (names in core/wire_names.h). Integer headers
// may be of any AMQP integer type or a decimal string.

#include <optional>
#include <string>

#include "outbox/inbox/inbox.h"

// rabbitmq-c's amqp_basic_properties_t, declared so that this header does not include amqp.h.
struct amqp_basic_properties_t_;

namespace outbox::inbox {

// The delivery's id, stream key, seq and prev seq; nullopt with `error` set when the message has no
// message_id or it is not a UUID (it did not come from an outbox, or it was altered). An outbox
// header that is present but unreadable (a seq that is not an integer, a key that is not a string)
// is reported in Delivery::malformed, and Inbox::Process returns kInvalid for it.
std::optional<Delivery> FromAmqp(const amqp_basic_properties_t_& properties,
                                 std::string* error = nullptr);

}  // namespace outbox::inbox
