// The Kafka sink: one idempotent librdkafka producer; a batch is produced whole, then flushed
// until every message of it has its delivery report or the deadline passes.
//
// How a batch goes out. Each message gets a token (a number that grows across batches) as its
// librdkafka opaque; the delivery-report callback, served on the calling thread by
// rd_kafka_flush, turns the token back into the batch index, and ignores the reports of earlier
// batches' messages (answered already as outcome-unknown). Once the last message of the batch is
// reported the callback yields, so flush returns without waiting for older messages.
// At the deadline the messages still in the client's queue (never sent) are purged, so they are
// not sent later: their reports say so (kUnavailable). Those in flight keep their chance, are
// answered kOutcomeUnknown now, and their late reports are ignored.
// A fatal error of the idempotent producer (rd_kafka_fatal_error) ends the batch: what it had in
// flight is kOutcomeUnknown, and the producer is destroyed and made anew before the next batch.
// So does the loss of every broker connection during the batch (librdkafka's ALL_BROKERS_DOWN
// error, served by the same flush): what was queued is purged (kUnavailable) and what was in
// flight is kOutcomeUnknown at once, not at the deadline; librdkafka reconnects on its own.

#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "classify.h"
#include "handles.h"
#include "outbox/core/ascii.h"
#include "outbox/core/error.h"
#include "outbox/core/wire_names.h"
#include "outbox/sink/cloudevents.h"
#include "outbox/sink/kafka.h"
#include "outbox/sink/name_template.h"
#include "outbox/sink/sink_base.h"

