// The RabbitMQ sink: publisher confirms over one channel, windowed, outcomes in batch order.
//
// How a batch goes out. Messages are published in batch order on channel 1, which is in confirm
// mode; every publish gets the next delivery tag and an entry in `pending_` (ordered by tag).
// Its frames are encoded here (rabbitmq-c's amqp_encode_method and amqp_encode_properties, the
// frame envelope by hand) into one buffer, written with one send() per 64 KiB and before any
// wait for the broker; rabbitmq-c has no call that writes many publishes at once.
// Frames from the broker are read between publishes whenever the socket has something, and once
// `confirm_window` publishes are unconfirmed the loop waits for frames before sending more:
//   basic.ack (multiple)   settles every pending tag up to the given one: published, or
//                          rejected when a basic.return came first for it
//   basic.nack (multiple)  settles the same range as rejected
//   basic.return           marks the pending publish with that message_id (mandatory and
//                          unroutable); RabbitMQ sends it just before the ack for that message
//   channel.close          the channel is gone: the publish that caused it (the first pending one
//                          to the exchange named in a 404) is rejected, every other pending one
//                          is outcome-unknown, nothing more of the batch is sent, and the channel
//                          is reopened on the next Publish
//   connection.close / socket error
//                          pending publishes are outcome-unknown, unsent ones unavailable; the
//                          next Publish reconnects
// A publish still unconfirmed when the deadline passes is outcome-unknown; its tag stays in
// `pending_` (without a batch index) so that its late confirm is recognized and ignored.

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "connection.h"
#include "outbox/core/ascii.h"
#include "outbox/core/error.h"
#include "outbox/core/wire_names.h"
#include "outbox/sink/cloudevents.h"
#include "outbox/sink/name_template.h"
#include "outbox/sink/rabbitmq.h"
#include "outbox/sink/sink_base.h"

namespace outbox::rabbitmq {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

constexpr amqp_channel_t kChannel = 1;
constexpr milliseconds kCloseTimeout{2000};
// AMQP 0-9-1 limits: short strings (exchange, routing key, message properties) and field-table
// keys.
constexpr std::size_t kShortStringMax = 255;
constexpr std::size_t kFieldNameMax = 128;
// Stores refuse longer header names by default (core/message.h), so that none is abandoned here.
static_assert(MessageLimits{}.max_header_name_bytes <= kFieldNameMax);
// The socket is polled (for the broker's frames, and for room to write) at least every this
// many messages or bytes.
constexpr std::size_t kPollEveryMessages = 16;
constexpr std::size_t kPollEveryBytes = std::size_t{64} * 1024;
constexpr std::size_t kPerMessageOverhead = 256;  // frames, properties, headers (roughly)
// Publishes are encoded into one buffer and written with one send() once it holds this much (or
// before any wait for the broker): rabbitmq-c's amqp_basic_publish makes three send() calls a
// message, and on this machine those calls were most of the relay's CPU, which the broker needs.
constexpr std::size_t kWriteBytes = std::size_t{64} * 1024;
// An AMQP frame's header (type, channel, size) and end octet.
constexpr std::size_t kFrameHeaderBytes = 7;
constexpr std::size_t kFrameEndBytes = 1;
// The text between `prefix` and the next quote in `text`, e.g. the exchange of
// "NOT_FOUND - no exchange 'orders' in vhost '/'".
std::optional<std::string> QuotedAfter(std::string_view text, std::string_view prefix) {
  const std::size_t at = text.find(prefix);
  if (at == std::string_view::npos) return std::nullopt;
  const std::size_t begin = at + prefix.size();
  const std::size_t end = text.find('\'', begin);
  if (end == std::string_view::npos) return std::nullopt;
  return std::string{text.substr(begin, end - begin)};
}

// The number after `prefix` in `text`, e.g. N in "message size N is larger than ...".
std::optional<std::size_t> NumberAfter(std::string_view text, std::string_view prefix) {
  const std::size_t at = text.find(prefix);
  if (at == std::string_view::npos) return std::nullopt;
  std::size_t value = 0;
  bool any = false;
  for (std::size_t i = at + prefix.size(); i < text.size() && text[i] >= '0' && text[i] <= '9';
       ++i) {
    value = value * 10 + static_cast<std::size_t>(text[i] - '0');
    any = true;
  }
  return any ? std::optional<std::size_t>{value} : std::nullopt;
}

// One message in AMQP form. Its properties point into its own members and into the envelope,
// so both must stay put until the publish returns.
struct Prepared {
  std::string exchange;
  std::string routing_key;
  std::string message_id;
  std::string event_id;
  std::vector<amqp_table_entry_t> headers;
  amqp_basic_properties_t properties{};
  // With envelope = "cloudevents": the attributes (names with their prefix) the headers point
  // into, and the body when it is not the payload (structured mode).
  std::vector<cloudevents::Attribute> attributes;
  std::optional<std::string> body;
};

amqp_table_entry_t StringEntry(std::string_view key, std::string_view value) {
  amqp_table_entry_t entry{};
  entry.key = Bytes(key);
  entry.value.kind = AMQP_FIELD_KIND_UTF8;
  entry.value.value.bytes = Bytes(value);
  return entry;
}

amqp_table_entry_t Int64Entry(std::string_view key, std::int64_t value) {
  amqp_table_entry_t entry{};
  entry.key = Bytes(key);
  entry.value.kind = AMQP_FIELD_KIND_I64;
  entry.value.value.i64 = value;
  return entry;
}

amqp_table_entry_t Int32Entry(std::string_view key, std::int32_t value) {
  amqp_table_entry_t entry{};
  entry.key = Bytes(key);
  entry.value.kind = AMQP_FIELD_KIND_I32;
  entry.value.value.i32 = value;
  return entry;
}

// The encoded size of the content-header frame carrying `properties` (AMQP 0-9-1 section 4.2.6):
// it must fit in one frame.
std::size_t HeaderFrameSize(const amqp_basic_properties_t& properties) {
  std::size_t size = 7 + 1 + 14;  // frame header and end octet; class, weight, body size, flags
  const auto short_string = [&](amqp_flags_t flag, amqp_bytes_t bytes) {
    if ((properties._flags & flag) != 0U) size += 1 + bytes.len;
  };
  short_string(AMQP_BASIC_CONTENT_TYPE_FLAG, properties.content_type);
  short_string(AMQP_BASIC_CORRELATION_ID_FLAG, properties.correlation_id);
  short_string(AMQP_BASIC_MESSAGE_ID_FLAG, properties.message_id);
  short_string(AMQP_BASIC_TYPE_FLAG, properties.type);
  if ((properties._flags & AMQP_BASIC_DELIVERY_MODE_FLAG) != 0U) size += 1;
  if ((properties._flags & AMQP_BASIC_TIMESTAMP_FLAG) != 0U) size += 8;
  if ((properties._flags & AMQP_BASIC_HEADERS_FLAG) != 0U) {
    size += 4;
    for (int i = 0; i < properties.headers.num_entries; ++i) {
      const amqp_table_entry_t& entry = properties.headers.entries[i];
      size += 1 + entry.key.len + 1;
      switch (entry.value.kind) {
        case AMQP_FIELD_KIND_I64:
          size += 8;
          break;
        case AMQP_FIELD_KIND_I32:
          size += 4;
          break;
        default:
          size += 4 + entry.value.value.bytes.len;
          break;
      }
    }
  }
  return size;
}

class RabbitSink final : public SinkBase {
 public:
  explicit RabbitSink(SinkOptions options)
      : options_(std::move(options)),
        endpoint_(ParseUrl(options_.url)),
        exchange_(NameTemplate::Parse(options_.exchange, "exchange")),
        routing_key_(NameTemplate::Parse(options_.routing_key, "routing_key")),
        cloudevents_(options_.cloudevents) {}

