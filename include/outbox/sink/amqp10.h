#pragma once
// The AMQP 1.0 sink (Apache Qpid Proton's C++ binding): Azure Service Bus, ActiveMQ Artemis, Qpid,
// Solace, RabbitMQ 4 (and RabbitMQ 3.x with its rabbitmq_amqp1_0 plugin). One connection, one
// session and sender link per target address (`address` expanded), at-least-once (unsettled)
// deliveries; up to `max_in_flight` of them await the broker's disposition at once, within the
// link credit the broker grants: never one round trip per message.
//
// What a consumer receives, for an envelope `e`:
//   header        durable = `durable`
//   annotations   x-opt-partition-key = e.stream_key, when set (Service Bus partitioned entities
//                 keep a key's order only with it)
//   properties    message-id = e.id (string; Service Bus duplicate detection uses it),
//                 group-id = e.stream_key and group-sequence = e.stream_seq when it is 0..2^31-1
//                 (Service Bus sessions), content-type = e.content_type, subject = e.type,
//                 creation-time = e.created_at (ms), correlation-id = the correlation_id header
//   application-properties
//                 the RabbitMQ sink's headers (one wire vocabulary, core/wire_names.h): every user
//                 header as a string (one named message_id or event_id or starting with
//                 "outbox-", in any case, is left out), event_id (string), and with `envelope`
//                 kFull (the default) also outbox-topic (string), outbox-stream-key (string, when
//                 set), outbox-stream-seq (long, when set), outbox-stream-prev-seq (long, when
//                 set), outbox-partition (int), outbox-attempts (int), outbox-target (string),
//                 outbox-database (string, when set: the relay serves several databases)
//   body          one data section: the payload bytes as stored
// With `envelope` kCloudEvents (sink/cloudevents.h, docs/cloudevents.md), the AMQP binding of
// CloudEvents: in binary mode (the default) each attribute as a string application property
// cloudEvents_<name> (the binding's preferred prefix; none of the properties above) and
// datacontenttype as content-type, the payload as the data section; in structured mode
// (cloudevents_mode = "structured") the JSON event as the data section with content-type
// application/cloudevents+json and no application property. No subject or correlation-id; the
// other properties and annotations as above.
//
// How outcomes are classified (outbox/core/failure.h; the table is classify.h's):
//   published        the broker's disposition is `accepted`.
//   kUnavailable     not sent: cannot connect (refused, no answer within connect_timeout, SASL or
//                    TLS refused: the sink then waits 100 ms before the next attempt, doubling up
//                    to 5 s, and answers kUnavailable at once meanwhile), the connection was lost
//                    before the message's turn, the deadline passed before it was sent. Also a
//                    refusal that is a state of the destination, not of the message (issue #40,
//                    "No silent stalls"): a refused link attach, a link or session ended (its
//                    unsettled deliveries included: RabbitMQ 3.x ends the session on the first
//                    publish to an exchange the user may not write) or a disposition, with the
//                    condition amqp:unauthorized-access, amqp:resource-limit-exceeded or
//                    amqp:resource-locked.
//   kRejected        `rejected` (with the broker's condition and description in the reason);
//                    `released` and `modified` (the broker did not take it: RabbitMQ 4 releases
//                    what no queue is bound for; spending an attempt keeps a destination that
//                    never takes it from holding the stream for ever, as the RabbitMQ sink's
//                    unroutable and the NATS sink's "no responders" do); a link the broker
//                    refused to attach or detached with an error (amqp:not-found: no such queue,
//                    topic or exchange), for the messages to that address not yet sent.
//   kPermanent       cannot be sent as it is, never sent: payload over `max_message_bytes`, an
//                    empty address; `rejected` with amqp:link:message-size-exceeded.
//   kOutcomeUnknown  sent, no disposition: the deadline passed (a late one is ignored), the link,
//                    its session or the connection was lost with the delivery unsettled.
// Each address has a session of its own: RabbitMQ 3.x's plugin ends the whole session when it
// refuses a link or a publish, and nothing of another address may go down with it. Past 256
// links, the idle ones are closed when a new address needs one.
//
// A connection found dead at the start of a Publish (the sink begins and ends a session first,
// waiting at most 100 ms for the broker's answer: AMQP 1.0 has no ping; a slow answer is no
// reason to stop) is made anew before anything is sent.
// A silent peer: the sink asks the broker to send something at least every idle_timeout / 2
// (AMQP's idle-time-out) and gives a connection up when nothing came for idle_timeout; what
// awaited a disposition is then outcome-unknown, and the next Publish connects anew.
// Order: one link delivers in the order sent, so a stream's messages to one address arrive in
// batch order. Messages to different addresses go over different links.
//
// Threading: one thread calls Publish or Close at a time. Proton's container runs on a thread of
// the sink's own, one per connection; the two meet only in a mutex-guarded mailbox.

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/sink/cloudevents.h"
#include "outbox/sink/envelope_style.h"
#include "outbox/sink/sink.h"

