// The Redis Streams sink: one connection, every message one command, pipelined.
//
// How a batch goes out. Commands are appended in batch order (XADD, or EVALSHA of the dedup
// script) while fewer than `pipeline` are unanswered, written as the socket takes them, and the
// replies, which come in command order, are matched to the oldest unanswered command (a FIFO of
// batch indexes). Each reply settles its message:
//   a string (XADD) / {entry id, added} (the script)   published
//   NOSCRIPT (the script cache was flushed)            nothing more is sent; once every sent
//                                                      command is answered, and if none after
//                                                      the first NOSCRIPT was written, the script
//                                                      is loaded again and the batch goes on from
//                                                      that message (so nothing is reordered);
//                                                      otherwise those messages are kUnavailable
//   another error                                      classify.h; a server state (LOADING, OOM,
//                                                      READONLY, ...) stops the rest of the batch
//   anything else                                      outcome unknown; the connection is dropped
// A command without a reply when the connection breaks or the deadline passes is
// kOutcomeUnknown when any of its bytes reached the socket, kUnavailable otherwise; the
// connection is then dropped (its replies would be out of step) and made anew by the next call.

#include <algorithm>
#include <charconv>
#include <chrono>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "classify.h"
#include "connection.h"
#include "dedup_script.h"
#include "outbox/core/ascii.h"
#include "outbox/core/error.h"
#include "outbox/core/wire_names.h"
#include "outbox/sink/cloudevents.h"
#include "outbox/sink/name_template.h"
#include "outbox/sink/redis.h"
#include "outbox/sink/sink_base.h"

namespace outbox::redis {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

constexpr std::size_t kMaxPipeline = 100000;
constexpr std::size_t kMaxNameBytes = 1024;  // the stream template and the dedup prefix
constexpr std::size_t kMaxMessageBytes =
    std::size_t{512} * 1024 * 1024;  // Redis's proto-max-bulk-len default
constexpr milliseconds kMinDedupWindow{1000};
constexpr milliseconds kMaxDedupWindow = std::chrono::hours{24 * 365};
// Encoded commands waiting for the socket: more are appended only below this (a window of large
// messages does not sit in memory twice).
constexpr std::size_t kMaxUnsentBytes = std::size_t{1024} * 1024;
// How often one batch may load the script again after NOSCRIPT.
constexpr int kMaxScriptReloads = 2;

std::string Number(std::int64_t value) {
  char digits[24];
  const auto result = std::to_chars(std::begin(digits), std::end(digits), value);
  return {std::begin(digits), result.ptr};
}

std::string_view View(const redisReply& reply) { return {reply.str, reply.len}; }

// The sink's own fields and the reserved names (message_id, event_id, outbox-*, in any case): a
// user header named so is left out.
bool IsOwnField(std::string_view name) {
  return name == kIdField || name == kPayloadField || name == kContentTypeField ||
         name == kTypeField || wire::IsReservedName(name);
}

class RedisSink final : public SinkBase {
 public:
  explicit RedisSink(SinkOptions options)
      : options_(std::move(options)),
        endpoint_(ParseUrl(options_.url)),
        server_(endpoint_.Describe()),
        stream_(NameTemplate::Parse(options_.stream, "stream")),
        window_ms_(Number(options_.dedup_window.count())),
        max_len_(options_.max_len == 0 ? std::string{}
                                       : Number(static_cast<std::int64_t>(options_.max_len))),
        cloudevents_(options_.cloudevents) {}

  RedisSink(const RedisSink&) = delete;
  RedisSink& operator=(const RedisSink&) = delete;
  ~RedisSink() override = default;

  [[nodiscard]] std::string_view Name() const override { return kSinkName; }

  // Nothing to flush: every Publish waits for its replies or gives them up.
  void Close() override { connection_.reset(); }

 private:
  // A command sent or appended, not yet answered.
  struct InFlight {
    std::size_t index = kNoIndex;  // in the batch; kNoIndex for SCRIPT LOAD
    std::uint64_t start = 0;       // Connection::appended() before it
  };