  RabbitSink(const RabbitSink&) = delete;
  RabbitSink& operator=(const RabbitSink&) = delete;
  ~RabbitSink() override { Close(); }

  [[nodiscard]] std::string_view Name() const override { return kSinkName; }

  void Close() override {
    if (connection_) {
      const milliseconds timeout = std::min(options_.connect_timeout, kCloseTimeout);
      connection_->SetRpcTimeout(timeout);
      if (channel_open_) amqp_channel_close(connection_->get(), kChannel, AMQP_REPLY_SUCCESS);
      if (connection_->is_open()) connection_->Close(timeout);
    }
    connection_.reset();
    channel_open_ = false;
    blocked_ = false;
    pending_.clear();
  }

 private:
  // One publish awaiting its confirm.
  struct Pending {
    std::size_t index = kNoIndex;  // in the current batch; kNoIndex once that batch was answered
    std::string message_id;
    std::string exchange;
    std::size_t body_size = 0;
    std::optional<std::string> returned;  // why the broker returned it (basic.return)
  };

  void Settle(std::size_t index, std::optional<Failure> failure) {
    if (batch() != nullptr) batch()->Settle(index, std::move(failure));
  }
  void SettlePending(const Pending& pending, std::optional<Failure> failure) {
    if (pending.index == kNoIndex || batch() == nullptr) return;
    Settle(pending.index, std::move(failure));
    --in_flight_;
  }
  void Stop(std::string reason) {
    if (batch() != nullptr) batch()->Stop(std::move(reason));
  }
  [[nodiscard]] bool CanPublish() const { return connection_ && channel_open_ && !blocked_; }

  bool Connected(Deadline deadline) override;
  std::optional<std::string> Connect(Deadline deadline) override;
  bool Ready(Batch& batch, Deadline deadline) override;
  void Send(Batch& batch, Deadline deadline) override;
  void Await(Batch& batch, Deadline deadline) override;
  void Finish(Batch& batch, Deadline deadline) override;
  bool ReopenChannel(Deadline deadline);
  std::optional<Failure> Prepare(const Envelope& envelope, Prepared& out) const;
  std::optional<Failure> PrepareCloudEvent(const Envelope& envelope, Prepared& out) const;
  bool AwaitWritable(Deadline deadline);
  std::optional<Failure> Encode(const Prepared& prepared, std::string_view body);
  void AppendFrameStart(std::uint8_t type, std::size_t payload_size);
  bool Flush(Deadline deadline);
  void DrainReady();
  bool WaitForFrame(Deadline deadline);
  void HandleFrame(const amqp_frame_t& frame);
  void HandleAcks(std::uint64_t tag, bool multiple, bool ack);
  void HandleReturn(const amqp_basic_return_t& method);
  void HandleChannelClose(const amqp_channel_close_t& method);
  void LoseConnection(const std::string& reason);

