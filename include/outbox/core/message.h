#pragma once
// The message model of DESIGN.md: what a writer enqueues (NewMessage) and what a relay claims and
// hands to a sink (Envelope).

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/core/clock.h"
#include "outbox/core/uuid.h"
#include "outbox/core/wire_names.h"

namespace outbox {

// Header names are case-sensitive; ordered so that rendering is deterministic.
using Headers = std::map<std::string, std::string, std::less<>>;

// Well-known header names, carried to every broker.
inline constexpr std::string_view kCorrelationIdHeader = "correlation_id";
inline constexpr std::string_view kCausationIdHeader = "causation_id";
inline constexpr std::string_view kTenantIdHeader = "tenant_id";
inline constexpr std::string_view kTraceparentHeader = "traceparent";
// Names a user may not set: the outbox's own metadata travels under them (wire_names.h).
inline constexpr std::string_view kReservedHeaderPrefix = wire::kReservedHeaderPrefix;
inline constexpr std::string_view kMessageIdHeader = wire::kMessageId;

inline constexpr std::string_view kJsonContentType = "application/json";
inline constexpr std::string_view kDefaultTarget = "default";
// The most targets one message may be written to (the stores refuse more).
inline constexpr std::size_t kMaxTargets = 32;

// A message as a writer enqueues it. The id, partition and stream_seq are assigned by the store.
struct NewMessage {
  std::string topic;  // required
  std::string payload;
  std::string content_type{kJsonContentType};
  std::optional<std::string> stream_key;  // ordering key, usually the aggregate id
  std::optional<std::string> type;        // event type name, e.g. "OrderPlaced"
  Headers headers;                        // correlation_id, causation_id, traceparent, ...
  // The configured sinks it goes to. One copy is written per target, in the same transaction
  // (fan-out): each copy has its own id, status, attempts and stream_seq (per target and stream),
  // and all share one event id, the first copy's id, so that consumers at different destinations
  // can correlate them. Empty: the topic's default targets (PostgreSQL: the `targets` of
  // outbox.topic_settings), else "default". At most kMaxTargets, no duplicates.
  std::vector<std::string> targets;
  // Whether a keyed message gets a gap-free stream_seq (writers of its stream then serialize
  // until commit). Unset: the store's setting for the topic.
  std::optional<bool> sequenced;
};

// Limits a store enforces on enqueue. The header limits default to what every planned sink
// carries with its own defaults, with room for the outbox's own metadata (README, "Writing
// messages"); the PostgreSQL store's settings have the same names and defaults
// (sql/007_enqueue_input.sql), and a test keeps them equal.
struct MessageLimits {
  std::size_t max_topic_bytes = 255;
  std::size_t max_stream_key_bytes = 255;
  std::size_t max_payload_bytes = 1024 * 1024;
  std::size_t max_header_count = 64;        // an HTTP server takes 100 header fields (Apache)
  std::size_t max_header_name_bytes = 128;  // AMQP 0-9-1 field names: at most 128
  std::size_t max_header_value_bytes = 4096;
  // Names and values of all headers together: an HTTP server takes 16 KiB of headers (Node.js).
  std::size_t max_headers_bytes = 8192;
};

// Empty when `message` is valid; otherwise what is wrong, naming the field and the limit it
// breaks, e.g. "header 'x-a': value contains a control character (0x0a)", "headers: 8200 bytes
// of names and values, over the limit of 8192 (max_headers_bytes)".
std::string ValidateMessage(const NewMessage& message, const MessageLimits& limits = {});
// The targets part of ValidateMessage: each a valid name, none twice, at most kMaxTargets.
std::string ValidateTargets(std::span<const std::string> targets);
// The header part of ValidateMessage.
std::string ValidateHeaders(const Headers& headers, const MessageLimits& limits = {});

// A claimed message, as the relay and sinks see it.
struct Envelope {
  MessageId id;
  // Set for a copy of a message written to several targets: the id of its first copy, shared by
  // all of them. Unset: the message was written to one target and its event id is its own id.
  std::optional<MessageId> event_id;
  std::string topic;
  std::optional<std::string> stream_key;
  std::optional<std::int64_t> stream_seq;  // set for ordered streams
  // Set by the claim only when the messages just before this one in its stream were abandoned
  // (the relay gave up on them, or an operator did): the stream_seq of the latest earlier message
  // of the stream that was not abandoned, 0 if there is none. A consumer whose stream mark has
  // reached it knows that the seqs in between will not come (unless an operator replays them),
  // instead of waiting for them forever. Unset when the predecessor was published, or for
  // messages without a stream_seq.
  std::optional<std::int64_t> stream_prev_seq;
  int partition = 0;
  std::string target{kDefaultTarget};
  // The name of the database (tenant) the message was read from, when one relay serves several
  // databases (outboxd's `[[databases]]` / `[discovery]`): sinks send it as wire::kDatabaseHeader.
  // Empty when the relay serves one database; then nothing is sent for it.
  std::string database;
  std::optional<std::string> type;
  std::string payload;
  std::string content_type{kJsonContentType};
  Headers headers;
  int attempts = 0;  // attempts spent so far
  TimePoint created_at;
  std::int64_t lease_epoch = 0;  // fences completion: see Store::Complete

  // What sinks send as the event id (wire::kEventId): the same for every copy of one event.
  [[nodiscard]] MessageId EventId() const { return event_id.value_or(id); }
};

}  // namespace outbox