namespace outbox::kafka {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

constexpr milliseconds kCloseFlush{2000};
// librdkafka's socket.timeout.ms unless set (sink/kafka.h: a silent broker).
constexpr milliseconds kSocketTimeout{30000};
constexpr milliseconds kQueueFullWait{50};
constexpr milliseconds kFlushSlice{1000};  // how often a long wait looks for a fatal error
constexpr std::size_t kMaxCachedTopics = 1024;
constexpr std::size_t kMaxTopicBytes = 249;  // Kafka's limit on a topic name

// Properties the sink sets itself, with the aliases librdkafka knows them by.
constexpr std::array<std::string_view, 19> kReservedProperties = {
    "bootstrap.servers",
    "metadata.broker.list",
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "compression.codec",
    "compression.type",
    "linger.ms",
    "queue.buffering.max.ms",
    "max.in.flight.requests.per.connection",
    "max.in.flight",
    "message.max.bytes",
    "transactional.id",
    "delivery.report.only.error",
    "dr_cb",
    "dr_msg_cb",
    "opaque",
    "log_cb",
    "error_cb",
};

constexpr std::array<std::string_view, 5> kCompressions = {"none", "gzip", "snappy", "lz4", "zstd"};

std::string Quote(std::string_view text) { return "'" + std::string{text} + "'"; }

// Sets one property; the error names `key` and, for a secret, never shows the value.
void Set(rd_kafka_conf_t* conf, const std::string& key, const std::string& name,
         const std::string& value) {
  std::array<char, 512> error{};
  if (rd_kafka_conf_set(conf, name.c_str(), value.c_str(), error.data(), error.size()) ==
      RD_KAFKA_CONF_OK) {
    return;
  }
  if (IsSecretProperty(name)) throw ConfigError(key, "librdkafka refuses this value");
  throw ConfigError(key, error.data());
}

// The producer's configuration. A `probe` has no brokers and does not log: rd_kafka_new on it
// checks the whole configuration without connecting anywhere.
ConfPtr BuildConf(const SinkOptions& options, bool probe = false) {
  if (!ParseBrokers(options.brokers)) {
    // (Not quoted: a caller that knows how to mask it may; the type's parser does.)
    throw ConfigError("brokers", "expected host:port[,host:port...]");
  }
  // The template as written; each expanded topic is checked again when a message is prepared.
  if (options.topic.empty() || options.topic.size() > kMaxTopicBytes ||
      HasControlCharacter(options.topic)) {
    throw ConfigError("topic", "must be 1 to 249 bytes without control characters");
  }
  NameTemplate::Parse(options.topic, "topic");
  if (std::find(kCompressions.begin(), kCompressions.end(), options.compression) ==
      kCompressions.end()) {
    throw ConfigError("compression",
                      "must be none, gzip, snappy, lz4 or zstd; got " + Quote(options.compression));
  }
  if (options.linger < milliseconds::zero() || options.linger > milliseconds{900000}) {
    throw ConfigError("linger", "must be between 0 and 900000 ms");
  }
  if (options.max_in_flight < 1 || options.max_in_flight > 5) {
    throw ConfigError("max_in_flight",
                      "must be between 1 and 5 (the idempotent producer keeps order up to 5)");
  }
  if (options.max_message_bytes < 1000 || options.max_message_bytes > 1000000000) {
    throw ConfigError("max_message_bytes", "must be between 1000 and 1000000000");
  }
  if (options.envelope == EnvelopeStyle::kCloudEvents) {
    cloudevents::ValidateOptions(options.cloudevents);
    if (options.header_style == HeaderStyle::kDebezium) {
      throw ConfigError("header_style",
                        "\"debezium\" does not go with envelope = \"cloudevents\" (the id is "
                        "the ce_id header)");
    }
  }
  ConfPtr conf{rd_kafka_conf_new()};
  if (!probe) Set(conf.get(), "brokers", "bootstrap.servers", options.brokers);
  Set(conf.get(), "enable.idempotence", "enable.idempotence", "true");
  Set(conf.get(), "acks", "acks", "all");
  Set(conf.get(), "compression", "compression.codec", options.compression);
  Set(conf.get(), "linger", "linger.ms", std::to_string(options.linger.count()));
  Set(conf.get(), "max_in_flight", "max.in.flight.requests.per.connection",
      std::to_string(options.max_in_flight));
  Set(conf.get(), "max_message_bytes", "message.max.bytes",
      std::to_string(options.max_message_bytes));
  // Defaults a user may override: the Java client's partitioner (a key lands where a Java
  // producer would put it), and an unknown topic reported within a usual publish timeout.
  Set(conf.get(), "partitioner", "partitioner", "murmur2_random");
  Set(conf.get(), "topic.metadata.propagation.max.ms", "topic.metadata.propagation.max.ms", "5000");
  // A broker that stops answering with the connection open: librdkafka drops a connection with a
  // request unanswered for socket.timeout.ms (produce requests included) and reconnects; its
  // default, 60 s, is twice the Java client's request.timeout.ms.
  Set(conf.get(), "socket.timeout.ms", "socket.timeout.ms", std::to_string(kSocketTimeout.count()));
  for (const auto& [name, value] : options.properties) {
    const std::string key = "librdkafka." + name;
    if (IsReservedProperty(name)) {
      throw ConfigError(key,
                        "is set by the sink itself (use the sink's own keys: brokers, "
                        "compression, linger, max_in_flight, max_message_bytes; "
                        "enable.idempotence and acks=all are always on)");
    }
    // The key is what keeps a stream in one partition, in order.
    if (name == "partitioner" && value == "random") {
      throw ConfigError(key,
                        "\"random\" ignores the record key and would spread a stream over "
                        "partitions, out of order; use a key-hashing partitioner (murmur2_random, "
                        "the default; consistent_random; fnv1a_random; ...)");
    }
    Set(conf.get(), key, name, value);
  }
  if (probe) Set(conf.get(), "librdkafka.log_level", "log_level", "0");
  return conf;
}

void LogCallback(const rd_kafka_t* handle, int level, const char* facility, const char* text);

// One prepared record: what rd_kafka_produceva needs, kept alive until it returns.
struct Record {
  std::string topic;
  std::string message_id;
  std::string event_id;
  std::string numbers[4];  // decimal stream seq, prev seq, partition, attempts
  HeadersPtr headers;
  // The record's value when it is not the payload (CloudEvents' structured mode).
  std::optional<std::string> value;
};

// The producer is made by the first Publish, and again after a fatal error; a failure to make it
// is tried again on the next call (no backoff: it connects nothing).
class KafkaSink final : public SinkBase {
 public:
  explicit KafkaSink(SinkOptions options)
      : SinkBase(Backoff{milliseconds{0}, milliseconds{0}}),
        options_(std::move(options)),
        topic_(NameTemplate::Parse(options_.topic, "topic")),
        cloudevents_(options_.cloudevents) {
    // What only rd_kafka_new checks (combinations of properties), without connecting: the
    // producer itself is made by the first Publish, so that opening (and --check-config) sends
    // nothing.
    ConfPtr conf = BuildConf(options_, /*probe=*/true);
    std::array<char, 512> text{};
    HandlePtr probe{rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), text.data(), text.size())};
    if (!probe) throw ConfigError("librdkafka", text.data());
    conf.release();  // rd_kafka_new took it over
  }

  KafkaSink(const KafkaSink&) = delete;
  KafkaSink& operator=(const KafkaSink&) = delete;
  ~KafkaSink() override { Close(); }

  [[nodiscard]] std::string_view Name() const override { return kSinkName; }

  void Close() override {
    if (!producer_) return;
    rd_kafka_flush(producer_.get(), static_cast<int>(kCloseFlush.count()));
    DestroyProducer();
  }

  void Log(int level, std::string_view text) const {
    if (!options_.log || level >= 7) return;  // 7: LOG_DEBUG
    const LogLevel to = level <= 3   ? LogLevel::kError
                        : level == 4 ? LogLevel::kWarn
                                     : LogLevel::kInfo;
    options_.log(to, text);
  }

 private:
  // What one Publish call keeps besides its verdicts (a produced message is marked sent).
  struct BatchState {
    std::uint64_t first_token = 0;
    std::size_t waiting = 0;  // produced, no report yet
    std::string cut_off;      // why every broker connection was lost during the batch, if it was
  };

  static void ErrorCallback(rd_kafka_t* handle, int error, const char* reason, void* opaque) {
    static_cast<KafkaSink*>(opaque)->OnError(handle, static_cast<rd_kafka_resp_err_t>(error),
                                             reason);
  }

  void OnError(rd_kafka_t* handle, rd_kafka_resp_err_t error, const char* reason) {
    // Logged as librdkafka logs an error that no callback takes.
    const std::string text = std::string{rd_kafka_err2name(error)} + ": " + reason;
    if (options_.log) {
      Log(3, "librdkafka error: " + text);
    } else if (log_level_ >= 3) {
      std::fprintf(stderr, "%%3|ERROR|%s| %s\n", rd_kafka_name(handle), text.c_str());
    }
    if (error != RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN || !state_) return;
    state_->cut_off = text;
    rd_kafka_yield(handle);
  }

  static void DeliveryCallback(rd_kafka_t* handle, const rd_kafka_message_t* message,
                               void* opaque) {
    static_cast<KafkaSink*>(opaque)->OnDelivery(handle, *message);
  }

  void OnDelivery(rd_kafka_t* handle, const rd_kafka_message_t& message) {
    if (!state_ || batch() == nullptr) return;
    BatchState* const state = &*state_;
    const auto token = reinterpret_cast<std::uintptr_t>(message._private);
    if (token < state->first_token || token - state->first_token >= batch()->size()) return;
    const std::size_t index = token - state->first_token;
    if (batch()->settled(index)) return;
    std::string fatal;
    if (message.err != RD_KAFKA_RESP_ERR_NO_ERROR) fatal = FatalError();
    batch()->Settle(index, ClassifyDelivery(message.err, rd_kafka_message_status(&message), fatal));
    if (--state->waiting == 0) rd_kafka_yield(handle);
  }

  std::string FatalError() const {
    if (!producer_) return {};
    std::array<char, 512> text{};
    const rd_kafka_resp_err_t error =
        rd_kafka_fatal_error(producer_.get(), text.data(), text.size());
    if (error == RD_KAFKA_RESP_ERR_NO_ERROR) return {};
    return std::string{rd_kafka_err2name(error)} + ": " + text.data();
  }

  bool CreateProducer(std::string& error) {
    ConfPtr conf = BuildConf(options_);
    rd_kafka_conf_set_opaque(conf.get(), this);
    rd_kafka_conf_set_dr_msg_cb(conf.get(), DeliveryCallback);
    rd_kafka_conf_set_error_cb(conf.get(), ErrorCallback);
    std::array<char, 16> level{};
    std::size_t level_size = level.size();
    if (rd_kafka_conf_get(conf.get(), "log_level", level.data(), &level_size) == RD_KAFKA_CONF_OK) {
      log_level_ = std::atoi(level.data());
    }
    if (options_.log) rd_kafka_conf_set_log_cb(conf.get(), LogCallback);
    std::array<char, 512> text{};
    rd_kafka_t* handle = rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), text.data(), text.size());
    if (handle == nullptr) {
      error = text.data();
      return false;
    }
    conf.release();  // rd_kafka_new took it over
    producer_.reset(handle);
    return true;
  }

  // Drops every message the producer still holds and destroys it. Called between batches, so
  // that the purged messages' reports are ignored.
  void DestroyProducer() {
    if (!producer_) return;
    rd_kafka_purge(producer_.get(), RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT |
                                        RD_KAFKA_PURGE_F_NON_BLOCKING);
    rd_kafka_poll(producer_.get(), 0);
    topics_.clear();  // before the handle they belong to
    producer_.reset();
  }

  rd_kafka_topic_t* Topic(const std::string& name) {
    if (const auto found = topics_.find(name); found != topics_.end()) return found->second.get();
    if (topics_.size() >= kMaxCachedTopics) topics_.clear();
    TopicPtr topic{rd_kafka_topic_new(producer_.get(), name.c_str(), nullptr)};
    if (!topic) return nullptr;
    return topics_.emplace(name, std::move(topic)).first->second.get();
  }

  bool Connected(Deadline deadline) override;
  std::optional<std::string> Connect(Deadline deadline) override;
  void Send(Batch& batch, Deadline deadline) override;
  void Await(Batch& batch, Deadline deadline) override;
  void Finish(Batch& batch, Deadline deadline) override;
  std::optional<Failure> Prepare(const Envelope& envelope, Record& out) const;
  std::optional<Failure> PrepareCloudEvent(const Envelope& envelope, Record& out) const;
  void PurgeQueued();

  SinkOptions options_;
  NameTemplate topic_;
  cloudevents::Mapper cloudevents_;
  HandlePtr producer_;
  std::map<std::string, TopicPtr, std::less<>> topics_;
  std::uint64_t next_token_ = 1;
  int log_level_ = 6;                // librdkafka's log_level property
  std::optional<BatchState> state_;  // the Publish call in progress
};

