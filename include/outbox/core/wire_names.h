#pragma once
// The names under which the outbox's own metadata travels on the wire, in one place: the sinks
// that set them, the inbox that reads them, and whatever else (examples, tests, benchmarks) has
// to spell them. Consumers in other languages rely on them: never rename one.
//
// RabbitMQ: the id is the message_id property; the rest are headers (field-table entries):
//   event_id                string  the event's id: the same for every copy of a message written
//                                   to several targets (the first copy's id), else the message's
//                                   own id. Sent by every envelope style.
// The rest are internal metadata, sent only by a sink with envelope = "full" (the default):
//   outbox-topic            string  the message's topic
//   outbox-stream-key       string  its stream (ordering) key, when it has one
//   outbox-stream-seq       long    its stream_seq, when its stream is sequenced
//   outbox-stream-prev-seq  long    only when the messages just before it in its stream were
//                                   abandoned: the seq of the latest earlier message of the
//                                   stream that was not (0 if none); see Envelope
//   outbox-partition        int     its partition
//   outbox-attempts         int     attempts spent before this one
//   outbox-target           string  the target (sink name) that sent this copy: stream_seq counts
//                                   per (target, stream), so an inbox keeps its marks per target
//   outbox-database         string  only when the relay serves several databases (tenants): the
//                                   name of the database the message was read from. The same
//                                   stream key in two databases is two streams, and stream_seq
//                                   counts per (database, target, stream)

#include <string_view>

#include "outbox/core/ascii.h"

namespace outbox::wire {

// A user header may not be named message_id or event_id or start with this prefix: the outbox's
// own metadata travels under those names.
inline constexpr std::string_view kReservedHeaderPrefix = "outbox-";
inline constexpr std::string_view kMessageId = "message_id";
inline constexpr std::string_view kEventId = "event_id";

// True for the names above: a user header of such a name is refused by the stores and skipped by
// the sinks. A-Z and a-z taken as equal (HTTP and NATS header names are case-insensitive).
constexpr bool IsReservedName(std::string_view name) {
  return EqualsNoCase(name, kMessageId) || EqualsNoCase(name, kEventId) ||
         StartsWithNoCase(name, kReservedHeaderPrefix);
}

inline constexpr std::string_view kTopicHeader = "outbox-topic";
inline constexpr std::string_view kStreamKeyHeader = "outbox-stream-key";
inline constexpr std::string_view kStreamSeqHeader = "outbox-stream-seq";
inline constexpr std::string_view kStreamPrevSeqHeader = "outbox-stream-prev-seq";
inline constexpr std::string_view kPartitionHeader = "outbox-partition";
inline constexpr std::string_view kAttemptsHeader = "outbox-attempts";
inline constexpr std::string_view kTargetHeader = "outbox-target";
inline constexpr std::string_view kDatabaseHeader = "outbox-database";

}  // namespace outbox::wire
