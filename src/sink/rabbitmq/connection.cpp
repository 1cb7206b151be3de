#include "connection.h"

#include <amqp_tcp_socket.h>

#include <array>
#include <stdexcept>
#include <vector>

namespace outbox::rabbitmq {
namespace {

std::string CloseText(int code, amqp_bytes_t text) {
  std::string out{View(text)};
  if (out.empty()) out = "reply code " + std::to_string(code);
  return out;
}

}  // namespace

std::string Endpoint::Describe() const {
  std::string out = "amqp://";
  if (!user.empty()) out += user + "@";
  out += host + ":" + std::to_string(port) + "/";
  if (vhost != "/") out += vhost;
  return out;
}

Endpoint ParseUrl(const std::string& url) {
  if (url.starts_with("amqps://")) {
    throw std::invalid_argument("amqps:// (TLS) is not supported yet; use amqp://");
  }
  if (!url.starts_with("amqp://")) {
    throw std::invalid_argument("expected an amqp:// URL");
  }
  std::vector<char> buffer(url.begin(), url.end());
  buffer.push_back('\0');
  amqp_connection_info info{};
  amqp_default_connection_info(&info);
  if (amqp_parse_url(buffer.data(), &info) != AMQP_STATUS_OK) {
    throw std::invalid_argument("not a valid AMQP URL (amqp://user:password@host:port/vhost)");
  }
  Endpoint endpoint;
  endpoint.host = info.host != nullptr ? info.host : "";
  endpoint.port = info.port;
  endpoint.vhost = info.vhost != nullptr && info.vhost[0] != '\0' ? info.vhost : "/";
  endpoint.user = info.user != nullptr ? info.user : "";
  endpoint.password = info.password != nullptr ? info.password : "";
  if (endpoint.host.empty()) throw std::invalid_argument("the AMQP URL names no host");
  if (endpoint.port <= 0 || endpoint.port > 65535) {
    throw std::invalid_argument("the AMQP URL's port is out of range");
  }
  return endpoint;
}

std::string DescribeReply(const amqp_rpc_reply_t& reply) {
  switch (reply.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      return "";
    case AMQP_RESPONSE_NONE:
      return "no reply (missing RPC reply type)";
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      return amqp_error_string2(reply.library_error);
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD && reply.reply.decoded != nullptr) {
        const auto* close = static_cast<const amqp_channel_close_t*>(reply.reply.decoded);
        return CloseText(close->reply_code, close->reply_text);
      }
      if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD && reply.reply.decoded != nullptr) {
        const auto* close = static_cast<const amqp_connection_close_t*>(reply.reply.decoded);
        return CloseText(close->reply_code, close->reply_text);
      }
      return "unexpected server method " + std::to_string(reply.reply.id);
  }
  return "unknown reply type";
}

FailureKind KindOfCloseCode(int reply_code, std::string_view reply_text) {
  if (reply_code == AMQP_PRECONDITION_FAILED &&
      reply_text.find("larger than configured max size") != std::string_view::npos) {
    return FailureKind::kPermanent;
  }
  // The relay's user may not write there (issue #40): a state of the destination, not of the
  // message; it waits, no attempt spent, until the permission is granted.
  if (reply_code == AMQP_ACCESS_REFUSED) return FailureKind::kUnavailable;
  return FailureKind::kRejected;
}