void LogCallback(const rd_kafka_t* handle, int level, const char* facility, const char* text) {
  const auto* sink = static_cast<const KafkaSink*>(rd_kafka_opaque(handle));
  if (sink != nullptr) sink->Log(level, std::string{"librdkafka "} + facility + ": " + text);
}

bool KafkaSink::Connected(Deadline /*deadline*/) {
  if (producer_ && !FatalError().empty()) DestroyProducer();
  // Errors raised between batches (brokers down while idle) are not this batch's.
  if (producer_) rd_kafka_poll(producer_.get(), 0);
  return producer_ != nullptr;
}

std::optional<std::string> KafkaSink::Connect(Deadline /*deadline*/) {
  std::string error;
  if (!CreateProducer(error)) return "cannot create the producer: " + error;
  return std::nullopt;
}

void KafkaSink::Finish(Batch& batch, Deadline /*deadline*/) {
  const std::string fatal = FatalError();
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (!batch.sent(i)) continue;  // produced, no report
    batch.Fail(i, FailureKind::kOutcomeUnknown,
               !fatal.empty() ? "sent, but the producer had a fatal error: " + fatal
               : state_ && !state_->cut_off.empty()
                   ? "sent, but every broker connection was lost before its delivery report (" +
                         state_->cut_off + ")"
                   : "sent, but no delivery report by the deadline");
  }
  state_.reset();
  // A fatal producer can do nothing more: make the next batch start with a new one.
  if (!fatal.empty()) DestroyProducer();
}