  // What one Publish call keeps besides its verdicts.
  struct BatchState {
    explicit BatchState(Batch& envelopes) : batch(envelopes) {}
    Batch& batch;
    std::deque<InFlight> in_flight;
    std::size_t next = 0;  // the next message to append
    // NOSCRIPT: the first message that got it, whether a later one was written since, reloads.
    std::optional<std::size_t> noscript_from;
    bool written_after_noscript = false;
    int reloads = 0;
    bool reconnect = false;  // drop the connection after the batch
  };

  void Settle(std::size_t index, std::optional<Failure> failure) {
    state_->batch.Settle(index, std::move(failure));
  }
  void Stop(std::string reason) {
    if (state_) state_->batch.Stop(std::move(reason));
  }
  [[nodiscard]] bool Sending() const {
    return connection_.has_value() && !state_->batch.stopped() && !state_->noscript_from;
  }

  bool Connected(Deadline deadline) override;
  std::optional<std::string> Connect(Deadline deadline) override;
  void Send(Batch& batch, Deadline deadline) override;
  void Finish(Batch& batch, Deadline deadline) override;
  std::string ConnectFailed(const std::string& reason);
  std::optional<Failure> Prepare(const Envelope& envelope);
  // kPermanent when the entry prepared in args_ from `first_field` on is over max_message_bytes.
  std::optional<Failure> CheckSize(const Envelope& envelope, std::size_t first_field) const;
  void Run(Deadline deadline);
  // Appends, sends and reads until every message is answered or the batch stops; true when the
  // deadline ended it with commands unanswered.
  bool Pipeline(Deadline deadline);
  void HandleReply(const InFlight& command, const redisReply& reply);
  void HandleError(std::size_t index, std::string_view text);
  bool ReloadScript();
  void LoseConnection(const std::string& reason);
  void Log(LogLevel level, const std::string& message) const {
    if (options_.log) options_.log(level, "redis sink (" + server_ + "): " + message);
  }

  SinkOptions options_;
  Endpoint endpoint_;
  std::string server_;  // the endpoint as logs and reasons name it
  NameTemplate stream_;
  std::string window_ms_;
  std::string max_len_;  // "" for no MAXLEN

  std::optional<Connection> connection_;
  std::string script_sha_;  // from SCRIPT LOAD on this connection

  std::string last_logged_error_;  // the last connect failure logged
  bool out_of_memory_logged_ = false;

  // The arguments of the command being prepared: views into the envelope and these strings.
  std::vector<std::string_view> args_;
  std::string key_;
  std::string dedup_key_;
  std::string id_;
  std::string event_id_;
  std::string seq_;
  std::string prev_seq_;
  std::string partition_;
  std::string attempts_;
  // With envelope = "cloudevents": the attributes, their names as fields (ce_<name>).
  std::vector<cloudevents::Attribute> attributes_;
  cloudevents::Mapper cloudevents_;

  std::optional<BatchState> state_;  // the Publish call in progress
};

void RedisSink::Send(Batch& batch, Deadline deadline) {
  state_.emplace(batch);
  Run(deadline);
}

void RedisSink::Finish(Batch& batch, Deadline /*deadline*/) {
  state_.reset();
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (batch.published(i)) out_of_memory_logged_ = false;  // writes go through again
  }
}

bool RedisSink::Connected(Deadline /*deadline*/) {
  // A connection the server closed meanwhile (restart, idle timeout) is made anew before
  // anything is sent, so that its messages are kUnavailable, not kOutcomeUnknown.
  if (connection_ && !connection_->StillOpen()) connection_.reset();
  return connection_.has_value();
}

