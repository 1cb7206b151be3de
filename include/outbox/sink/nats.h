#pragma once
// The NATS JetStream sink (libnats, the JetStream API): one connection; a batch is published with
// asynchronous JetStream publishes (js_PublishMsgAsync), up to `max_pending` of them awaiting
// their ack, and each message's outcome is its pub ack.
//
// What a consumer receives, for an envelope `e`: one message on the stream that listens on the
// subject, with
//   subject    the `subject` template expanded for e ({topic}, {target}, {type})
//   payload    e.payload, the bytes as stored
//   headers    (NATS headers: case-sensitive names, values as UTF-8 strings, numbers in decimal)
//                Nats-Msg-Id             e.id, always: JetStream stores a message once per id
//                                        within the stream's duplicate window (below)
//                Nats-Expected-Stream    `expect_stream`, when set
//              every user header (traceparent, correlation_id, causation_id, tenant_id, ...), and
//              the names the Kafka sink uses (the RabbitMQ sink's, with its properties as headers):
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
//                outbox-partition        e.partition (the outbox's)
//                outbox-attempts         e.attempts
//                outbox-target           e.target (the sink's target name)
//                outbox-database         e.database, when not empty (the relay serves several
//                                        databases)
//              A user header named like one the sink sets for this message, message_id or
//              event_id (any case), or starting with "outbox-" or "Nats-" (any case: JetStream
//              acts on Nats-* headers, e.g. Nats-Rollup) is left out.
//              With `envelope` kCloudEvents (sink/cloudevents.h, docs/cloudevents.md), the NATS
//              binding of CloudEvents instead of every header above but Nats-Msg-Id and
//              Nats-Expected-Stream: in binary mode (the default) each attribute, datacontenttype
//              too, as a header ce-<name>, its value percent-encoded as the binding says, the
//              payload as it is; in structured mode (cloudevents_mode = "structured") the JSON
//              event as the payload and Content-Type: application/cloudevents+json.
// JetStream gives each stored message a stream sequence; read the stream with any consumer.
//
// Deduplication: JetStream keeps the Nats-Msg-Id of what it stored for the stream's
// duplicate_window (2 minutes unless the stream says otherwise) and answers a publish of a known
// id with an ack marked duplicate, storing nothing: the sink reports it published. So a message
// published again within the window (after a lost ack, a relay killed before it recorded the
// outcome, a lease taken over) is stored once. Published again later, it is stored again (same
// message_id: the inbox removes it). The window should be at least the relay's lease: the sink
// logs a warning (SinkOptions::log) when a stream it publishes to keeps ids for less than
// SinkOptions::lease, once per stream (the stream named by expect_stream when it connects, every
// other the first time an ack names it, read with js_GetStreamInfo; a failed check is logged and
// changes nothing).
//
// How outcomes are classified (outbox/core/failure.h):
//   kUnavailable     not stored, nothing wrong with the message: cannot connect (no server
//                    answers, authentication or TLS refused: the sink then waits 100 ms before the
//                    next attempt, doubling up to 5 s, and answers kUnavailable at once
//                    meanwhile); the batch stopped before the message's turn (connection lost,
//                    deadline passed); JetStream answered that it cannot store anything now
//                    (insufficient resources, stream offline, JetStream not available); "no
//                    responders" followed by the loss of the connection in the same batch (a
//                    server shutting down stops JetStream first, and answers so meanwhile); the
//                    server refused the publish (Permissions Violation: a state of the
//                    destination, issue #40; no reply comes, the sink answers at once and logs it
//                    once per subject).
//   kRejected        no stream listens on the subject ("no responders"); any other error ack of
//                    JetStream, with its text
//                    and code (wrong expected stream, 10060; stream sealed, 10109; maximum
//                    messages or bytes with discard new, 10077; ...).
//   kPermanent       cannot be sent as it is, never sent: payload over `max_message_bytes`, payload
//                    and headers over the server's max_payload (its INFO), a subject that is not
//                    a valid NATS subject to publish to (empty, whitespace, empty token,
//                    wildcard), a header name with ':', whitespace or control characters or a
//                    header value with CR, LF or NUL (NATS headers cannot carry them, and leaving
//                    the header out would change the message); JetStream's "message size exceeds
//                    maximum allowed" (10054, the stream's max_msg_size).
//   kOutcomeUnknown  sent, no ack: the deadline passed (a late ack is ignored), or the connection
//                    was lost before the ack. Published again, JetStream deduplicates it.
// A connection found dead at the start of a Publish (the sink sends a PING first, waiting at most
// 100 ms for the PONG: a slow answer is no reason to stop) is made anew before anything is sent.
// A server that stops answering with the connection open (a dropped route, a frozen VM, a server
// failed over behind a virtual IP): libnats sends a PING every `ping_interval` and gives the
// connection up when two are unanswered at the next one, so within 3 x ping_interval (30 s by
// default) of the last word from the server; what awaited an ack is then outcome-unknown and the
// next Publish connects anew.
// libnats' own reconnection is off: the sink reconnects on a later Publish, so that nothing it
// reported unavailable is sent later from a reconnect buffer. Nothing is sent once the deadline
// has passed.
// Order: one connection delivers publishes to the server in the order sent, and a stream stores
// them in that order. A message refused while later ones of its stream (stream_key) were already
// sent in the batch (only when they go to other subjects or streams than it: it alone rejected,
// e.g. no stream for its {type}) finds them stored ahead of it. The relay holds them back and
// publishes them again after it, but within the duplicate window JetStream drops those copies:
// unlike on RabbitMQ or Kafka, the stream then holds the later message before the earlier one,
// once each, and a consumer sees them out of stream_seq order.
//
// Durability is JetStream's: an ack means the stream stored the message (file storage: written
// to the server's files, synced to disk on the server's schedule; replicated first when the
// stream has replicas).
//
// Threading: one thread calls Publish or Close at a time. libnats runs its own threads; acks are
// collected from them and applied on the calling thread, inside Publish.

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/core/log.h"
#include "outbox/sink/cloudevents.h"
#include "outbox/sink/envelope_style.h"
#include "outbox/sink/host_port.h"
#include "outbox/sink/sink.h"