std::optional<Failure> KafkaSink::Prepare(const Envelope& envelope, Record& out) const {
  if (envelope.payload.size() > options_.max_message_bytes) {
    return Failure{.kind = FailureKind::kPermanent,
                   .reason = "payload is " + std::to_string(envelope.payload.size()) +
                             " bytes, over max_message_bytes (" +
                             std::to_string(options_.max_message_bytes) + ")"};
  }
  out.topic = topic_.Expand(envelope);
  if (out.topic.empty()) {
    return Failure{
        .kind = FailureKind::kPermanent,
        .reason = "the topic template " + Quote(options_.topic) + " gives an empty topic name"};
  }
  if (options_.envelope == EnvelopeStyle::kCloudEvents) return PrepareCloudEvent(envelope, out);
  out.value.reset();
  out.message_id = envelope.id.ToString();
  out.event_id = envelope.EventId().ToString();
  const bool debezium = options_.header_style == HeaderStyle::kDebezium;
  const bool has_type = envelope.type && !envelope.type->empty();
  const bool has_content_type = !envelope.content_type.empty();
  out.headers.reset(rd_kafka_headers_new(envelope.headers.size() + 13));
  rd_kafka_headers_t* headers = out.headers.get();
  const auto add = [headers](std::string_view name, std::string_view value) {
    rd_kafka_header_add(headers, name.data(), static_cast<ssize_t>(name.size()), value.data(),
                        static_cast<ssize_t>(value.size()));
  };
  for (const auto& [name, value] : envelope.headers) {
    // The store refuses the reserved names; skip them anyway, and the names set below.
    if (wire::IsReservedName(name)) continue;
    if ((has_type && name == kTypeHeader) || (has_content_type && name == kContentTypeHeader) ||
        (debezium && name == kDebeziumIdHeader)) {
      continue;
    }
    add(name, value);
  }
  add(wire::kMessageId, out.message_id);
  add(wire::kEventId, out.event_id);
  if (debezium) add(kDebeziumIdHeader, out.message_id);
  if (has_type) add(kTypeHeader, *envelope.type);
  if (has_content_type) add(kContentTypeHeader, envelope.content_type);
  if (options_.envelope == EnvelopeStyle::kExternal) return std::nullopt;
  add(wire::kTopicHeader, envelope.topic);
  if (envelope.stream_key) add(wire::kStreamKeyHeader, *envelope.stream_key);
  if (envelope.stream_seq) {
    out.numbers[0] = std::to_string(*envelope.stream_seq);
    add(wire::kStreamSeqHeader, out.numbers[0]);
  }
  if (envelope.stream_prev_seq) {
    out.numbers[1] = std::to_string(*envelope.stream_prev_seq);
    add(wire::kStreamPrevSeqHeader, out.numbers[1]);
  }
  out.numbers[2] = std::to_string(envelope.partition);
  add(wire::kPartitionHeader, out.numbers[2]);
  out.numbers[3] = std::to_string(envelope.attempts);
  add(wire::kAttemptsHeader, out.numbers[3]);
  add(wire::kTargetHeader, envelope.target);
  if (!envelope.database.empty()) add(wire::kDatabaseHeader, envelope.database);
  return std::nullopt;
}

