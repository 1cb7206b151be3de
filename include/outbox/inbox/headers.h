#pragma once
// Reading an inbox Delivery from a message whose outbox fields travel as text headers, as the
// outbox's Kafka, NATS, Redis and webhook sinks send them (names in core/wire_names.h): the id in
// one header (which one depends on the broker, below), outbox-stream-key, outbox-stream-seq and
// (only after abandoned messages) outbox-stream-prev-seq as decimal text, outbox-target. One reader
// for the four: what differs between brokers is only how a header is looked up, a line each:
//
//   Kafka     rd_kafka_header_get_last on the record's headers           id: message_id
//   NATS      natsMsgHeader_Get                                          id: message_id
//   Redis     the stream entry's field of that name                      id: id
//   webhooks  the request header (names are case-insensitive in HTTP)   id: webhook-id
//
// RabbitMQ carries typed headers and the id as a property: FromAmqp (inbox/rabbitmq.h).

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "outbox/inbox/inbox.h"

namespace outbox::inbox {

// The header that holds the message id, per sink.
inline constexpr std::string_view kKafkaIdHeader = "message_id";
inline constexpr std::string_view kNatsIdHeader = "message_id";
inline constexpr std::string_view kRedisIdField = "id";
inline constexpr std::string_view kWebhookIdHeader = "webhook-id";

// A header's value, or nullopt when the message has none of that name. The view must stay valid
// until FromHeaders returns.
using HeaderLookup = std::function<std::optional<std::string_view>(std::string_view name)>;

// The delivery's id, stream key, seq, prev seq and target; nullopt with `error` set when the
// message has no `id_name` header or it is not a UUID (it did not come from an outbox, or it was
// altered). An outbox header that is present but unreadable (a seq that is not a decimal integer)
// is reported in Delivery::malformed, and Inbox::Process returns kInvalid for it.
std::optional<Delivery> FromHeaders(const HeaderLookup& header, std::string_view id_name,
                                    std::string* error = nullptr);

}  // namespace outbox::inbox
