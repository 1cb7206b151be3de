#include "connection.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <utility>

namespace outbox::redis {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// Written bytes are dropped from the front of the buffer once this many have piled up.
constexpr std::size_t kCompactAt = std::size_t{1024} * 1024;

// Milliseconds from now until `until`, rounded up, at least 0, at most INT_MAX (for poll).
int MillisUntil(Deadline until) {
  const auto left = std::chrono::ceil<milliseconds>(until - SteadyClock::now()).count();
  return static_cast<int>(std::clamp<std::int64_t>(left, 0, INT_MAX));
}

void AppendNumber(std::string& out, std::size_t value) {
  char digits[24];
  const auto result = std::to_chars(std::begin(digits), std::end(digits), value);
  out.append(std::begin(digits), result.ptr);
}

}  // namespace

Connection Connection::Open(const Endpoint& endpoint, Deadline deadline) {
  const bool unix_socket = !endpoint.unix_path.empty();
  ContextPtr context{unix_socket ? redisConnectUnixNonBlock(endpoint.unix_path.c_str())
                                 : redisConnectNonBlock(endpoint.host.c_str(), endpoint.port)};
  if (!context) throw ConnectError("out of memory for the connection");
  if (context->err != 0) throw ConnectError(context->errstr);
  // The connect is in progress: it is done when the socket is writable.
  pollfd fd{.fd = context->fd, .events = POLLOUT, .revents = 0};
  for (;;) {
    const int ready = poll(&fd, 1, MillisUntil(deadline));
    if (ready > 0) break;
    if (ready == 0) throw ConnectError("connect timed out");
    if (errno != EINTR) throw ConnectError(std::string{"poll: "} + std::strerror(errno));
  }
  int error = 0;
  socklen_t size = sizeof error;
  if (getsockopt(context->fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) error = errno;
  if (error != 0) throw ConnectError(std::strerror(error));
  // A server gone without a word (power off, cable) is noticed while idle, too.
  if (!unix_socket) redisEnableKeepAlive(context.get());
  return Connection{std::move(context)};
}

void Connection::Append(std::span<const std::string_view> args) {
  const std::size_t before = out_.size();
  out_ += '*';
  AppendNumber(out_, args.size());
  out_ += "\r\n";
  for (const std::string_view arg : args) {
    out_ += '$';
    AppendNumber(out_, arg.size());
    out_ += "\r\n";
    out_ += arg;
    out_ += "\r\n";
  }
  appended_ += out_.size() - before;
}

bool Connection::Send() {
  while (out_begin_ < out_.size()) {
    const ssize_t sent = send(context_->fd, out_.data() + out_begin_, out_.size() - out_begin_,
                              MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      out_begin_ += static_cast<std::size_t>(sent);
      written_ += static_cast<std::uint64_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return Lose(std::string{"send: "} + std::strerror(errno));
  }
  if (out_begin_ == out_.size()) {
    out_.clear();
    out_begin_ = 0;
  } else if (out_begin_ >= kCompactAt) {
    out_.erase(0, out_begin_);
    out_begin_ = 0;
  }
  return true;
}

bool Connection::Pump(Deadline until, bool busy) {
  if (!Send()) return false;
  const bool wait = !(busy && unsent() == 0);
  pollfd fd{.fd = context_->fd,
            .events = static_cast<short>(POLLIN | (unsent() > 0 ? POLLOUT : 0)),
            .revents = 0};
  const int ready = poll(&fd, 1, wait ? MillisUntil(until) : 0);
  if (ready < 0) {
    return errno == EINTR ? true : Lose(std::string{"poll: "} + std::strerror(errno));
  }
  if (ready == 0) return true;
  if ((fd.revents & POLLOUT) != 0 && !Send()) return false;
  if ((fd.revents & (POLLIN | POLLHUP | POLLERR)) != 0 &&
      redisBufferRead(context_.get()) != REDIS_OK) {
    return Lose(context_->errstr);
  }
  return true;
}

ReplyPtr Connection::NextReply(bool* ok) {
  void* reply = nullptr;
  // Non-blocking context: only what has been read already.
  if (redisGetReply(context_.get(), &reply) != REDIS_OK) {
    *ok = Lose(std::string{"reading a reply: "} + context_->errstr);
    return nullptr;
  }
  return ReplyPtr{static_cast<redisReply*>(reply)};
}

bool Connection::StillOpen() {
  pollfd fd{.fd = context_->fd, .events = POLLIN, .revents = 0};
  if (poll(&fd, 1, 0) <= 0) return true;
  if (redisBufferRead(context_.get()) != REDIS_OK) return Lose(context_->errstr);
  return Lose("the server sent something unasked");
}

bool Connection::Lose(std::string reason) {
  error_ = reason.empty() ? "connection error" : std::move(reason);
  return false;
}

}  // namespace outbox::redis