// The Kafka protocol binding of CloudEvents: binary mode, each attribute as a header ce_<name>
// (UTF-8), datacontenttype as content-type, the payload as the value; structured mode, the JSON
// event format as the value with content-type application/cloudevents+json. The key and the
// timestamp as for every envelope.
std::optional<Failure> KafkaSink::PrepareCloudEvent(const Envelope& envelope, Record& out) const {
  out.headers.reset(rd_kafka_headers_new(envelope.headers.size() + 12));
  rd_kafka_headers_t* headers = out.headers.get();
  const auto add = [headers](std::string_view name, std::string_view value) {
    rd_kafka_header_add(headers, name.data(), static_cast<ssize_t>(name.size()), value.data(),
                        static_cast<ssize_t>(value.size()));
  };
  if (cloudevents_.mode() == cloudevents::Mode::kStructured) {
    std::string document;
    if (auto error = cloudevents_.StructuredJson(envelope, document)) {
      return Failure{.kind = FailureKind::kPermanent, .reason = std::move(*error)};
    }
    if (document.size() > options_.max_message_bytes) {
      return Failure{.kind = FailureKind::kPermanent,
                     .reason = "the structured CloudEvent is " + std::to_string(document.size()) +
                               " bytes, over max_message_bytes (" +
                               std::to_string(options_.max_message_bytes) + ")"};
    }
    add(kCloudEventsContentTypeHeader, cloudevents::kStructuredContentType);
    out.value = std::move(document);
    return std::nullopt;
  }
  std::vector<cloudevents::Attribute> attributes;
  if (auto error = cloudevents_.Attributes(envelope, attributes)) {
    return Failure{.kind = FailureKind::kPermanent, .reason = std::move(*error)};
  }
  out.value.reset();
  for (const cloudevents::Attribute& attribute : attributes) {
    if (attribute.name == cloudevents::kDataContentType) {
      add(kCloudEventsContentTypeHeader, attribute.value);
    } else {
      add("ce_" + attribute.name, attribute.value);
    }
  }
  return std::nullopt;
}

