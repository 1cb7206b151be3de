#pragma once
// The Redis Streams sink (hiredis): one connection; every message is one command (XADD, or with
// deduplication the sink's script through EVALSHA), pipelined with up to `pipeline` commands in
// flight, and its outcome is the server's reply to it. Replies come in command order on one
// connection, so a batch reaches the server in batch order.
//
// What a consumer receives, for an envelope `e`: one entry (XADD with an id chosen by the
// server, "<ms>-<n>") on the stream key `stream` expanded for e ({topic}, {target}, {type}),
// with the fields, all values bytes as stored (numbers in decimal):
//   id                      e.id (MessageId::ToString: 8-4-4-4-12 lower-case hex), always
//   event_id                e.EventId(), always: the same for every copy of a message written
//                           to several targets (the first copy's id), else e.id
//   payload                 e.payload, the bytes as stored (binary-safe), always
//   content_type            e.content_type, when not empty
//   type                    e.type, when set and not empty
// with `envelope` kFull (the default) only (kExternal writes no outbox-* field):
//   outbox-topic            e.topic
//   outbox-stream-key       e.stream_key, when set
//   outbox-stream-seq       e.stream_seq, when set
//   outbox-stream-prev-seq  e.stream_prev_seq, when set (see Envelope)
//   outbox-partition        e.partition (the outbox's)
//   outbox-attempts         e.attempts
//   outbox-target           e.target (the sink's target name)
//   outbox-database         e.database, when not empty (the relay serves several databases)
// and in both styles:
//   <name>                  every user header (traceparent, correlation_id, ...), after the
//                           above. A user header named id, payload, content_type or type (the
//                           sink's own fields, set or not for this message), message_id or
//                           event_id, or starting with "outbox-" (those in any case) is left
//                           out.
// With `envelope` kCloudEvents (sink/cloudevents.h, docs/cloudevents.md) the entry is instead a
// CloudEvent in the manner of the Kafka binding's binary mode (Redis has no binding): each
// attribute, datacontenttype too, as a field ce_<name>, and the payload in the field `data`;
// nothing else (no id, event_id, payload, type or user-header field).
// Read it with XREAD / XREADGROUP / XRANGE; a consumer deduplicates by `id` (the inbox does).
//
// Deduplication (`dedup`, on by default): each message goes through one server-side Lua script
// (loaded once per connection with SCRIPT LOAD, run with EVALSHA, reloaded on NOSCRIPT), atomic
// on the server: if the key <dedup_prefix><id> exists, the entry id stored there is returned and
// nothing is added; otherwise XADD, then SET <dedup_prefix><id> <entry id> PX <dedup_window>.
// The key is written only after XADD succeeded (Redis does not undo a script's earlier writes
// when a later command of it fails), so an XADD that fails (WRONGTYPE, OOM) leaves nothing
// behind. A message published again within `dedup_window` of its first entry (after a lost
// reply, a relay killed before it recorded the outcome, a lease taken over) is therefore not
// added twice; published again later, it is added again (same `id`: the inbox removes it).
// Both keys are declared in KEYS. Redis Cluster is not supported: the sink talks to one server
// (no MOVED/ASK redirection), and on a cluster the two keys would have to hash to one slot.
// A deduplicated message is reported published like any other (logged at debug level).
//
// How outcomes are classified (outbox/core/failure.h), from the reply's error code (its first
// word):
//   kUnavailable     not written, nothing wrong with the message: cannot connect (refused,
//                    reset, timed out; AUTH, SELECT or SCRIPT LOAD refused, e.g. NOAUTH,
//                    WRONGPASS, LOADING: the sink then waits 100 ms before the next attempt,
//                    doubling up to 5 s, and answers kUnavailable at once meanwhile); a reply
//                    LOADING, BUSY, MASTERDOWN, READONLY, NOAUTH, OOM (logged: the server is out
//                    of memory), TRYAGAIN, CLUSTERDOWN, or NOSCRIPT that could not be fixed by
//                    reloading the script: after such a reply nothing more of the batch is sent;
//                    not sent because the batch stopped before the message's turn (connection
//                    lost, deadline passed).
//                    NOPERM (the ACL denies the relay's user that key): a state of the
//                    destination, not of the message (issue #40); other keys go on.
//   kRejected        WRONGTYPE (the stream key holds another type) and any other error reply,
//                    with the server's text ("ERR ...").
//   kPermanent       cannot be written as it is, never sent: the entry (field names and values
//                    together) over `max_message_bytes`; the stream template expanding to an
//                    empty key.
//   kOutcomeUnknown  sent, no reply: the connection was lost or the deadline passed (the
//                    message may be on the stream; published again, the script finds it), or an
//                    unexpected reply (the connection is then dropped).
// After a Publish that left replies outstanding, or a connection error, the connection is
// dropped and made anew by the next Publish (the replies would be out of step). A connection
// found closed at the start of a Publish (server restarted, idle timeout) is re-made before
// anything is sent. Nothing is sent once the deadline has passed.
// Order: one connection executes commands in the order sent. A message that fails with a reply
// while later ones of the batch were already sent may find them written ahead of it (the relay
// holds those back and publishes them again after it, but the first copies stay on the stream).
//
// Durability is the server's: an entry is confirmed when Redis has executed the command, which
// is on disk only as far as its appendonly/appendfsync settings say (appendfsync always: before
// the reply; everysec: up to a second later). No TLS: hiredis 0.14 (Debian bookworm) has none.
//
// Threading: one thread calls Publish or Close at a time; the sink has no thread of its own.

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "outbox/core/log.h"
#include "outbox/sink/cloudevents.h"
#include "outbox/sink/envelope_style.h"
#include "outbox/sink/sink.h"