  SinkOptions options_;
  Endpoint endpoint_;
  NameTemplate exchange_;
  NameTemplate routing_key_;
  cloudevents::Mapper cloudevents_;

  std::optional<Connection> connection_;
  bool channel_open_ = false;
  bool blocked_ = false;  // connection.blocked: the broker stopped reading (resource alarm)
  std::string blocked_reason_;
  std::size_t frame_max_ = AMQP_DEFAULT_FRAME_SIZE;
  std::uint64_t next_tag_ = 1;
  std::map<std::uint64_t, Pending> pending_;
  std::string out_;                    // encoded publishes not yet written (whole frames)
  std::vector<std::uint8_t> scratch_;  // one method's or one header's encoding

  std::size_t in_flight_ = 0;  // sent by the Publish call in progress, not yet settled
};

bool RabbitSink::Connected(Deadline /*deadline*/) {
  if (connection_) DrainReady();  // notices a connection or channel closed since the last call
  return connection_.has_value();
}

std::optional<std::string> RabbitSink::Connect(Deadline deadline) {
  const auto remaining = std::chrono::duration_cast<milliseconds>(deadline - SteadyClock::now());
  const milliseconds timeout =
      std::max(milliseconds{1}, std::min(options_.connect_timeout, remaining));
  try {
    Connection connection(endpoint_, timeout, options_.heartbeat);
    connection.OpenChannel(kChannel, /*confirms=*/true);
    if (!options_.declare_exchange_type.empty()) {
      amqp_exchange_declare(connection.get(), kChannel, Bytes(options_.exchange),
                            Bytes(options_.declare_exchange_type), /*passive=*/0, /*durable=*/1,
                            /*auto_delete=*/0, /*internal=*/0, amqp_empty_table);
      connection.CheckLastRpc(kChannel, "declaring exchange '" + options_.exchange + "'");
    }
    frame_max_ = static_cast<std::size_t>(std::max(amqp_get_frame_max(connection.get()), 4096));
    connection_.emplace(std::move(connection));
  } catch (const AmqpError& error) {
    return error.what();
  }
  channel_open_ = true;
  blocked_ = false;
  next_tag_ = 1;
  pending_.clear();
  return std::nullopt;
}

bool RabbitSink::Ready(Batch& /*batch*/, Deadline deadline) {
  if (!channel_open_ && !ReopenChannel(deadline)) return false;
  if (blocked_) {
    Stop("the broker blocked the connection (" + blocked_reason_ + ")");
    return false;
  }
  return true;
}

void RabbitSink::Await(Batch& /*batch*/, Deadline deadline) {
  while (in_flight_ > 0 && connection_ && channel_open_) {
    if (!WaitForFrame(deadline) && SteadyClock::now() >= deadline) break;
  }
}

// Whatever is still pending has no verdict by the deadline; its late confirm will be ignored.
void RabbitSink::Finish(Batch& /*batch*/, Deadline /*deadline*/) {
  for (auto& [tag, pending] : pending_) {
    if (pending.index == kNoIndex) continue;
    Settle(pending.index, MakeFailure(FailureKind::kOutcomeUnknown,
                                      "sent, but no confirm from the broker by the deadline"));
    pending.index = kNoIndex;
  }
  in_flight_ = 0;
}

bool RabbitSink::ReopenChannel(Deadline deadline) {
  const auto remaining = std::chrono::duration_cast<milliseconds>(deadline - SteadyClock::now());
  connection_->SetRpcTimeout(
      std::max(milliseconds{1}, std::min(options_.connect_timeout, remaining)));
  try {
    connection_->OpenChannel(kChannel, /*confirms=*/true);
  } catch (const AmqpError& error) {
    if (!connection_->is_open()) LoseConnection(error.what());
    Stop(std::string{"reopening the channel: "} + error.what());
    return false;
  }
  channel_open_ = true;
  next_tag_ = 1;
  pending_.clear();
  return true;
}

std::optional<Failure> RabbitSink::Prepare(const Envelope& envelope, Prepared& out) const {
  if (envelope.payload.size() > options_.max_message_bytes) {
    return MakeFailure(FailureKind::kPermanent,
                       "payload is " + std::to_string(envelope.payload.size()) +
                           " bytes, over max_message_bytes (" +
                           std::to_string(options_.max_message_bytes) + ")");
  }
  out.exchange = exchange_.Expand(envelope);
  out.routing_key = routing_key_.Expand(envelope);
  if (out.exchange.size() > kShortStringMax) {
    return MakeFailure(FailureKind::kPermanent, "exchange name '" + Shorten(out.exchange) +
                                                    "' is " + std::to_string(out.exchange.size()) +
                                                    " bytes, over AMQP's 255");
  }
  if (out.routing_key.size() > kShortStringMax) {
    return MakeFailure(FailureKind::kPermanent,
                       "routing key '" + Shorten(out.routing_key) + "' is " +
                           std::to_string(out.routing_key.size()) + " bytes, over AMQP's 255");
  }
  out.message_id = envelope.id.ToString();
  out.event_id = envelope.EventId().ToString();
  out.body.reset();

  out.headers.clear();
  if (options_.envelope == EnvelopeStyle::kCloudEvents) return PrepareCloudEvent(envelope, out);
  for (const auto& [name, value] : envelope.headers) {
    // The store refuses these names; skip them anyway so that they can never shadow ours.
    if (wire::IsReservedName(name)) continue;
    if (name.size() > kFieldNameMax) {
      return MakeFailure(FailureKind::kPermanent, "header name '" + Shorten(name) + "' is " +
                                                      std::to_string(name.size()) +
                                                      " bytes, over AMQP's 128");
    }
    out.headers.push_back(StringEntry(name, value));
  }
  out.headers.push_back(StringEntry(wire::kEventId, out.event_id));
  if (options_.envelope == EnvelopeStyle::kFull) {
    out.headers.push_back(StringEntry(wire::kTopicHeader, envelope.topic));
    if (envelope.stream_key)
      out.headers.push_back(StringEntry(wire::kStreamKeyHeader, *envelope.stream_key));
    if (envelope.stream_seq)
      out.headers.push_back(Int64Entry(wire::kStreamSeqHeader, *envelope.stream_seq));
    if (envelope.stream_prev_seq)
      out.headers.push_back(Int64Entry(wire::kStreamPrevSeqHeader, *envelope.stream_prev_seq));
    out.headers.push_back(Int32Entry(wire::kPartitionHeader, envelope.partition));
    out.headers.push_back(Int32Entry(wire::kAttemptsHeader, envelope.attempts));
    out.headers.push_back(StringEntry(wire::kTargetHeader, envelope.target));
    if (!envelope.database.empty())
      out.headers.push_back(StringEntry(wire::kDatabaseHeader, envelope.database));
  }

  amqp_basic_properties_t& p = out.properties;
  p = amqp_basic_properties_t{};
  p._flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_HEADERS_FLAG |
             AMQP_BASIC_TIMESTAMP_FLAG;
  p.message_id = Bytes(out.message_id);
  p.delivery_mode = options_.persistent ? AMQP_DELIVERY_PERSISTENT : AMQP_DELIVERY_NONPERSISTENT;
  p.headers = {.num_entries = static_cast<int>(out.headers.size()), .entries = out.headers.data()};
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(envelope.created_at.time_since_epoch());
  p.timestamp = static_cast<std::uint64_t>(std::max<std::int64_t>(0, seconds.count()));
  if (!envelope.content_type.empty()) {
    if (envelope.content_type.size() > kShortStringMax) {
      return MakeFailure(FailureKind::kPermanent, "content type is " +
                                                      std::to_string(envelope.content_type.size()) +
                                                      " bytes, over AMQP's 255");
    }
    p._flags |= AMQP_BASIC_CONTENT_TYPE_FLAG;
    p.content_type = Bytes(envelope.content_type);
  }
  if (envelope.type && !envelope.type->empty()) {
    if (envelope.type->size() > kShortStringMax) {
      return MakeFailure(FailureKind::kPermanent, "type '" + Shorten(*envelope.type) + "' is " +
                                                      std::to_string(envelope.type->size()) +
                                                      " bytes, over AMQP's 255");
    }
    p._flags |= AMQP_BASIC_TYPE_FLAG;
    p.type = Bytes(*envelope.type);
  }
  // correlation_id also travels as a header, so an over-long one only loses its property.
  if (const auto it = envelope.headers.find(kCorrelationIdHeader);
      it != envelope.headers.end() && !it->second.empty() && it->second.size() <= kShortStringMax) {
    p._flags |= AMQP_BASIC_CORRELATION_ID_FLAG;
    p.correlation_id = Bytes(it->second);
  }
  if (const std::size_t size = HeaderFrameSize(p); size > frame_max_) {
    return MakeFailure(FailureKind::kPermanent, "properties and headers take " +
                                                    std::to_string(size) +
                                                    " bytes, over the connection's frame size (" +
                                                    std::to_string(frame_max_) + ")");
  }
  return std::nullopt;
}

// CloudEvents on AMQP 0-9-1, after the AMQP (1.0) binding: binary mode, each attribute as a
// headers-table entry cloudEvents_<name> (a string: the canonical form, which the binding allows),
// datacontenttype as the content_type property; structured mode, the JSON event as the body with
// content_type application/cloudevents+json. message_id, delivery_mode and timestamp as for every
// envelope; no type or correlation_id property, no other header.
std::optional<Failure> RabbitSink::PrepareCloudEvent(const Envelope& envelope,
                                                     Prepared& out) const {
  amqp_basic_properties_t& p = out.properties;
  p = amqp_basic_properties_t{};
  p._flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
             AMQP_BASIC_TIMESTAMP_FLAG | AMQP_BASIC_HEADERS_FLAG;
  p.message_id = Bytes(out.message_id);
  p.delivery_mode = options_.persistent ? AMQP_DELIVERY_PERSISTENT : AMQP_DELIVERY_NONPERSISTENT;
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(envelope.created_at.time_since_epoch());
  p.timestamp = static_cast<std::uint64_t>(std::max<std::int64_t>(0, seconds.count()));
  if (cloudevents_.mode() == cloudevents::Mode::kStructured) {
    std::string body;
    if (auto error = cloudevents_.StructuredJson(envelope, body)) {
      return MakeFailure(FailureKind::kPermanent, std::move(*error));
    }
    if (body.size() > options_.max_message_bytes) {
      return MakeFailure(FailureKind::kPermanent,
                         "the structured CloudEvent is " + std::to_string(body.size()) +
                             " bytes, over max_message_bytes (" +
                             std::to_string(options_.max_message_bytes) + ")");
    }
    out.body = std::move(body);
    p._flags |= AMQP_BASIC_CONTENT_TYPE_FLAG;
    p.content_type = Bytes(cloudevents::kStructuredContentType);
  } else {
    if (auto error = cloudevents_.Attributes(envelope, out.attributes)) {
      return MakeFailure(FailureKind::kPermanent, std::move(*error));
    }
    for (cloudevents::Attribute& attribute : out.attributes) {
      if (attribute.name == cloudevents::kDataContentType) {
        if (attribute.value.size() > kShortStringMax) {
          return MakeFailure(FailureKind::kPermanent, "content type is " +
                                                          std::to_string(attribute.value.size()) +
                                                          " bytes, over AMQP's 255");
        }
        p._flags |= AMQP_BASIC_CONTENT_TYPE_FLAG;
        continue;
      }
      attribute.name.insert(0, kCloudEventsPrefix);
    }
    // Only now, with every name final, point the table's entries into them.
    for (const cloudevents::Attribute& attribute : out.attributes) {
      if (attribute.name == cloudevents::kDataContentType) {
        p.content_type = Bytes(attribute.value);
      } else {
        out.headers.push_back(StringEntry(attribute.name, attribute.value));
      }
    }
  }
  p.headers = {.num_entries = static_cast<int>(out.headers.size()), .entries = out.headers.data()};
  if (const std::size_t size = HeaderFrameSize(p); size > frame_max_) {
    return MakeFailure(FailureKind::kPermanent, "properties and headers take " +
                                                    std::to_string(size) +
                                                    " bytes, over the connection's frame size (" +
                                                    std::to_string(frame_max_) + ")");
  }
  return std::nullopt;
}

void RabbitSink::Send(Batch& batch, Deadline deadline) {
  in_flight_ = 0;
  Prepared prepared;
  std::size_t unpolled_messages = kPollEveryMessages;  // poll before the first publish
  std::size_t unpolled_bytes = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (!CanPublish()) break;
    if (SteadyClock::now() >= deadline) {
      Stop("the deadline passed before its turn");
      break;
    }
    if (auto failure = Prepare(batch[i], prepared)) {
      Settle(i, std::move(failure));
      continue;
    }
    while (CanPublish() && pending_.size() >= options_.confirm_window) {
      if (!Flush(deadline)) break;
      if (!WaitForFrame(deadline) && SteadyClock::now() >= deadline) {
        Stop("the deadline passed with " + std::to_string(pending_.size()) +
             " publishes unconfirmed (confirm_window " + std::to_string(options_.confirm_window) +
             ")");
        return;
      }
    }
    if (!CanPublish()) break;
    // Reads what the broker sent (a closed channel or a blocked connection stops the batch
    // early) and waits while the broker is not reading. The socket is polled once every few
    // messages, not for each one.
    unpolled_bytes += batch[i].payload.size() + kPerMessageOverhead;
    if (++unpolled_messages >= kPollEveryMessages || unpolled_bytes >= kPollEveryBytes) {
      unpolled_messages = unpolled_bytes = 0;
      if (!AwaitWritable(deadline)) break;
    } else if (amqp_frames_enqueued(connection_->get()) ||
               amqp_data_in_buffer(connection_->get())) {
      DrainReady();
    }
    if (!CanPublish()) break;

    const std::string& body = prepared.body ? *prepared.body : batch[i].payload;
    if (auto failure = Encode(prepared, body)) {
      Settle(i, std::move(failure));
      continue;
    }
    pending_.emplace(next_tag_++, Pending{.index = i,
                                          .message_id = prepared.message_id,
                                          .exchange = prepared.exchange,
                                          .body_size = body.size()});
    ++in_flight_;
    if (out_.size() >= kWriteBytes && !Flush(deadline)) break;
  }
  // What is encoded goes out unless the channel or the connection is gone (their publishes were
  // settled as outcome-unknown with them).
  if (connection_ && channel_open_) {
    Flush(deadline);
  } else {
    out_.clear();
  }
  if (!connection_) return;  // LoseConnection said why
  if (!channel_open_) Stop("the channel was closed by the broker");
  if (blocked_) Stop("the broker blocked the connection (" + blocked_reason_ + ")");
}

