#pragma once
// The deduplicating script of the Redis sink (sink/redis.h), in one place for the sink and for
// the tests that run it directly.
//
//   KEYS[1]  the stream
//   KEYS[2]  the dedup key, <dedup_prefix><message id>
//   ARGV[1]  the dedup window, in milliseconds
//   ARGV[2]  MAXLEN ~ for XADD, "" for none
//   ARGV[3..] the entry's fields and values
// Returns {entry id, 1} when it added the entry, {the remembered entry id, 0} when the id was
// seen within the window.
//
// Redis does not undo a script's earlier writes when a later command of it fails: so the key is
// only read before XADD, and written after it succeeded. An XADD that fails (WRONGTYPE; OOM,
// which Redis checks at a script's first write) leaves nothing behind; SET cannot fail once XADD
// has written (no OOM check after a script's first write; SET overwrites any type).

#include <string_view>

namespace outbox::redis {

inline constexpr std::string_view kDedupScript =
    "local seen = redis.call('GET', KEYS[2])\n"
    "if seen then return {seen, 0} end\n"
    "local id\n"
    "if ARGV[2] == '' then\n"
    "  id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))\n"
    "else\n"
    "  id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))\n"
    "end\n"
    "redis.call('SET', KEYS[2], id, 'PX', ARGV[1])\n"
    "return {id, 1}\n";

}  // namespace outbox::redis