void KafkaSink::Send(Batch& batch, Deadline deadline) {
  BatchState& state = state_.emplace(BatchState{.first_token = next_token_});
  next_token_ += batch.size();
  Record record;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Envelope& envelope = batch[i];
    if (SteadyClock::now() >= deadline) {
      batch.Stop("the deadline passed before its turn");
      return;
    }
    if (!state.cut_off.empty()) {  // every broker connection is lost: end the batch now
      batch.Stop("every broker connection was lost (" + state.cut_off + ")");
      return;
    }
    if (auto failure = Prepare(envelope, record)) {
      batch.Settle(i, std::move(failure));
      continue;
    }
    rd_kafka_topic_t* topic = Topic(record.topic);
    if (topic == nullptr) {
      batch.Settle(i, ClassifyProduceError(rd_kafka_last_error(), "topic " + Quote(record.topic)));
      continue;
    }
    std::array<rd_kafka_vu_t, 7> values{};
    std::size_t count = 0;
    values[count].vtype = RD_KAFKA_VTYPE_RKT;
    values[count++].u.rkt = topic;
    values[count].vtype = RD_KAFKA_VTYPE_MSGFLAGS;
    values[count++].u.i = RD_KAFKA_MSG_F_COPY;
    const std::string& value = record.value ? *record.value : envelope.payload;
    values[count].vtype = RD_KAFKA_VTYPE_VALUE;
    values[count].u.mem.ptr = const_cast<char*>(value.data());
    values[count++].u.mem.size = value.size();
    if (envelope.stream_key) {
      values[count].vtype = RD_KAFKA_VTYPE_KEY;
      values[count].u.mem.ptr = const_cast<char*>(envelope.stream_key->data());
      values[count++].u.mem.size = envelope.stream_key->size();
    }
    values[count].vtype = RD_KAFKA_VTYPE_TIMESTAMP;
    values[count++].u.i64 =
        std::chrono::duration_cast<milliseconds>(envelope.created_at.time_since_epoch()).count();
    values[count].vtype = RD_KAFKA_VTYPE_HEADERS;
    values[count++].u.headers = record.headers.get();
    values[count].vtype = RD_KAFKA_VTYPE_OPAQUE;
    values[count++].u.ptr =
        reinterpret_cast<void*>(static_cast<std::uintptr_t>(state.first_token + i));
    for (;;) {
      ErrorPtr error{rd_kafka_produceva(producer_.get(), values.data(), count)};
      if (!error) {
        record.headers.release();  // librdkafka owns them now
        batch.MarkSent(i);
        ++state.waiting;
        break;
      }
      const rd_kafka_resp_err_t code = rd_kafka_error_code(error.get());
      if (code == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
        // Serve reports (which frees room) until the deadline.
        const auto remaining = deadline - SteadyClock::now();
        if (remaining <= SteadyClock::duration::zero()) {
          batch.Stop("the client's queue stayed full until the deadline");
          return;
        }
        if (!state.cut_off.empty()) {
          batch.Stop("every broker connection was lost (" + state.cut_off + ")");
          return;
        }
        rd_kafka_poll(
            producer_.get(),
            static_cast<int>(
                std::min(kQueueFullWait, std::chrono::ceil<milliseconds>(remaining)).count()));
        continue;
      }
      batch.Settle(i, ClassifyProduceError(code, rd_kafka_error_string(error.get())));
      if (code == RD_KAFKA_RESP_ERR__FATAL) {
        batch.Stop("the producer had a fatal error: " + FatalError());
        return;
      }
      break;
    }
  }
}