std::optional<Failure> RabbitSink::Encode(const Prepared& prepared, std::string_view body) {
  const std::size_t start = out_.size();
  scratch_.resize(std::max<std::size_t>(frame_max_, 4096));
  const amqp_bytes_t scratch{.len = scratch_.size(), .bytes = scratch_.data()};
  amqp_basic_publish_t method{};
  method.exchange = Bytes(prepared.exchange);
  method.routing_key = Bytes(prepared.routing_key);
  method.mandatory = options_.mandatory ? 1 : 0;
  const int method_size = amqp_encode_method(AMQP_BASIC_PUBLISH_METHOD, &method, scratch);
  if (method_size < 0) {
    return MakeFailure(FailureKind::kPermanent,
                       std::string{"encoding basic.publish: "} + amqp_error_string2(method_size));
  }
  AppendFrameStart(AMQP_FRAME_METHOD, 4 + static_cast<std::size_t>(method_size));
  const std::uint32_t id = AMQP_BASIC_PUBLISH_METHOD;
  for (int shift = 24; shift >= 0; shift -= 8) out_.push_back(static_cast<char>(id >> shift));
  out_.append(reinterpret_cast<const char*>(scratch_.data()),
              static_cast<std::size_t>(method_size));
  out_.push_back(static_cast<char>(AMQP_FRAME_END));

  auto properties = prepared.properties;
  const int properties_size = amqp_encode_properties(AMQP_BASIC_CLASS, &properties, scratch);
  if (properties_size < 0) {
    out_.resize(start);
    return MakeFailure(FailureKind::kPermanent, std::string{"encoding the properties: "} +
                                                    amqp_error_string2(properties_size));
  }
  // class id, weight 0, body size, then the properties
  AppendFrameStart(AMQP_FRAME_HEADER, 12 + static_cast<std::size_t>(properties_size));
  out_.push_back(static_cast<char>(AMQP_BASIC_CLASS >> 8));
  out_.push_back(static_cast<char>(AMQP_BASIC_CLASS & 0xFF));
  out_.append(2, '\0');
  const auto body_size = static_cast<std::uint64_t>(body.size());
  for (int shift = 56; shift >= 0; shift -= 8)
    out_.push_back(static_cast<char>(body_size >> shift));
  out_.append(reinterpret_cast<const char*>(scratch_.data()),
              static_cast<std::size_t>(properties_size));
  out_.push_back(static_cast<char>(AMQP_FRAME_END));

  const std::size_t most = frame_max_ - kFrameHeaderBytes - kFrameEndBytes;
  for (std::size_t at = 0; at < body.size(); at += most) {
    const std::string_view part = body.substr(at, most);
    AppendFrameStart(AMQP_FRAME_BODY, part.size());
    out_.append(part);
    out_.push_back(static_cast<char>(AMQP_FRAME_END));
  }
  return std::nullopt;
}

