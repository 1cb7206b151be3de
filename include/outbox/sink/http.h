#pragma once
// The HTTP webhook sink (libcurl's multi interface): each message is one HTTP request to an
// endpoint, signed as Standard Webhooks (standardwebhooks.com) say, and it is published when the
// endpoint answers 2xx. Connections are kept and reused (HTTP/1.1 keep-alive, HTTP/2 streams),
// many requests are in flight at once, but never two of one stream.
//
// What an endpoint receives, for an envelope `e`:
//   request line  `method` (POST) to the `url` template expanded for e: {topic}, {target} and
//                 {type} ("" when unset) are replaced by the envelope's fields, percent-encoded
//                 (every byte but A-Z a-z 0-9 - . _ ~; a value of dots only, "." or "..", as
//                 %2E each), so a topic cannot change the path or leave its prefix
//   body          e.payload, the bytes as stored
//   headers       (names in lower case; HTTP/2 sends them so anyway)
//     content-type            e.content_type
//     webhook-id              e.id (the outbox message id, the same on every attempt)
//     webhook-timestamp       when this attempt was sent, in seconds since the Unix epoch
//     webhook-signature       "v1,<base64 of HMAC-SHA256(key, id + "." + timestamp + "." + body)>"
//                             for each of `secrets` (space-separated, in the order configured;
//                             key: the secret's bytes after "whsec_", base64-decoded); absent
//                             when no secret is configured
//     event_id                e.EventId(): the same for every copy of a message written to
//                             several targets (the first copy's id), else e.id
//   with `envelope` kExternal:
//     type                    e.type, when set
//   with `envelope` kFull (the default), instead:
//     outbox-topic            e.topic
//     outbox-type             e.type, when set
//     outbox-stream-key       e.stream_key, when set
//     outbox-stream-seq       e.stream_seq, when set
//     outbox-stream-prev-seq  e.stream_prev_seq, when set (see Envelope)
//     outbox-partition        e.partition (the outbox's)
//     outbox-attempts         e.attempts
//     outbox-target           e.target (the sink's target name)
//     outbox-database         e.database, when not empty (the relay serves several databases)
//   then the configured `headers` (the same on every request), then the envelope's own headers
//   (traceparent, correlation_id, ...). An envelope header the sink sets itself or that HTTP
//   reserves is left out: content-type, content-length, host, transfer-encoding, connection,
//   keep-alive, upgrade, te, trailer, expect, proxy-*, webhook-*, message_id, event_id,
//   outbox-* (any case), and with kExternal `type` when e.type is set.
//   with `envelope` kCloudEvents (sink/cloudevents.h, docs/cloudevents.md), the HTTP protocol
//   binding of CloudEvents instead of event_id, type, outbox-* and the envelope's headers: in
//   binary mode (the default) each attribute as a header ce-<name> (value percent-encoded as the
//   binding says) and datacontenttype as content-type, the payload as the body; in structured
//   mode (cloudevents_mode = "structured") the JSON event as the body with content-type
//   application/cloudevents+json. webhook-* and the configured `headers` as above (a configured
//   ce-* header is refused); the signature covers the body sent.
// A receiver checks the signature (with its own HMAC, e.g. Python's hmac), refuses a timestamp
// too far from its clock (Standard Webhooks: 5 minutes), and removes duplicates by webhook-id.
//
// How answers are classified (outbox/core/failure.h):
//   2xx              published.
//   kRejected        every status outside 2xx that the rows below do not name: 404, 405,
//                    409, 410, the other 4xx, 408, 429, every 5xx, the statuses listed in
//                    `retry_statuses`; 3xx (redirects are not followed: the reason names the
//                    Location); 1xx. Retried with the relay's backoff, an attempt spent.
//   kPermanent       400, 413, 415, 422 (the message itself can never be accepted) and the
//                    statuses listed in `abandon_statuses`, unless listed in `retry_statuses`;
//                    never sent: a payload over `max_message_bytes`, a URL that is not a valid
//                    http(s) URL once expanded, a header name that is not an HTTP token or a value
//                    with CR, LF or NUL.
//   kUnavailable     401, 403, 407 (unless listed): the endpoint refuses the relay itself, a
//                    state of the destination. The host is paused as if unreachable (below),
//                    unless it accepted a request sent after its last such refusal within the
//                    last minute: then the refusal is this message's (kRejected, an attempt
//                    spent), e.g. a 403 for one path while the others are accepted.
//   kUnavailable     not sent, nothing wrong with the message: the host cannot be reached (name
//                    not found, connection refused, connect timeout, TLS handshake or certificate
//                    refused): the sink then sends nothing to that host for 100 ms, doubling up to
//                    5 s, and answers kUnavailable at once meanwhile; the host asked to wait
//                    (below) and the time is not up; the deadline passed (or less than 20 ms of
//                    it were left) before the message's turn; an earlier message of its stream
//                    in this batch was unavailable.
//   kOutcomeUnknown  sent, no answer: the connection broke, the request timed out (its whole
//                    `request_timeout`, also when libcurl had not found it a connection yet: that
//                    request's problem, not its host's), the deadline passed; or not sent because
//                    an earlier message of its stream in this batch failed otherwise (it must go
//                    after it). Sent again later, the endpoint gets the same webhook-id twice.
// Retry-After: a 429 or 503 answer with Retry-After (seconds or an HTTP date; at most
// `max_retry_after` is honoured) makes the sink send nothing more to that host (scheme, name and
// port) until then; a 429 without it, for 1 s. Other hosts go on. Requests already on the wire
// when the answer came are not called back.
//
// Order and limits: at most one request of a stream (stream_key) in flight at a time, the next
// sent only once the one before it was answered 2xx; at most `max_in_flight` requests per host at
// a time (HTTP/1.1: as many connections; HTTP/2: streams on one connection). Messages without a
// stream key have no order among themselves.
//
// Timeouts: connect (TCP and TLS) within `connect_timeout`, the whole request within
// `request_timeout`, and neither beyond the Publish deadline. A host counts as down after request
// timeouts only when 3 different messages in a row timed out with no answer of any kind from the
// host in between (then as unreachable: nothing sent to it for 100 ms, doubling up to 5 s; the
// requests that were already in flight when the host was found down do not double the pause, so
// that one event that ends many at once, e.g. a route that stops forwarding, pauses it once). A
// request that timed out ends with its connection (libcurl closes it): a connection that stopped
// answering with the socket open (a dropped route, a frozen VM, an endpoint failed over behind a
// virtual IP) is used by no request after the first one it left without an answer.
//
// Threading: one thread calls Publish or Close at a time; all I/O happens inside Publish, on the
// calling thread. Connections stay open between calls (libcurl's connection cache).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox/core/log.h"
#include "outbox/sink/cloudevents.h"
#include "outbox/sink/envelope_style.h"
#include "outbox/sink/sink.h"

