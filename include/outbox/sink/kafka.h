#pragma once
// The Kafka sink (librdkafka): one idempotent producer (enable.idempotence=true, acks=all, always);
// a batch is produced whole and its delivery reports are awaited until the deadline. A message is
// published only when its delivery report carries no error.
//
// What a consumer receives, for an envelope `e`:
//   topic      the `topic` template expanded for e ({topic}, {target}, {type})
//   key        e.stream_key (so that a stream lives in one partition, in order); no key when unset
//   value      e.payload, the bytes as stored
//   timestamp  e.created_at (milliseconds, CreateTime)
//   headers    every user header (traceparent, correlation_id, causation_id, tenant_id, ...), and,
//              as UTF-8 strings (numbers in decimal), the same names the RabbitMQ sink uses:
//                message_id              e.id, always
//                event_id                e.EventId(), always: the same for every copy of a
//                                        message written to several targets
//                type                    e.type, when set
//                content_type            e.content_type, when set
//              and with `envelope` kFull (the default) only (kExternal sends no outbox-* header):
//                outbox-topic            e.topic
//                outbox-stream-key       e.stream_key, when set
//                outbox-stream-seq       e.stream_seq, when set
//                outbox-stream-prev-seq  e.stream_prev_seq, when set (see Envelope)
//                outbox-partition        e.partition (the outbox's, not Kafka's partition)
//                outbox-attempts         e.attempts
//                outbox-target           e.target (the sink's target name)
//                outbox-database         e.database, when not empty (the relay serves several
//                                        databases)
//              with header_style kDebezium also `id` = e.id, as Debezium's outbox event router
//              writes it (its record key is the aggregate id: e.stream_key, as above), in either
//              envelope style. A user header with one of the names the sink sets for this
//              message, or named message_id or event_id or starting with "outbox-" (any case), is
//              left out.
//   with `envelope` kCloudEvents (sink/cloudevents.h, docs/cloudevents.md), the Kafka protocol
//   binding of CloudEvents instead of all the headers above: in binary mode (the default) each
//   attribute as a header ce_<name> and datacontenttype as `content-type`, the payload as the
//   value; in structured mode (cloudevents_mode = "structured") the JSON event as the value and
//   `content-type: application/cloudevents+json`. Key and timestamp as above.
// Keys are hashed like the Java client's (partitioner murmur2_random, unless overridden), so a
// stream lands in the partition a Java producer would choose.
//
// How outcomes are classified (outbox/core/failure.h), from the delivery report's error and
// librdkafka's persistence status (rd_kafka_message_status):
//   kPermanent       cannot be written as it is: over max_message_bytes (value, key and headers
//                    together; refused by librdkafka before sending), MSG_SIZE_TOO_LARGE from the
//                    broker (which refuses the whole produce request, so other messages of that
//                    request share the verdict), INVALID_RECORD, CORRUPT_MESSAGE,
//                    INVALID_TOPIC_EXCEPTION, RECORD_LIST_TOO_LARGE, an empty topic name.
//   kRejected        the topic does not exist (UNKNOWN_TOPIC_OR_PART, librdkafka's UNKNOWN_TOPIC
//                    once topic.metadata.propagation.max.ms has passed: 5 s here unless set),
//                    and any other error the broker answered with when librdkafka knows the
//                    message was not written.
//   kUnavailable     never written: the brokers are down or unreachable; the producer may not
//                    write there (TOPIC_ / CLUSTER_AUTHORIZATION_FAILED: a state of the
//                    destination, issue #40); or the deadline passed
//                    while the message was still queued in the client (it is then purged, so it
//                    is not sent later), or the client's queue stayed full until the deadline.
//   kOutcomeUnknown  may have been written: sent, and no report by the deadline (it may still be
//                    written later; its late report is ignored), sent when every broker
//                    connection was lost (librdkafka's ALL_BROKERS_DOWN ends the batch at once:
//                    what was still queued is kUnavailable), a transport error or timeout
//                    after it was sent (POSSIBLY_PERSISTED), a fatal error of the idempotent
//                    producer (the producer is then destroyed and a new one made; the messages
//                    are published again). When in doubt the sink says kOutcomeUnknown: the relay
//                    publishes again and the inbox removes the duplicate; it is never a loss.
// A broker that stops answering with the connection open (a dropped route, a frozen VM, a broker
// failed over behind a virtual IP): librdkafka drops a connection on which a request (a produce
// request too) went unanswered for socket.timeout.ms (30 s here unless set; librdkafka's own
// default is 60 s), looking once a second, and connects anew; meanwhile Publish returns by its
// deadline (sent: kOutcomeUnknown, still queued: kUnavailable, purged).
// Order: librdkafka's idempotent producer keeps a partition's order through its own retries with
// up to 5 requests in flight; a message purged at the deadline was the last of its partition's
// queue, so what is published again comes after everything that may still be written.
//
// Threading: one thread calls Publish or Close at a time; librdkafka runs its own I/O threads.
// Delivery reports are served on the calling thread, inside Publish.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox/core/log.h"
#include "outbox/sink/cloudevents.h"
#include "outbox/sink/envelope_style.h"
#include "outbox/sink/host_port.h"
#include "outbox/sink/sink.h"