void RabbitSink::AppendFrameStart(std::uint8_t type, std::size_t payload_size) {
  out_.push_back(static_cast<char>(type));
  out_.push_back(static_cast<char>(kChannel >> 8));
  out_.push_back(static_cast<char>(kChannel & 0xFF));
  const auto size = static_cast<std::uint32_t>(payload_size);
  for (int shift = 24; shift >= 0; shift -= 8) out_.push_back(static_cast<char>(size >> shift));
}

// Writes every encoded frame. Until all is written only writability is waited for: reading now
// could make rabbitmq-c send a heartbeat into the middle of a frame. A flush that does not finish
// gives the connection up: its publishes already hold delivery tags (and part of a frame may be
// out), so the channel's numbering would no longer match the broker's.
bool RabbitSink::Flush(Deadline deadline) {
  std::size_t written = 0;
  const int fd = connection_->fd();
  while (written < out_.size()) {
    const ssize_t sent =
        ::send(fd, out_.data() + written, out_.size() - written, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      written += static_cast<std::size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {  // 0: nothing taken, no error
      const std::string reason = sent == 0 ? std::string{"the socket took nothing"}
                                           : std::string{"while sending: "} + std::strerror(errno);
      out_.clear();
      LoseConnection(reason);
      return false;
    }
    const auto remaining = std::chrono::ceil<milliseconds>(deadline - SteadyClock::now()).count();
    if (remaining <= 0) {
      out_.clear();
      LoseConnection("not all sent by the deadline: the broker is not reading (back-pressure)");
      return false;
    }
    pollfd writable{.fd = fd, .events = POLLOUT, .revents = 0};
    if (poll(&writable, 1, static_cast<int>(std::min<std::int64_t>(remaining, 1000))) < 0 &&
        errno != EINTR) {
      out_.clear();
      LoseConnection("poll failed");
      return false;
    }
  }
  out_.clear();
  return true;
}

bool RabbitSink::AwaitWritable(Deadline deadline) {
  for (;;) {
    if (amqp_frames_enqueued(connection_->get()) || amqp_data_in_buffer(connection_->get())) {
      DrainReady();
      if (!CanPublish()) return false;
    }
    pollfd fd{.fd = connection_->fd(), .events = POLLIN | POLLOUT, .revents = 0};
    if (poll(&fd, 1, 0) < 0 && errno != EINTR) {
      LoseConnection("poll failed");
      return false;
    }
    if ((fd.revents & (POLLIN | POLLERR | POLLHUP)) != 0) {
      DrainReady();
      if (!CanPublish()) return false;
      continue;
    }
    if ((fd.revents & POLLOUT) != 0) return true;
    const auto remaining = std::chrono::ceil<milliseconds>(deadline - SteadyClock::now()).count();
    if (remaining <= 0) {
      Stop("not sent by the deadline: the broker is not reading (back-pressure)");
      return false;
    }
    // Wake at least every second to let rabbitmq-c send its heartbeats.
    fd.revents = 0;
    if (poll(&fd, 1, static_cast<int>(std::min<std::int64_t>(remaining, 1000))) < 0 &&
        errno != EINTR) {
      LoseConnection("poll failed");
      return false;
    }
    DrainReady();  // lets rabbitmq-c send a heartbeat and reads what came
    if (!CanPublish()) return false;
  }
}

void RabbitSink::DrainReady() {
  while (connection_) {
    amqp_frame_t frame{};
    timeval zero{.tv_sec = 0, .tv_usec = 0};
    const int status = amqp_simple_wait_frame_noblock(connection_->get(), &frame, &zero);
    if (status == AMQP_STATUS_TIMEOUT) break;
    if (status != AMQP_STATUS_OK) {
      LoseConnection(amqp_error_string2(status));
      return;
    }
    HandleFrame(frame);
  }
  // Decoded frames live in per-channel pools until released; a long batch reads many acks.
  if (connection_) amqp_maybe_release_buffers(connection_->get());
}

bool RabbitSink::WaitForFrame(Deadline deadline) {
  if (!connection_) return false;
  const auto remaining = deadline - SteadyClock::now();
  if (remaining <= SteadyClock::duration::zero()) return false;
  timeval tv = ToTimeval(std::chrono::ceil<std::chrono::microseconds>(remaining));
  amqp_frame_t frame{};
  const int status = amqp_simple_wait_frame_noblock(connection_->get(), &frame, &tv);
  if (status == AMQP_STATUS_TIMEOUT) return false;
  if (status != AMQP_STATUS_OK) {
    LoseConnection(amqp_error_string2(status));
    return false;
  }
  HandleFrame(frame);
  DrainReady();
  return connection_.has_value();
}

void RabbitSink::HandleFrame(const amqp_frame_t& frame) {
  if (frame.frame_type != AMQP_FRAME_METHOD) return;  // no content is expected outside a return
  const amqp_method_number_t id = frame.payload.method.id;
  void* decoded = frame.payload.method.decoded;
  if (frame.channel == 0) {
    if (id == AMQP_CONNECTION_CLOSE_METHOD) {
      const auto* close = static_cast<const amqp_connection_close_t*>(decoded);
      const std::string text{View(close->reply_text)};
      amqp_connection_close_ok_t close_ok{};
      amqp_send_method(connection_->get(), 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &close_ok);
      LoseConnection("closed by the broker: " + text);
    } else if (id == AMQP_CONNECTION_BLOCKED_METHOD) {
      blocked_ = true;
      blocked_reason_ = View(static_cast<const amqp_connection_blocked_t*>(decoded)->reason);
    } else if (id == AMQP_CONNECTION_UNBLOCKED_METHOD) {
      blocked_ = false;
      blocked_reason_.clear();
    }
    return;
  }
  if (frame.channel != kChannel) return;
  if (id == AMQP_BASIC_ACK_METHOD) {
    const auto* ack = static_cast<const amqp_basic_ack_t*>(decoded);
    HandleAcks(ack->delivery_tag, ack->multiple != 0, /*ack=*/true);
  } else if (id == AMQP_BASIC_NACK_METHOD) {
    const auto* nack = static_cast<const amqp_basic_nack_t*>(decoded);
    HandleAcks(nack->delivery_tag, nack->multiple != 0, /*ack=*/false);
  } else if (id == AMQP_BASIC_RETURN_METHOD) {
    HandleReturn(*static_cast<const amqp_basic_return_t*>(decoded));
  } else if (id == AMQP_CHANNEL_CLOSE_METHOD) {
    HandleChannelClose(*static_cast<const amqp_channel_close_t*>(decoded));
  }
}

void RabbitSink::HandleAcks(std::uint64_t tag, bool multiple, bool ack) {
  auto first = pending_.begin();
  auto last = pending_.end();
  if (!multiple) {
    first = pending_.find(tag);
    if (first == pending_.end()) return;
    last = std::next(first);
  } else if (tag != 0) {  // multiple with tag 0: everything outstanding
    last = pending_.upper_bound(tag);
  }
  for (auto it = first; it != last; ++it) {
    const Pending& pending = it->second;
    if (!ack) {
      SettlePending(pending, MakeFailure(FailureKind::kRejected,
                                         "nacked by broker (e.g. a queue full with "
                                         "x-overflow=reject-publish, or a broker-internal error)"));
    } else if (pending.returned) {
      SettlePending(pending, MakeFailure(FailureKind::kRejected, *pending.returned));
    } else {
      SettlePending(pending, std::nullopt);
    }
  }
  pending_.erase(first, last);
}

void RabbitSink::HandleReturn(const amqp_basic_return_t& method) {
  // Copy out of the frame before reading more frames.
  const std::string reason = "unroutable: " + std::string{View(method.reply_text)} + " exchange='" +
                             std::string{View(method.exchange)} + "' routing_key='" +
                             std::string{View(method.routing_key)} + "'";
  MessagePtr message{new amqp_message_t{}};
  const amqp_rpc_reply_t reply = amqp_read_message(connection_->get(), kChannel, message.get(), 0);
  if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
    LoseConnection("reading a returned message: " + DescribeReply(reply));
    return;
  }
  const amqp_basic_properties_t& properties = message->properties;
  if ((properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) == 0U) return;
  const std::string_view message_id = View(properties.message_id);
  // The first pending publish of that message not yet returned (a batch may repeat an id, and a
  // late return may belong to an earlier batch's publish, which comes first in tag order).
  for (auto& [tag, pending] : pending_) {
    if (!pending.returned && pending.message_id == message_id) {
      pending.returned = reason;
      return;
    }
  }
}