void KafkaSink::Await(Batch& /*batch*/, Deadline deadline) {
  BatchState& state = *state_;
  while (state.waiting > 0) {
    const auto remaining = std::chrono::ceil<milliseconds>(deadline - SteadyClock::now());
    if (remaining <= milliseconds::zero()) break;
    // Sends what linger.ms would still hold, serves reports, and returns when the callback
    // yields (the batch is complete), everything is delivered, or the slice is over.
    const rd_kafka_resp_err_t result =
        rd_kafka_flush(producer_.get(), static_cast<int>(std::min(remaining, kFlushSlice).count()));
    if (!FatalError().empty() || !state.cut_off.empty()) break;
    if (result == RD_KAFKA_RESP_ERR_NO_ERROR && state.waiting > 0) {
      rd_kafka_poll(producer_.get(), 0);  // nothing left in the client: collect the last reports
      if (state.waiting > 0) break;
    }
  }
  if (state.waiting > 0) PurgeQueued();
}

void KafkaSink::PurgeQueued() {
  // Blocking: when it returns, the purged messages' reports are queued for the poll below.
  rd_kafka_purge(producer_.get(), RD_KAFKA_PURGE_F_QUEUE);
  while (state_->waiting > 0 && rd_kafka_poll(producer_.get(), 0) > 0) {
  }
}

}  // namespace

std::optional<std::vector<HostPort>> ParseBrokers(std::string_view list) {
  std::vector<HostPort> brokers;
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    std::string_view entry = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
    while (!entry.empty() && entry.back() == ' ') entry.remove_suffix(1);
    if (entry.empty()) {
      if (comma == std::string_view::npos && !brokers.empty()) break;  // a trailing comma
      return std::nullopt;
    }
    if (const std::size_t scheme = entry.find("://"); scheme != std::string_view::npos) {
      entry.remove_prefix(scheme + 3);
    }
    auto broker = ParseHostPort(entry, 9092);
    if (!broker || broker->host.empty() || broker->host.find_first_of(" /@") != std::string::npos ||
        (!entry.starts_with('[') && broker->host.find(':') != std::string::npos)) {
      return std::nullopt;
    }
    brokers.push_back(std::move(*broker));
  }
  if (brokers.empty()) return std::nullopt;
  return brokers;
}

bool IsReservedProperty(std::string_view name) {
  return std::find(kReservedProperties.begin(), kReservedProperties.end(), name) !=
         kReservedProperties.end();
}

bool IsSecretProperty(std::string_view name) {
  return name.find("password") != std::string_view::npos ||
         name.find("secret") != std::string_view::npos || name.starts_with("sasl.oauthbearer") ||
         name == "ssl.key.pem";
}

void ValidateOptions(const SinkOptions& options) { BuildConf(options); }

std::unique_ptr<Sink> OpenSink(SinkOptions options) {
  // The constructor's probe producer checks the options as ValidateOptions does.
  return std::make_unique<KafkaSink>(std::move(options));
}

}  // namespace outbox::kafka