std::optional<std::string> RedisSink::Connect(Deadline deadline) {
  const auto now = SteadyClock::now();
  const Deadline until = std::min<Deadline>(deadline, now + options_.connect_timeout);
  std::optional<Connection> connection;
  try {
    connection.emplace(Connection::Open(endpoint_, until));
  } catch (const ConnectError& error) {
    return ConnectFailed("cannot connect to " + server_ + ": " + error.what());
  }

  // The handshake, pipelined: AUTH, SELECT, SCRIPT LOAD, as needed.
  std::vector<std::string> steps;
  if (endpoint_.password) {
    std::vector<std::string_view> auth = {"AUTH"};
    if (!endpoint_.user.empty()) auth.emplace_back(endpoint_.user);
    auth.emplace_back(*endpoint_.password);
    connection->Append(auth);
    steps.push_back(endpoint_.user.empty() ? "AUTH with the password"
                                           : "AUTH as user '" + endpoint_.user + "'");
  }
  const std::string db = Number(endpoint_.db);
  if (endpoint_.db != 0) {
    connection->Append(std::vector<std::string_view>{"SELECT", db});
    steps.push_back("SELECT " + db);
  }
  if (options_.dedup) {
    connection->Append(std::vector<std::string_view>{"SCRIPT", "LOAD", kDedupScript});
    steps.push_back("SCRIPT LOAD of the dedup script");
  }
  std::size_t answered = 0;
  while (answered < steps.size()) {
    if (!connection->Pump(until, /*busy=*/false)) {
      return ConnectFailed("connection to " + server_ + " lost during " + steps[answered] + ": " +
                           connection->error());
    }
    bool ok = true;
    for (ReplyPtr reply = connection->NextReply(&ok); reply && answered < steps.size();
         reply = connection->NextReply(&ok)) {
      if (reply->type == REDIS_REPLY_ERROR) {
        return ConnectFailed(steps[answered] + " on " + server_ +
                             " refused: " + Shorten(View(*reply)));
      }
      if (options_.dedup && answered + 1 == steps.size()) {
        if (reply->type != REDIS_REPLY_STRING) {
          return ConnectFailed("unexpected reply to SCRIPT LOAD from " + server_);
        }
        script_sha_ = std::string{View(*reply)};
      }
      ++answered;
    }
    if (!ok) return ConnectFailed("connection to " + server_ + ": " + connection->error());
    if (answered < steps.size() && SteadyClock::now() >= until) {
      return ConnectFailed("no answer from " + server_ + " to " + steps[answered] + " within " +
                           Millis(until - now));
    }
  }
  connection_ = std::move(connection);
  if (!last_logged_error_.empty()) {
    Log(LogLevel::kInfo, "connected again");
    last_logged_error_.clear();
  }
  return std::nullopt;
}

std::string RedisSink::ConnectFailed(const std::string& reason) {
  // Once per change of reason: a refused AUTH is worth a line, the same refusal every 5 s is not.
  if (reason != last_logged_error_) {
    Log(LogLevel::kWarn, reason);
    last_logged_error_ = reason;
  }
  return reason;
}