void RabbitSink::HandleChannelClose(const amqp_channel_close_t& method) {
  const int code = method.reply_code;
  const std::string text{View(method.reply_text)};
  const bool caused_by_publish = method.class_id == AMQP_BASIC_CLASS &&
                                 method.method_id == (AMQP_BASIC_PUBLISH_METHOD & 0xFFFFU);
  channel_open_ = false;
  amqp_channel_close_ok_t close_ok{};
  const int sent =
      amqp_send_method(connection_->get(), kChannel, AMQP_CHANNEL_CLOSE_OK_METHOD, &close_ok);

  // Which publish the broker refused: the first pending one to the exchange a 404 or a 403 names,
  // the first of the reported size for an over-size 406, else the first pending one.
  auto culprit = pending_.end();
  const FailureKind kind = KindOfCloseCode(code, text);
  std::string reason = "channel closed by broker: " + text;
  if (caused_by_publish && !pending_.empty()) {
    culprit = pending_.begin();
    if (const auto exchange = QuotedAfter(text, "no exchange '");
        code == AMQP_NOT_FOUND && exchange) {
      reason = "exchange '" + *exchange + "' not found (" + text + ")";
      culprit = std::find_if(pending_.begin(), pending_.end(),
                             [&](const auto& entry) { return entry.second.exchange == *exchange; });
    } else if (const auto refused = QuotedAfter(text, "access to exchange '");
               code == AMQP_ACCESS_REFUSED && refused) {
      reason = "not permitted to publish to exchange '" + *refused + "' (" + text + ")";
      culprit = std::find_if(pending_.begin(), pending_.end(),
                             [&](const auto& entry) { return entry.second.exchange == *refused; });
    } else if (const auto size = NumberAfter(text, "message size ");
               kind == FailureKind::kPermanent && size) {
      culprit = std::find_if(pending_.begin(), pending_.end(),
                             [&](const auto& entry) { return entry.second.body_size == *size; });
    }
    if (culprit == pending_.end()) culprit = pending_.begin();
  }
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it == culprit) {
      SettlePending(it->second, MakeFailure(kind, reason));
    } else {
      SettlePending(it->second,
                    MakeFailure(FailureKind::kOutcomeUnknown,
                                "sent, but the channel was closed by the broker before the "
                                "confirm (" +
                                    text + ")"));
    }
  }
  pending_.clear();
  Stop("the channel was closed by the broker (" + text + ")");
  if (sent != AMQP_STATUS_OK) LoseConnection(amqp_error_string2(sent));
}

