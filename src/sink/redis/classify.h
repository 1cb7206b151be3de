#pragma once
// How an error reply of the server becomes an outcome (outbox/core/failure.h), in one function so
// that each row of the table in sink/redis.h has its test (tests/redis).

#include <string>
#include <string_view>

#include "outbox/core/failure.h"
#include "outbox/sink/sink_base.h"

namespace outbox::redis {

struct ErrorVerdict {
  // The reply's error code, its first word ("WRONGTYPE", "ERR", "LOADING", ...).
  std::string code;
  Failure failure;
  // The server cannot take writes now (loading, busy script, read-only replica, out of memory,
  // ...): whatever of the batch is not sent yet is not sent.
  bool server_state = false;
  // The connection should be made anew (READONLY: a failover may have moved the primary; NOAUTH:
  // the server forgot this connection's AUTH).
  bool reconnect = false;
  bool out_of_memory = false;  // OOM: logged
};

// The verdict for the error reply `text` (e.g. "WRONGTYPE Operation against a key holding the
// wrong kind of value"). The failure's reason is the server's text, cut to a few hundred bytes.
ErrorVerdict ClassifyErrorReply(std::string_view text);

// `text` cut to at most `max` bytes (never inside a UTF-8 sequence), "..." appended when cut:
// the sinks' Shorten, with a longer default for the server's error texts.
inline std::string Shorten(std::string_view text, std::size_t max = 300) {
  return outbox::Shorten(text, max);
}

}  // namespace outbox::redis