namespace outbox::kafka {

enum class HeaderStyle : std::uint8_t {
  kOutbox,    // the outbox's headers only
  kDebezium,  // also Debezium outbox-router conventions: header `id` = the message id
};

struct SinkOptions {
  // bootstrap.servers: "host:port[,host:port...]".
  std::string brokers = "127.0.0.1:9092";
  // A template: the placeholders {topic}, {target} and {type} are replaced by the envelope's
  // fields ({type} is "" when unset); any other '{' or '}' is a configuration error.
  std::string topic = "{topic}";
  // compression.codec: "none", "gzip", "snappy", "lz4" or "zstd".
  std::string compression = "none";
  // linger.ms: how long librdkafka gathers messages into one request. Publish flushes once the
  // batch is produced, so this only matters while a large batch is being produced.
  std::chrono::milliseconds linger{5};
  // max.in.flight.requests.per.connection: 1 to 5 (idempotence keeps order up to 5).
  int max_in_flight = 5;
  HeaderStyle header_style = HeaderStyle::kOutbox;
  // message.max.bytes: the largest record (value, key and headers); larger ones are kPermanent
  // without being sent. Keep it at most the topic's max.message.bytes (Kafka's default 1048588).
  std::size_t max_message_bytes = 1000000;
  // Any other librdkafka property (security.protocol, sasl.*, ssl.*, client.id, ...), set in
  // order after the sink's own defaults. Properties the sink sets itself (see
  // IsReservedProperty) are refused.
  std::vector<std::pair<std::string, std::string>> properties;
  // Which of the outbox's metadata goes with each message (see above and sink/envelope_style.h).
  EnvelopeStyle envelope = EnvelopeStyle::kFull;
  // With envelope kCloudEvents: binary (ce_* headers) or structured mode, and the source.
  cloudevents::Options cloudevents;
  // librdkafka's log lines (debug ones left out) go here; unset: librdkafka prints to stderr.
  LogFn log;
};

// The sink's name, as Sink::Name() returns it.
inline constexpr std::string_view kSinkName = "kafka";
// Header names the Kafka sink adds besides wire_names.h's (RabbitMQ has message properties).
inline constexpr std::string_view kTypeHeader = "type";
inline constexpr std::string_view kContentTypeHeader = "content_type";
inline constexpr std::string_view kDebeziumIdHeader = "id";
// The Kafka binding of CloudEvents: datacontenttype (binary mode) or the event format (structured).
inline constexpr std::string_view kCloudEventsContentTypeHeader = "content-type";

// The entries of a bootstrap list "host:port,host:port" (spaces around entries allowed; an entry
// may start with a listener name such as "PLAINTEXT://"; IPv6 in brackets; port 9092 when none is
// given); nullopt when it is empty or an entry has no host or a bad port (sink/host_port.h).
std::optional<std::vector<HostPort>> ParseBrokers(std::string_view list);

// True for the librdkafka properties the sink sets from its own options or always
// (enable.idempotence, acks, bootstrap.servers, compression.codec, ...): they cannot be set
// through `properties`.
bool IsReservedProperty(std::string_view name);
// True for properties whose values must not be shown (passwords, secrets, keys, OAUTHBEARER).
bool IsSecretProperty(std::string_view name);

// Checks `options` without creating a producer. Throws outbox::ConfigError naming the offending
// key ("brokers", "topic", "compression", "linger", "max_in_flight", "max_message_bytes", or
// "librdkafka.<property>" for a property that is reserved, unknown to librdkafka or has a value it
// refuses); messages never contain a secret property's value.
void ValidateOptions(const SinkOptions& options);

// Checks `options` (librdkafka checks the whole configuration, without connecting) and creates
// the sink; its producer is made by the first Publish, and connects in the background, so this
// works while the brokers are down. Throws outbox::ConfigError as ValidateOptions does, and
// ConfigError("librdkafka", ...) when librdkafka refuses the combination.
std::unique_ptr<Sink> OpenSink(SinkOptions options);

}  // namespace outbox::kafka