std::optional<Failure> RedisSink::Prepare(const Envelope& envelope) {
  key_ = stream_.Expand(envelope);
  if (key_.empty()) {
    return MakeFailure(FailureKind::kPermanent,
                       "the stream template '" + options_.stream + "' gives an empty key");
  }
  id_ = envelope.id.ToString();
  args_.clear();
  if (options_.dedup) {
    dedup_key_ = options_.dedup_prefix + id_;
    args_.insert(args_.end(),
                 {"EVALSHA", script_sha_, "2", key_, dedup_key_, window_ms_, max_len_});
  } else {
    args_.insert(args_.end(), {"XADD", key_});
    if (!max_len_.empty()) args_.insert(args_.end(), {"MAXLEN", "~", max_len_});
    args_.emplace_back("*");
  }
  const std::size_t first_field = args_.size();
  const auto field = [this](std::string_view name, std::string_view value) {
    args_.push_back(name);
    args_.push_back(value);
  };
  if (options_.envelope == EnvelopeStyle::kCloudEvents) {
    // Redis has no CloudEvents binding; after the Kafka binding's binary mode: each attribute
    // (datacontenttype too) as a field ce_<name>, the payload in the field `data`.
    if (auto error = cloudevents_.Attributes(envelope, attributes_)) {
      return MakeFailure(FailureKind::kPermanent, std::move(*error));
    }
    for (cloudevents::Attribute& attribute : attributes_) {
      attribute.name.insert(0, kCloudEventsFieldPrefix);
    }
    for (const cloudevents::Attribute& attribute : attributes_) {
      field(attribute.name, attribute.value);
    }
    field(kCloudEventsDataField, envelope.payload);
    return CheckSize(envelope, first_field);
  }
  field(kIdField, id_);
  event_id_ = envelope.EventId().ToString();
  field(wire::kEventId, event_id_);
  field(kPayloadField, envelope.payload);
  if (!envelope.content_type.empty()) field(kContentTypeField, envelope.content_type);
  if (envelope.type && !envelope.type->empty()) field(kTypeField, *envelope.type);
  if (options_.envelope == EnvelopeStyle::kFull) {
    field(wire::kTopicHeader, envelope.topic);
    if (envelope.stream_key) field(wire::kStreamKeyHeader, *envelope.stream_key);
    if (envelope.stream_seq) {
      seq_ = Number(*envelope.stream_seq);
      field(wire::kStreamSeqHeader, seq_);
    }
    if (envelope.stream_prev_seq) {
      prev_seq_ = Number(*envelope.stream_prev_seq);
      field(wire::kStreamPrevSeqHeader, prev_seq_);
    }
    partition_ = Number(envelope.partition);
    field(wire::kPartitionHeader, partition_);
    attempts_ = Number(envelope.attempts);
    field(wire::kAttemptsHeader, attempts_);
    field(wire::kTargetHeader, envelope.target);
    if (!envelope.database.empty()) field(wire::kDatabaseHeader, envelope.database);
  }
  for (const auto& [name, value] : envelope.headers) {
    if (!IsOwnField(name)) field(name, value);
  }
  return CheckSize(envelope, first_field);
}

std::optional<Failure> RedisSink::CheckSize(const Envelope& envelope,
                                            std::size_t first_field) const {
  std::size_t bytes = 0;
  for (std::size_t i = first_field; i < args_.size(); ++i) bytes += args_[i].size();
  if (bytes > options_.max_message_bytes) {
    return MakeFailure(FailureKind::kPermanent,
                       "the entry is " + std::to_string(bytes) + " bytes (payload " +
                           std::to_string(envelope.payload.size()) + "), over max_message_bytes (" +
                           std::to_string(options_.max_message_bytes) + ")");
  }
  return std::nullopt;
}

void RedisSink::Run(Deadline deadline) {
  BatchState& state = *state_;
  const bool deadline_passed = Pipeline(deadline);
  if (deadline_passed && connection_) {
    const std::uint64_t written = connection_->written();
    for (const InFlight& command : state.in_flight) {
      if (command.start < written) {
        Settle(command.index,
               MakeFailure(FailureKind::kOutcomeUnknown,
                           "sent, but no reply from " + server_ + " by the deadline"));
      } else {
        Settle(command.index,
               MakeFailure(FailureKind::kUnavailable, "not sent by the deadline (the server at " +
                                                          server_ + " is not reading)"));
      }
    }
    Stop("the deadline passed before its turn");
    // Their replies may still come, and would be taken for the next batch's.
    if (!state.in_flight.empty()) connection_.reset();
  }
  if (state.reconnect) connection_.reset();
}