namespace outbox::amqp10 {

struct SinkOptions {
  // amqp://[user:password@]host[:port] (port 5672) or amqps://... (TLS, port 5671). User and
  // password percent-encoded; they are the SASL PLAIN credentials (Service Bus: the SAS key name
  // and key). No path: the address is `address`.
  std::string url = "amqp://127.0.0.1:5672";
  // The target address of each message, a template: {topic}, {target} and {type} are replaced
  // by the envelope's fields ({type} is "" when unset); any other '{' or '}' is a configuration
  // error. Service Bus and Artemis: a queue or topic name ("orders"); RabbitMQ 3.x's plugin:
  // "/queue/NAME", "/exchange/NAME/KEY", "/amq/queue/NAME", "/topic/KEY"; RabbitMQ 4:
  // "/queues/NAME", "/exchanges/NAME/KEY".
  std::string address = "{topic}";
  // SASL mechanisms offered, space-separated, of PLAIN, ANONYMOUS and EXTERNAL. Empty: PLAIN when
  // the URL has a user, else ANONYMOUS. PLAIN over amqp:// (no TLS) is allowed: the URL says so.
  std::string sasl_mechanisms;
  // Most deliveries awaiting their disposition at once, at least 1.
  std::size_t max_in_flight = 1000;
  // TCP connect plus the SASL, TLS and AMQP open, and no longer than the Publish deadline allows.
  std::chrono::milliseconds connect_timeout{5000};
  // A connection nothing came on for this long is given up (see above); 0: never.
  std::chrono::milliseconds idle_timeout{10000};
  // Larger payloads are kPermanent without being sent (Service Bus: 256 KiB on Standard).
  std::size_t max_message_bytes = std::size_t{1024} * 1024;
  bool durable = true;  // the header's durable flag
  // TLS (amqps://): CA certificates to trust (PEM file; empty: the system's); a client
  // certificate and its key (PEM files, both or neither; they need tls_ca_file); the name
  // expected in the server's certificate and sent as SNI and the AMQP hostname (empty: the URL's
  // host). The server's certificate and name are always verified.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
  // Which of the outbox's metadata goes with each message (see above and sink/envelope_style.h).
  EnvelopeStyle envelope = EnvelopeStyle::kFull;
  // With envelope kCloudEvents: binary (cloudEvents_* application properties) or structured mode,
  // and the source.
  cloudevents::Options cloudevents;
};

// The sink's name, as Sink::Name() returns it.
inline constexpr std::string_view kSinkName = "amqp10";
// The message annotation Service Bus partitions by.
inline constexpr std::string_view kPartitionKeyAnnotation = "x-opt-partition-key";
// The prefix of CloudEvents attributes among the application properties (the AMQP binding's
// preferred one; "cloudEvents:" is the other it allows).
inline constexpr std::string_view kCloudEventsPrefix = "cloudEvents_";

// A `url` read.
struct Endpoint {
  std::string host;  // without brackets
  int port = 0;
  bool tls = false;
  std::string user;  // percent-decoded; empty: none
  std::string password;

  // "amqp://host:port" (amqps:// with TLS, IPv6 in brackets): no user info; fit to show.
  [[nodiscard]] std::string Describe() const;
};

// Reads `url`. Throws std::invalid_argument saying what is wrong; the message never quotes the
// URL (a password may hold any character).
Endpoint ParseUrl(std::string_view url);

// `url` with the password of its user info replaced by *** ("amqps://key:***@ns.servicebus...").
std::string MaskUrl(std::string_view url);

// Checks `options` without connecting: the one check of each option (the sink type's parser
// calls it; the sink trusts what it gets). Throws outbox::ConfigError naming the offending key
// ("url", "address", "sasl_mechanisms", "max_in_flight", "connect_timeout", "idle_timeout",
// "max_message_bytes", "tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name");
// messages never contain the password. Files must be readable.
void ValidateOptions(const SinkOptions& options);

// Checks `options` and creates the sink; connecting is lazy (the first Publish), so this works
// while the broker is down. Throws outbox::ConfigError as ValidateOptions does.
std::unique_ptr<Sink> OpenSink(SinkOptions options);

}  // namespace outbox::amqp10