namespace outbox::webhook {

enum class HttpVersion : std::uint8_t {
  kAuto,   // HTTP/2 when a https endpoint offers it (ALPN), else HTTP/1.1
  kHttp1,  // HTTP/1.1 only
  kHttp2,  // HTTP/2 only: over TLS by ALPN, on http:// with prior knowledge (h2c)
};

struct SinkOptions {
  // A template: http:// or https:// URL with {topic}, {target} and {type} placeholders (any other
  // '{' or '}' is a configuration error). User info in it (https://user:password@host/...) is
  // sent as HTTP Basic authentication and masked everywhere.
  std::string url;
  // "POST" or "PUT".
  std::string method = "POST";
  // Sent with every request, after the sink's own (names: HTTP tokens, not one the sink sets or
  // HTTP reserves, nor `type` with envelope kExternal; values: no CR, LF or NUL). Their values
  // are masked in --check-config: they often carry credentials (Authorization).
  std::vector<std::pair<std::string, std::string>> headers;
  // Standard Webhooks secrets, "whsec_" + base64 of 16 to 64 random bytes; each signs every
  // request (several: rotation, the receiver accepts any). Empty: requests are not signed.
  std::vector<std::string> secrets;
  // Most requests in flight per host, 1 to 10000.
  std::size_t max_in_flight = 64;
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds request_timeout{30000};
  // 4xx statuses that are retried with an attempt spent (kRejected) whatever their default (400,
  // 413, 415, 422 are otherwise abandoned; 401, 403, 407 otherwise pause the host).
  std::vector<int> retry_statuses;
  // 4xx and 5xx statuses abandoned at once (kPermanent), besides 400, 413, 415 and 422; never 408,
  // 429 or 503 (they ask to wait), nor one listed in retry_statuses.
  std::vector<int> abandon_statuses;
  // The longest Retry-After honoured; a longer one waits this long.
  std::chrono::milliseconds max_retry_after{std::chrono::minutes{10}};
  // The largest payload; larger ones are kPermanent without being sent.
  std::size_t max_message_bytes = std::size_t{1024} * 1024;
  HttpVersion http_version = HttpVersion::kAuto;
  // TLS is always verified: CA certificates to trust (PEM file; empty: the system's), a client
  // certificate and its key (PEM files, both or neither).
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // A proxy URL (http://host:port) for every request; empty: none. The environment's
  // http_proxy/https_proxy are ignored, so that where requests go is what the config says.
  std::string proxy;
  // Which of the outbox's metadata goes with each request (see above and
  // sink/envelope_style.h).
  EnvelopeStyle envelope = EnvelopeStyle::kFull;
  // With envelope kCloudEvents: binary (ce-* headers) or structured mode, and the source.
  cloudevents::Options cloudevents;
  // Where the sink logs its warnings (a host that asked to wait, a host unreachable); unset:
  // nothing.
  LogFn log;
};

// The sink's name, as Sink::Name() returns it, and the `type` of its [sinks.<name>] tables.
inline constexpr std::string_view kSinkName = "http";

// The Standard Webhooks header names.
inline constexpr std::string_view kIdHeader = "webhook-id";
inline constexpr std::string_view kTimestampHeader = "webhook-timestamp";
inline constexpr std::string_view kSignatureHeader = "webhook-signature";
// The header carrying the envelope's type with envelope kFull (other sinks: "type"), and with
// kExternal (which sends no outbox-* header).
inline constexpr std::string_view kTypeHeader = "outbox-type";
inline constexpr std::string_view kExternalTypeHeader = "type";

// The value of webhook-signature for one request: "v1,<base64>" per secret, space-separated.
// Throws std::invalid_argument when a secret is not "whsec_" + base64 of 16 to 64 bytes.
std::string Sign(const std::vector<std::string>& secrets, std::string_view id,
                 std::int64_t timestamp, std::string_view body);

// `url` with the password of its user info replaced by *** ("https://user:***@host/...").
std::string MaskUrl(std::string_view url);

// Checks `options` without connecting. Throws outbox::ConfigError naming the offending key
// ("url", "method", "headers", "secrets", "max_in_flight", "connect_timeout", "request_timeout",
// "retry_statuses", "max_retry_after", "max_message_bytes", "tls_ca_file", "tls_cert_file",
// "tls_key_file", "proxy"); messages never contain a secret, a password or a header value.
// Files must be readable.
void ValidateOptions(const SinkOptions& options);

// Checks `options` and creates the sink; connecting is lazy (the first Publish), so this works
// while the endpoint is down. Throws outbox::ConfigError as ValidateOptions does.
std::unique_ptr<Sink> OpenSink(SinkOptions options);

}  // namespace outbox::webhook