namespace outbox::nats {

struct SinkOptions {
  // nats://[user:password@]host[:port][,nats://host[:port]...]: one or more servers, tried in
  // order; port 4222 when none is given; IPv6 hosts in brackets. tls://... for TLS. User info
  // (percent-encoded) on one entry applies to all; without ':' it is a token (nats://token@host).
  std::string url = "nats://127.0.0.1:4222";
  // A template: the placeholders {topic}, {target} and {type} are replaced by the envelope's
  // fields ({type} is "" when unset); any other '{' or '}' is a configuration error. The result
  // must be a NATS subject without wildcards.
  std::string subject = "{topic}";
  // When set, every publish carries Nats-Expected-Stream: JetStream refuses it (kRejected, error
  // 10060) unless the subject's stream has this name.
  std::string expect_stream;
  // Most publishes awaiting their ack, at least 1.
  std::size_t max_pending = 1000;
  // TCP connect plus the NATS (and TLS) handshake, per server, and no longer than the Publish
  // deadline allows.
  std::chrono::milliseconds connect_timeout{5000};
  // How often libnats PINGs the server; two PINGs unanswered at the next one end the connection
  // (see above: a silent server is given up within 3 x ping_interval).
  std::chrono::milliseconds ping_interval{10000};
  // The largest payload; larger ones are kPermanent without being sent. The server's max_payload
  // (1 MiB by default) bounds payload and headers together, whatever this says.
  std::size_t max_message_bytes = std::size_t{1024} * 1024;
  // Authentication besides the URL's user info, at most one of: a token; a credentials file
  // (`creds`: user JWT and NKey seed, as `nsc` writes it); an NKey seed file (`nkey_seed`).
  std::string token;
  std::string creds;
  std::string nkey_seed;
  // TLS (on when the URL is tls:// or any of these is set): CA certificates to trust (PEM file;
  // empty: the system's), a client certificate and its key (PEM files, both or neither), the
  // name expected in the server's certificate (empty: the URL's host).
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
  // Which of the outbox's metadata goes with each message (see above and sink/envelope_style.h).
  EnvelopeStyle envelope = EnvelopeStyle::kFull;
  // With envelope kCloudEvents: binary (ce-* headers) or structured mode, and the source.
  cloudevents::Options cloudevents;
  // Where the sink logs its warnings (a duplicate window shorter than the lease, a stream named
  // by expect_stream that does not exist, asynchronous errors libnats reports); unset: nothing.
  LogFn log;
  // The relay's lease (SinkContext::lease), compared with each stream's duplicate window. 0: not
  // known, no check.
  std::chrono::milliseconds lease{0};
};

// The sink's name, as Sink::Name() returns it.
inline constexpr std::string_view kSinkName = "nats";
// Header names the NATS sink adds besides wire_names.h's (the Kafka sink's names).
inline constexpr std::string_view kTypeHeader = "type";
inline constexpr std::string_view kContentTypeHeader = "content_type";
// The NATS binding's header that marks structured mode.
inline constexpr std::string_view kCloudEventsContentTypeHeader = "Content-Type";
// JetStream's own headers: the id it deduplicates by, and the expected stream.
inline constexpr std::string_view kMsgIdHeader = "Nats-Msg-Id";
inline constexpr std::string_view kExpectedStreamHeader = "Nats-Expected-Stream";
// A user header starting with this (in any case) is left out: JetStream acts on such headers.
inline constexpr std::string_view kReservedNatsPrefix = "Nats-";

// A `url` read: where to connect and as whom.
struct Servers {
  std::vector<HostPort> addresses;  // in the order given
  bool tls = false;                 // tls:// URLs
  // From the user info: user and password ("user:password@"), or a token ("token@");
  // percent-decoded.
  std::string user;
  std::string password;
  std::string token;

  // "nats://host:port,nats://[::1]:port" (tls:// with TLS): the servers without user info, as
  // the sink gives them to libnats; fit to show.
  [[nodiscard]] std::string Describe() const;
};

// Reads `url`. Throws std::invalid_argument saying what is wrong; the message never contains the
// user info (password or token).
Servers ParseUrl(std::string_view url);

// `url` with the password or token of its user info replaced by *** ("nats://u:***@h:4222",
// "nats://***@h"), wherever a "scheme://...@" appears (it needs not be a valid URL).
std::string MaskUrl(std::string_view url);

// Empty when `subject` is a NATS subject a message can be published to; else why not (empty,
// whitespace or control characters, an empty token, a wildcard token "*" or ">").
std::string SubjectProblem(std::string_view subject);

// Checks `options` without connecting. Throws outbox::ConfigError naming the offending key
// ("url", "subject", "expect_stream", "max_pending", "connect_timeout", "ping_interval",
// "max_message_bytes", "token", "creds", "nkey_seed", "tls_ca_file", "tls_cert_file",
// "tls_key_file", "tls_server_name"); messages never contain the password or token. Files must
// be readable.
void ValidateOptions(const SinkOptions& options);

// Checks `options` and creates the sink; connecting is lazy (the first Publish), so this works
// while the servers are down. Throws outbox::ConfigError as ValidateOptions does.
std::unique_ptr<Sink> OpenSink(SinkOptions options);

}  // namespace outbox::nats
