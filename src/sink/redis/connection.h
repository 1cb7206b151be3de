#pragma once
// One connection to a Redis server, for the sink: hiredis connects (non-blocking) and parses the
// replies; commands are encoded here (RESP arrays of bulk strings) into a buffer of our own and
// written with send(MSG_NOSIGNAL), so that a closed socket is an error rather than SIGPIPE and
// the sink knows how far each command got. Every wait is bounded by a deadline (poll), none by
// socket timeouts.

#include <chrono>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "handles.h"
#include "outbox/core/clock.h"
#include "outbox/sink/redis.h"

namespace outbox::redis {

// Connecting failed (refused, timed out, ...); the message names the server, never a password.
class ConnectError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Connection {
 public:
  // Connects to `endpoint` (TCP with keep-alive, or its unix socket) by `deadline`. Throws
  // ConnectError.
  static Connection Open(const Endpoint& endpoint, Deadline deadline);

  Connection(Connection&&) noexcept = default;
  Connection& operator=(Connection&&) noexcept = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() = default;  // redisFree closes the socket

  // Appends one command (its arguments, binary-safe) to what is to be sent.
  void Append(std::span<const std::string_view> args);
  // Bytes appended / written to the socket since the connection was made: a command appended
  // when appended() was A was (at least partly) sent once written() > A.
  [[nodiscard]] std::uint64_t appended() const { return appended_; }
  [[nodiscard]] std::uint64_t written() const { return written_; }
  [[nodiscard]] std::size_t unsent() const { return out_.size() - out_begin_; }

  // Sends what the socket takes now; then, unless `busy` (the caller has more to append and
  // nothing is unsent), waits until `until` for the socket to become readable (or writable, when
  // something is unsent), and reads what has come. False when the connection is lost (error()
  // says why).
  bool Pump(Deadline until, bool busy);
  // The next complete reply read so far, or null; sets *ok to false on a protocol error.
  ReplyPtr NextReply(bool* ok);
  // Before a batch, on a connection that should have nothing to read: false when the server
  // closed it (or sent something unasked, which leaves replies out of step).
  bool StillOpen();

  [[nodiscard]] const std::string& error() const { return error_; }

 private:
  explicit Connection(ContextPtr context) : context_(std::move(context)) {}
  bool Send();
  bool Lose(std::string reason);

  ContextPtr context_;
  std::string out_;
  std::size_t out_begin_ = 0;  // out_[0, out_begin_) is written
  std::uint64_t appended_ = 0;
  std::uint64_t written_ = 0;
  std::string error_;
};

}  // namespace outbox::redis
