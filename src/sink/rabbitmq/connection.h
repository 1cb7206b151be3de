#pragma once
// RAII over rabbitmq-c (STYLE.md point 3): one deleter and one alias per handle type, a connection
// that connects or throws (never naming the password), and broker errors classified once into
// outbox::FailureKind.

#include <amqp.h>
#include <amqp_framing.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "outbox/core/failure.h"

namespace outbox::rabbitmq {

struct ConnectionDeleter {
  void operator()(amqp_connection_state_t state) const noexcept {
    amqp_destroy_connection(state);  // also closes and frees the socket
  }
};
using ConnectionPtr = std::unique_ptr<amqp_connection_state_t_, ConnectionDeleter>;

// A message read with amqp_read_message (a returned message, a basic.get reply).
struct MessageDeleter {
  void operator()(amqp_message_t* message) const noexcept {
    amqp_destroy_message(message);
    delete message;
  }
};
using MessagePtr = std::unique_ptr<amqp_message_t, MessageDeleter>;

// A delivery read with amqp_consume_message.
struct EnvelopeDeleter {
  void operator()(amqp_envelope_t* envelope) const noexcept {
    amqp_destroy_envelope(envelope);
    delete envelope;
  }
};
using EnvelopePtr = std::unique_ptr<amqp_envelope_t, EnvelopeDeleter>;

// A broker or library failure, already classified.
class AmqpError : public std::runtime_error {
 public:
  AmqpError(FailureKind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind) {}
  [[nodiscard]] FailureKind kind() const { return kind_; }

 private:
  FailureKind kind_;
};

// The parts of an amqp:// URL.
struct Endpoint {
  std::string host;
  int port = 5672;
  std::string vhost = "/";
  std::string user;
  std::string password;

  // "amqp://user@host:port/vhost", never the password.
  [[nodiscard]] std::string Describe() const;
};

// Parses amqp://user:password@host:port/vhost with amqp_parse_url; an empty vhost is "/". Throws
// std::invalid_argument saying what is wrong (without quoting the URL, which holds a password).
Endpoint ParseUrl(const std::string& url);

inline std::string_view View(amqp_bytes_t bytes) {
  return bytes.len == 0 ? std::string_view{}
                        : std::string_view{static_cast<const char*>(bytes.bytes), bytes.len};
}
// Bytes that point into `text`, which must outlive them.
inline amqp_bytes_t Bytes(std::string_view text) {
  return amqp_bytes_t{.len = text.size(), .bytes = const_cast<char*>(text.data())};
}

inline timeval ToTimeval(std::chrono::microseconds duration) {
  if (duration < std::chrono::microseconds::zero()) duration = std::chrono::microseconds::zero();
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(duration);
  return timeval{.tv_sec = static_cast<time_t>(seconds.count()),
                 .tv_usec = static_cast<suseconds_t>((duration - seconds).count())};
}

// "NOT_FOUND - no exchange 'x' in vhost '/'" for a server exception, the library's message for
// a library error, "" for a normal reply.
std::string DescribeReply(const amqp_rpc_reply_t& reply);

// The failure kind of a channel.close or connection.close reply code caused by a publish:
// 404 NOT_FOUND and the like reject the message (the exchange may appear later; the attempt
// counts); 406 for a message over the broker's size limit is kPermanent; 403 ACCESS_REFUSED (the
// relay's user may not write to that exchange) is kUnavailable: a state of the destination, no
// attempt spent (issue #40).
FailureKind KindOfCloseCode(int reply_code, std::string_view reply_text);

// An owned, logged-in connection. Move-only; the destructor closes quietly and never throws.
class Connection {
 public:
  // Connects, logs in and negotiates `heartbeat`, all within `timeout`, or throws
  // AmqpError(kUnavailable) naming the broker (never the password).
  Connection(const Endpoint& endpoint, std::chrono::milliseconds timeout,
             std::chrono::seconds heartbeat);
  Connection(Connection&&) noexcept = default;
  Connection& operator=(Connection&&) noexcept = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() { Close(std::chrono::milliseconds{1000}); }

  [[nodiscard]] amqp_connection_state_t get() const { return state_.get(); }
  [[nodiscard]] bool is_open() const { return state_ != nullptr; }
  [[nodiscard]] const std::string& description() const { return description_; }
  // The socket's file descriptor, -1 when closed.
  [[nodiscard]] int fd() const { return state_ ? amqp_get_sockfd(state_.get()) : -1; }
  // The broker's "version" server property, e.g. "3.10.8"; "" when unknown.
  [[nodiscard]] std::string ServerVersion() const;

  // Bounds every later RPC (channel.open, declare, close) to `timeout`. An RPC that times out
  // closes the socket.
  void SetRpcTimeout(std::chrono::milliseconds timeout);

  // Throws AmqpError for a failed RPC reply on `channel`: kRejected for a channel exception (the
  // channel is then closed, close-ok sent, and its number may be opened again), kUnavailable
  // otherwise (the connection is then freed). `what` names the operation.
  void Check(const amqp_rpc_reply_t& reply, amqp_channel_t channel, std::string_view what);
  // amqp_get_rpc_reply() checked, for the amqp_*_declare family that return pointers.
  void CheckLastRpc(amqp_channel_t channel, std::string_view what) {
    Check(amqp_get_rpc_reply(get()), channel, what);
  }

  // Opens `channel`, in publisher-confirm mode when `confirms`. Throws AmqpError.
  void OpenChannel(amqp_channel_t channel, bool confirms);

  // Closes the connection politely (connection.close, waiting at most `timeout` for close-ok),
  // then frees it. Returns what went wrong, "" when the close was clean. Never throws.
  std::string Close(std::chrono::milliseconds timeout) noexcept;
  // Frees the connection without a word to the broker (after a socket error).
  void Abandon() noexcept { state_.reset(); }

 private:
  ConnectionPtr state_;
  std::string description_;
};

}  // namespace outbox::rabbitmq
