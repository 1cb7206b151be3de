#pragma once
// One deleter and one owning alias per hiredis handle type (STYLE.md point 3), for the sink and
// for the tests' own clients. hiredis's header stays under src/.

#include <hiredis/hiredis.h>

#include <memory>

namespace outbox::redis {

struct ContextDeleter {
  void operator()(redisContext* context) const { redisFree(context); }
};
// A connection (redisConnect*): redisFree closes its socket.
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;

struct ReplyDeleter {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
// A reply from redisGetReply / redisCommand (with its nested elements).
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

}  // namespace outbox::redis