void RabbitSink::LoseConnection(const std::string& reason) {
  const std::string what = "connection to " + endpoint_.Describe() + " lost: " + reason;
  out_.clear();  // frames for the connection that is gone
  for (const auto& [tag, pending] : pending_) {
    SettlePending(pending, MakeFailure(FailureKind::kOutcomeUnknown,
                                       "sent, but no confirm before the " + what));
  }
  pending_.clear();
  if (connection_) connection_->Abandon();
  connection_.reset();
  channel_open_ = false;
  blocked_ = false;
  Stop(what);
}

}  // namespace

void ValidateOptions(const SinkOptions& options) {
  if (options.envelope == EnvelopeStyle::kCloudEvents) {
    cloudevents::ValidateOptions(options.cloudevents);
  }
  try {
    ParseUrl(options.url);
  } catch (const std::invalid_argument& error) {
    throw ConfigError("url", error.what());
  }
  if (options.confirm_window == 0) {
    throw ConfigError("confirm_window", "must be at least 1 (unconfirmed publishes in flight)");
  }
  if (options.connect_timeout <= milliseconds::zero()) {
    throw ConfigError("connect_timeout", "must be positive");
  }
  if (options.heartbeat < std::chrono::seconds::zero() ||
      options.heartbeat.count() > std::numeric_limits<std::uint16_t>::max()) {
    throw ConfigError("heartbeat", "must be between 0 (off) and 65535 seconds");
  }
  if (options.max_message_bytes == 0) {
    throw ConfigError("max_message_bytes", "must be at least 1");
  }
  // The templates as written; each expanded name is checked again when a message is prepared.
  for (const auto& [key, text] :
       {std::pair<std::string, const std::string&>{"exchange", options.exchange},
        {"routing_key", options.routing_key}}) {
    if (text.size() > kShortStringMax)
      throw ConfigError(key, "must be at most 255 bytes (AMQP's limit)");
    if (HasControlCharacter(text)) throw ConfigError(key, "must not contain control characters");
    NameTemplate::Parse(text, key);
  }
  const std::string& type = options.declare_exchange_type;
  if (!type.empty()) {
    if (type != "direct" && type != "topic" && type != "fanout" && type != "headers") {
      throw ConfigError(
          "declare_exchange_type",
          "must be one of \"direct\", \"topic\", \"fanout\" or \"headers\" (or empty: "
          "declare nothing); got '" +
              Shorten(type) + "'");
    }
    if (options.exchange.empty() || options.exchange.find('{') != std::string::npos) {
      throw ConfigError("exchange",
                        "must be a plain, non-empty name when declare_exchange_type is set (it is "
                        "declared on every connect)");
    }
  }
}

std::unique_ptr<Sink> OpenSink(SinkOptions options) {
  ValidateOptions(options);
  return std::make_unique<RabbitSink>(std::move(options));
}

}  // namespace outbox::rabbitmq