bool RedisSink::Pipeline(Deadline deadline) {
  BatchState& state = *state_;
  const std::size_t size = state.batch.size();
  for (;;) {
    // Append while the window has room and the socket keeps up.
    while (Sending() && state.next < size && state.in_flight.size() < options_.pipeline &&
           connection_->unsent() < kMaxUnsentBytes) {
      if (SteadyClock::now() >= deadline) {
        Stop("the deadline passed before its turn");
        break;
      }
      const std::size_t index = state.next++;
      if (auto failure = Prepare(state.batch[index])) {
        Settle(index, std::move(failure));
        continue;
      }
      state.in_flight.push_back({.index = index, .start = connection_->appended()});
      connection_->Append(args_);
    }
    if (!connection_) return false;
    if (state.in_flight.empty()) {
      if (state.noscript_from && ReloadScript()) continue;
      if (state.next >= size || !Sending()) return false;
    }
    if (SteadyClock::now() >= deadline) return true;
    const bool busy = Sending() && state.next < size && state.in_flight.size() < options_.pipeline;
    if (!connection_->Pump(deadline, busy)) {
      LoseConnection(connection_->error());
      return false;
    }
    bool ok = true;
    for (ReplyPtr reply = connection_->NextReply(&ok); reply; reply = connection_->NextReply(&ok)) {
      if (state.in_flight.empty()) {
        LoseConnection("a reply to no command (replies out of step)");
        return false;
      }
      const InFlight command = state.in_flight.front();
      state.in_flight.pop_front();
      HandleReply(command, *reply);
      if (!connection_) return false;
    }
    if (!ok) {
      LoseConnection(connection_->error());
      return false;
    }
  }
}

void RedisSink::HandleReply(const InFlight& command, const redisReply& reply) {
  BatchState& state = *state_;
  if (command.index == kNoIndex) {  // SCRIPT LOAD after NOSCRIPT
    if (reply.type == REDIS_REPLY_STRING) script_sha_ = std::string{View(reply)};
    return;  // if it failed, the commands after it get NOSCRIPT again
  }
  const std::size_t index = command.index;
  if (reply.type == REDIS_REPLY_ERROR) {
    HandleError(index, View(reply));
    return;
  }
  const bool written = options_.dedup ? reply.type == REDIS_REPLY_ARRAY && reply.elements == 2 &&
                                            reply.element[0]->type == REDIS_REPLY_STRING &&
                                            reply.element[1]->type == REDIS_REPLY_INTEGER
                                      : reply.type == REDIS_REPLY_STRING;
  if (!written) {
    Settle(index, MakeFailure(FailureKind::kOutcomeUnknown, "unexpected reply (type " +
                                                                std::to_string(reply.type) +
                                                                ") from " + server_));
    LoseConnection("unexpected reply (type " + std::to_string(reply.type) + ")");
    return;
  }
  if (state.noscript_from && index > *state.noscript_from) state.written_after_noscript = true;
  if (options_.dedup && reply.element[1]->integer == 0 && options_.log) {
    const Envelope& envelope = state.batch[index];
    Log(LogLevel::kDebug, "message " + envelope.id.ToString() + " was on stream '" +
                              Shorten(stream_.Expand(envelope), 200) + "' already, as entry " +
                              std::string{View(*reply.element[0])} + " (deduplicated)");
  }
  Settle(index, std::nullopt);
}

void RedisSink::HandleError(std::size_t index, std::string_view text) {
  BatchState& state = *state_;
  if (options_.dedup && text.starts_with("NOSCRIPT")) {
    if (!state.noscript_from) state.noscript_from = index;
    Settle(index, MakeFailure(FailureKind::kUnavailable,
                              "not written: the server does not have the dedup script (" +
                                  Shorten(text) + "; SCRIPT FLUSH, or a failover?)"));
    return;
  }
  const ErrorVerdict verdict = ClassifyErrorReply(text);
  Failure failure = verdict.failure;
  if (failure.kind == FailureKind::kRejected || verdict.code == "NOPERM") {
    failure.reason =
        "stream '" + Shorten(stream_.Expand(state.batch[index]), 200) + "': " + failure.reason;
  }
  Settle(index, std::move(failure));
  if (verdict.server_state) {
    Stop("the server answered " + verdict.code + " to an earlier message of the batch");
  }
  if (verdict.reconnect) state.reconnect = true;
  if (verdict.out_of_memory && !out_of_memory_logged_) {
    out_of_memory_logged_ = true;
    Log(LogLevel::kError,
        "the server is out of memory, messages are not written until it has room (raise "
        "maxmemory, trim the streams with max_len, or let consumers delete what they read): " +
            Shorten(text));
  }
}

