#pragma once
// The RabbitMQ sink (rabbitmq-c, AMQP 0-9-1): one connection and one channel in publisher-confirm
// mode; a batch is published in order with up to `confirm_window` messages unconfirmed, and each
// message's outcome is the broker's basic.ack / basic.nack / basic.return.
//
// What a consumer receives, for an envelope `e`:
//   properties  message_id = e.id (always), type = e.type, content_type = e.content_type,
//               correlation_id = e.headers["correlation_id"], timestamp = e.created_at (seconds),
//               delivery_mode = 2 (persistent) unless `persistent` is false
//   headers     every user header as a string (traceparent, causation_id, tenant_id, ...; one
//               named message_id or event_id or starting with "outbox-", in any case, is left
//               out), event_id (string: e.EventId(), the same for every copy of a fanned-out
//               message), and with `envelope` kFull (the default) also outbox-topic (string),
//               outbox-stream-key (string, when set), outbox-stream-seq (int64, when set),
//               outbox-stream-prev-seq (int64, when set), outbox-partition (int32),
//               outbox-attempts (int32), outbox-target (string), outbox-database (string, when
//               e.database is not empty: the relay serves several databases). With kExternal no
//               outbox-* header is sent.
//   with `envelope` kCloudEvents (sink/cloudevents.h, docs/cloudevents.md) instead, after the
//   AMQP binding of CloudEvents (written for AMQP 1.0; 0-9-1 has none): in binary mode (the
//   default) each attribute as a string header cloudEvents_<name> (the binding's preferred
//   prefix) and datacontenttype as content_type, the payload as the body; in structured mode
//   (cloudevents_mode = "structured") the JSON event as the body with content_type
//   application/cloudevents+json and no header. message_id, timestamp and delivery_mode as above;
//   no type or correlation_id property, no event_id or user header of its own.
//
// How outcomes are classified (outbox/core/failure.h):
//   kUnavailable     not sent: cannot connect (the sink then waits 100 ms before the next
//                    attempt, doubling up to 5 s, and answers kUnavailable at once meanwhile),
//                    or the batch stopped before the message's turn (connection lost, channel
//                    closed by the broker, broker blocked the connection, deadline passed).
//   kRejected        basic.nack ("nacked by broker ..."), basic.return of a mandatory message
//                    ("unroutable: NO_ROUTE exchange='x' routing_key='y'"), or the channel closed
//                    by the broker because of it ("exchange 'x' not found (NOT_FOUND - ...)").
//   kPermanent       cannot be sent as it is: payload over `max_message_bytes`, exchange, routing
//                    key, type or content type over 255 bytes, a header name over 128 bytes,
//                    properties and headers over one AMQP frame (128 KiB).
//   kOutcomeUnknown  sent, but no confirm: the deadline passed, the connection was lost, or the
//                    channel was closed by the broker because of another message of the batch.
// Nothing is sent once the deadline has passed. A connection found closed at the start of a
// Publish (e.g. by the broker after two missed heartbeats while the relay was idle: no thread
// sends heartbeats between calls) is re-made before anything is sent.
//
// Threading: one thread calls Publish or Close at a time; the sink has no thread of its own.

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "outbox/sink/cloudevents.h"
#include "outbox/sink/envelope_style.h"
#include "outbox/sink/sink.h"

namespace outbox::rabbitmq {

struct SinkOptions {
  // amqp://user:password@host:port/vhost (rabbitmq-c's amqp_parse_url; percent-encoding allowed,
  // an empty vhost means "/"). amqps:// is not supported yet.
  std::string url = "amqp://guest:guest@127.0.0.1:5672/";
  // The exchange to publish to; "" is the default exchange (routing key = queue name). A
  // template like routing_key.
  std::string exchange;
  // A template: the placeholders {topic}, {target} and {type} are replaced by the envelope's
  // fields ({type} is "" when unset); any other '{' or '}' is a configuration error.
  std::string routing_key = "{topic}";
  // Unroutable messages come back (basic.return) and are reported kRejected. When false they are
  // confirmed and silently dropped by the broker.
  bool mandatory = true;
  bool persistent = true;             // delivery_mode 2
  std::size_t confirm_window = 1000;  // most unconfirmed publishes in flight, at least 1
  // TCP connect plus AMQP handshake, and no longer than the Publish deadline allows.
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::seconds heartbeat{10};  // 0 disables heartbeats
  // Larger payloads are kPermanent without being sent.
  std::size_t max_message_bytes = 16 * 1024 * 1024;
  // Optional topology: when set ("direct", "topic", "fanout" or "headers"), `exchange` (which must
  // then be a plain, non-empty name) is declared durable on every connect. Otherwise nothing is
  // declared.
  std::string declare_exchange_type;
  // Which of the outbox's metadata goes with each message (see above and sink/envelope_style.h).
  EnvelopeStyle envelope = EnvelopeStyle::kFull;
  // With envelope kCloudEvents: binary (cloudEvents_* headers) or structured mode, and the source.
  cloudevents::Options cloudevents;
};

// The sink's name, as Sink::Name() returns it.
inline constexpr std::string_view kSinkName = "rabbitmq";
// The prefix of CloudEvents attributes in the headers table (the AMQP binding's preferred one).
inline constexpr std::string_view kCloudEventsPrefix = "cloudEvents_";

// Checks `options` without connecting: the one check of each option (the sink type's parser
// calls it, and the sink trusts what it gets; only a name expanded from a template is checked
// again, per message). Throws outbox::ConfigError naming the offending key ("url", "exchange",
// "routing_key", "confirm_window", "connect_timeout", "heartbeat", "max_message_bytes",
// "declare_exchange_type"); messages never contain the password.
void ValidateOptions(const SinkOptions& options);

// Checks `options` and creates the sink; connecting is lazy (the first Publish), so this works
// while the broker is down. Throws outbox::ConfigError as ValidateOptions does.
std::unique_ptr<Sink> OpenSink(SinkOptions options);

}  // namespace outbox::rabbitmq