Connection::Connection(const Endpoint& endpoint, std::chrono::milliseconds timeout,
                       std::chrono::seconds heartbeat)
    : state_(amqp_new_connection()), description_(endpoint.Describe()) {
  const std::string prefix = "cannot connect to RabbitMQ (" + description_ + "): ";
  if (!state_) throw AmqpError(FailureKind::kUnavailable, prefix + "out of memory");
  amqp_socket_t* socket = amqp_tcp_socket_new(state_.get());  // owned by the connection
  if (socket == nullptr) throw AmqpError(FailureKind::kUnavailable, prefix + "out of memory");

  const timeval tv = ToTimeval(timeout);
  const int opened = amqp_socket_open_noblock(socket, endpoint.host.c_str(), endpoint.port, &tv);
  if (opened != AMQP_STATUS_OK) {
    std::string reason = amqp_error_string2(opened);  // "a socket error occurred" if refused
    if (opened == AMQP_STATUS_TIMEOUT) {
      reason = "no TCP connection within " + std::to_string(timeout.count()) + " ms";
    }
    throw AmqpError(FailureKind::kUnavailable, prefix + reason);
  }
  amqp_set_handshake_timeout(state_.get(), &tv);
  amqp_set_rpc_timeout(state_.get(), &tv);

  // Ask for connection.blocked notifications (merged into rabbitmq-c's default capabilities),
  // and name the connection for the management UI.
  std::array<amqp_table_entry_t, 1> capability_entries{};
  capability_entries[0].key = amqp_cstring_bytes("connection.blocked");
  capability_entries[0].value.kind = AMQP_FIELD_KIND_BOOLEAN;
  capability_entries[0].value.value.boolean = 1;
  std::array<amqp_table_entry_t, 2> property_entries{};
  property_entries[0].key = amqp_cstring_bytes("capabilities");
  property_entries[0].value.kind = AMQP_FIELD_KIND_TABLE;
  property_entries[0].value.value.table = {.num_entries = 1, .entries = capability_entries.data()};
  property_entries[1].key = amqp_cstring_bytes("connection_name");
  property_entries[1].value.kind = AMQP_FIELD_KIND_UTF8;
  property_entries[1].value.value.bytes = amqp_cstring_bytes("outbox rabbitmq sink");
  const amqp_table_t properties{.num_entries = 2, .entries = property_entries.data()};

  const auto reply = amqp_login_with_properties(
      state_.get(), endpoint.vhost.c_str(), 0, AMQP_DEFAULT_FRAME_SIZE,
      static_cast<int>(heartbeat.count()), &properties, AMQP_SASL_METHOD_PLAIN,
      endpoint.user.c_str(), endpoint.password.c_str());
  if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
    std::string reason = DescribeReply(reply);
    if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
        reply.library_error == AMQP_STATUS_CONNECTION_CLOSED) {
      reason +=
          " (RabbitMQ closes the connection on a refused login: check the user, password "
          "and vhost)";
    }
    throw AmqpError(FailureKind::kUnavailable, prefix + "login failed: " + reason);
  }
}

std::string Connection::ServerVersion() const {
  if (!state_) return "";
  const amqp_table_t* properties = amqp_get_server_properties(state_.get());
  if (properties == nullptr) return "";
  for (int i = 0; i < properties->num_entries; ++i) {
    const amqp_table_entry_t& entry = properties->entries[i];
    if (View(entry.key) == "version" && entry.value.kind == AMQP_FIELD_KIND_UTF8) {
      return std::string{View(entry.value.value.bytes)};
    }
  }
  return "";
}

void Connection::SetRpcTimeout(std::chrono::milliseconds timeout) {
  if (!state_) return;
  const timeval tv = ToTimeval(timeout);
  amqp_set_rpc_timeout(state_.get(), &tv);
}

void Connection::Check(const amqp_rpc_reply_t& reply, amqp_channel_t channel,
                       std::string_view what) {
  if (reply.reply_type == AMQP_RESPONSE_NORMAL) return;
  const std::string message = std::string{what} + ": " + DescribeReply(reply);
  if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
      reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD && state_) {
    // Only the channel is closed: acknowledge, so that its number can be opened again.
    amqp_channel_close_ok_t close_ok{};
    if (amqp_send_method(state_.get(), channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &close_ok) ==
        AMQP_STATUS_OK) {
      throw AmqpError(FailureKind::kRejected, message);
    }
  } else if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
             reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD && state_) {
    amqp_connection_close_ok_t close_ok{};
    amqp_send_method(state_.get(), 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &close_ok);
  }
  state_.reset();
  throw AmqpError(FailureKind::kUnavailable, message);
}

void Connection::OpenChannel(amqp_channel_t channel, bool confirms) {
  amqp_channel_open(get(), channel);
  CheckLastRpc(channel, "channel.open");
  if (confirms) {
    amqp_confirm_select(get(), channel);
    CheckLastRpc(channel, "confirm.select");
  }
}

std::string Connection::Close(std::chrono::milliseconds timeout) noexcept {
  if (!state_) return "";
  SetRpcTimeout(timeout);
  const std::string problem =
      DescribeReply(amqp_connection_close(state_.get(), AMQP_REPLY_SUCCESS));
  state_.reset();
  return problem;
}

}  // namespace outbox::rabbitmq