// After NOSCRIPT, every sent command answered: when nothing after the first NOSCRIPT was written,
// SCRIPT LOAD and go on from that message, in order. Otherwise the NOSCRIPT messages stay
// kUnavailable, and the next connection loads the script.
bool RedisSink::ReloadScript() {
  BatchState& state = *state_;
  const std::size_t from = *state.noscript_from;
  if (state.written_after_noscript || state.reloads >= kMaxScriptReloads || state.batch.stopped()) {
    state.reconnect = true;
    Stop("the server lost the dedup script (NOSCRIPT)");
    state.noscript_from.reset();
    return false;
  }
  ++state.reloads;
  for (std::size_t i = from; i < state.next; ++i) {
    state.batch.Unsettle(i);
  }
  state.next = from;
  state.noscript_from.reset();
  state.written_after_noscript = false;
  Log(LogLevel::kInfo, "the server lost the dedup script (NOSCRIPT): loading it again");
  state.in_flight.push_back({.index = kNoIndex, .start = connection_->appended()});
  connection_->Append(std::vector<std::string_view>{"SCRIPT", "LOAD", kDedupScript});
  return true;
}

void RedisSink::LoseConnection(const std::string& reason) {
  const std::string what = "connection to " + server_ + " lost: " + reason;
  const std::uint64_t written = connection_ ? connection_->written() : 0;
  for (const InFlight& command : state_->in_flight) {
    if (command.start < written) {
      Settle(command.index,
             MakeFailure(FailureKind::kOutcomeUnknown, "sent, but no reply before the " + what));
    } else {
      Settle(command.index, MakeFailure(FailureKind::kUnavailable, "not sent: " + what));
    }
  }
  state_->in_flight.clear();
  connection_.reset();
  Stop(what);
}

}  // namespace

void ValidateOptions(const SinkOptions& options) {
  if (options.envelope == EnvelopeStyle::kCloudEvents) {
    if (options.cloudevents.mode != cloudevents::Mode::kBinary) {
      throw ConfigError(std::string{cloudevents::kModeKey},
                        "Redis has no structured mode (no CloudEvents binding defines one): the "
                        "attributes are the entry's ce_* fields");
    }
    cloudevents::ValidateOptions(options.cloudevents);
  }
  ParseUrl(options.url);
  // The template as written; each expanded key is checked again when a message is prepared.
  for (const auto& [key, text] :
       {std::pair<std::string, const std::string&>{"stream", options.stream},
        {"dedup_prefix", options.dedup_prefix}}) {
    if (text.empty() || text.size() > kMaxNameBytes || HasControlCharacter(text)) {
      throw ConfigError(key, "must be 1 to 1024 bytes without control characters");
    }
  }
  NameTemplate::Parse(options.stream, "stream");
  if (options.dedup_window < kMinDedupWindow || options.dedup_window > kMaxDedupWindow) {
    throw ConfigError("dedup_window", "must be between 1 s and 365 days");
  }
  if (options.pipeline == 0 || options.pipeline > kMaxPipeline) {
    throw ConfigError("pipeline", "must be between 1 and 100000 (commands in flight)");
  }
  if (options.connect_timeout <= milliseconds::zero()) {
    throw ConfigError("connect_timeout", "must be positive");
  }
  if (options.max_message_bytes == 0 || options.max_message_bytes > kMaxMessageBytes) {
    throw ConfigError("max_message_bytes", "must be between 1 and 536870912 (512 MiB)");
  }
}

std::unique_ptr<Sink> OpenSink(SinkOptions options) {
  ValidateOptions(options);
  if (options.dedup && options.log && options.lease > milliseconds::zero() &&
      options.dedup_window < options.lease) {
    options.log(LogLevel::kWarn,
                "redis sink: dedup_window (" + Millis(options.dedup_window) +
                    ") is shorter than the relay's lease (" + Millis(options.lease) +
                    "): a message published again after a takeover may be added twice");
  }
  return std::make_unique<RedisSink>(std::move(options));
}

}  // namespace outbox::redis