namespace outbox::redis {

struct SinkOptions {
  // redis://[[user]:password@]host[:port][/db] (port 6379, db 0 when not given; user and password
  // percent-decoded; an IPv6 host in brackets), or unix://[[user]:password@]/path/to/socket[?db=N].
  // With a user: AUTH user password (ACL, Redis 6+); with a password only: AUTH password. Then
  // SELECT db when it is not 0. rediss:// (TLS) is refused: hiredis 0.14 has no TLS.
  std::string url = "redis://127.0.0.1:6379";
  // The stream key. A template: the placeholders {topic}, {target} and {type} are replaced by
  // the envelope's fields ({type} is "" when unset); any other '{' or '}' is a configuration
  // error.
  std::string stream = "{topic}";
  // XADD ... MAXLEN ~ max_len: the stream is trimmed to about this many entries (approximately,
  // which Redis does cheaply). 0: never trimmed.
  std::size_t max_len = 0;
  // Deduplication by message id, see above.
  bool dedup = true;
  // How long a message id is remembered after its entry was added: at least the relay's lease
  // (a warning is logged otherwise), better the longest outage after which an unconfirmed
  // message may be published again. Each remembered id costs the server about 200 bytes for
  // the window (Redis 7): mind the rate.
  std::chrono::milliseconds dedup_window = std::chrono::hours{24};
  // The dedup keys are <dedup_prefix><id>, in the URL's database.
  std::string dedup_prefix = "outbox:dedup:";
  // Most commands sent and not yet answered, at least 1.
  std::size_t pipeline = 1000;
  // TCP (or unix socket) connect plus AUTH, SELECT and SCRIPT LOAD, and no longer than the
  // Publish deadline allows.
  std::chrono::milliseconds connect_timeout{5000};
  // The largest entry: field names and values together (payload, id, headers, ...). Larger ones
  // are kPermanent without being sent.
  std::size_t max_message_bytes = std::size_t{16} * 1024 * 1024;
  // Which of the outbox's metadata goes with each message (see above and sink/envelope_style.h).
  EnvelopeStyle envelope = EnvelopeStyle::kFull;
  // With envelope kCloudEvents: the source (binary mode only: the ce_* fields).
  cloudevents::Options cloudevents;
  // Where the sink logs its warnings (dedup window shorter than the lease, OOM, authentication
  // and connection failures when they change) and, at debug level, deduplicated messages.
  LogFn log;
  // The relay's lease (SinkContext::lease), compared with dedup_window at open. 0: not known.
  std::chrono::milliseconds lease{0};
};

// The sink's name, as Sink::Name() returns it.
inline constexpr std::string_view kSinkName = "redis";
// The entry's fields besides the names of wire_names.h (event_id, outbox-*).
inline constexpr std::string_view kIdField = "id";
inline constexpr std::string_view kPayloadField = "payload";
inline constexpr std::string_view kContentTypeField = "content_type";
inline constexpr std::string_view kTypeField = "type";
// With envelope kCloudEvents: the attributes' fields (ce_<name>) and the payload's.
inline constexpr std::string_view kCloudEventsFieldPrefix = "ce_";
inline constexpr std::string_view kCloudEventsDataField = "data";

// Where a URL connects, and as whom.
struct Endpoint {
  std::string host;                     // TCP: without brackets; empty for a unix socket
  int port = 6379;                      // TCP
  std::string unix_path;                // a unix socket: its path
  std::string user;                     // ACL user; empty: AUTH with the password only
  std::optional<std::string> password;  // unset: no AUTH
  int db = 0;

  // "host:port" / "[v6]:port" / "unix:/path", with "/db" when db is not 0; never the password.
  [[nodiscard]] std::string Describe() const;
};

// Reads a redis:// or unix:// URL. Throws outbox::ConfigError("url", ...) naming what is wrong;
// its message never contains the password.
Endpoint ParseUrl(std::string_view url);

// `url` with its password replaced by *** (parsed as ParseUrl does; a URL it refuses is masked
// as free text, config::MaskPassword).
std::string MaskUrl(std::string_view url);

// Checks `options` without connecting. Throws outbox::ConfigError naming the offending key
// ("url", "stream", "dedup_window", "dedup_prefix", "pipeline", "connect_timeout",
// "max_message_bytes"); messages never contain the password.
void ValidateOptions(const SinkOptions& options);

// Checks `options` and creates the sink; connecting is lazy (the first Publish), so this works
// while the server is down. Logs a warning when dedup is on and dedup_window is shorter than
// `lease`. Throws outbox::ConfigError as ValidateOptions does.
std::unique_ptr<Sink> OpenSink(SinkOptions options);

}  // namespace outbox::redis
