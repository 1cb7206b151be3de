// outbox-bench drain --sink nats: N pending messages, then outboxd with a NATS JetStream sink,
// next to the ceiling measured just before on the same server: a plain libnats JetStream client
// publishing the same messages (subject, Nats-Msg-Id, the sink's headers, payloads)
// asynchronously with the same window of pending acks. Both rates are read the same way: the
// stream's message count, every ~2 ms.

#include <nats/nats.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "drains.h"
#include "outbox/core/uuid.h"
#include "outbox/core/wire_names.h"

namespace outbox::bench {
namespace {

// The window the sink uses unless told otherwise (sink/nats.h, max_pending).
constexpr int kDefaultWindow = 1000;

void CheckNats(natsStatus status, const std::string& what) {
  if (status != NATS_OK) {
    throw std::runtime_error("nats: " + what + ": " + natsStatus_GetText(status) + " (" +
                             nats_GetLastError(nullptr) + ")");
  }
}

struct ConnectionDeleter {
  void operator()(natsConnection* connection) const { natsConnection_Destroy(connection); }
};
struct JetStreamDeleter {
  void operator()(jsCtx* js) const { jsCtx_Destroy(js); }
};
struct StreamInfoDeleter {
  void operator()(jsStreamInfo* info) const { jsStreamInfo_Destroy(info); }
};
struct MessageDeleter {
  void operator()(natsMsg* message) const { natsMsg_Destroy(message); }
};
using StreamInfoPtr = std::unique_ptr<jsStreamInfo, StreamInfoDeleter>;
using MessagePtr = std::unique_ptr<natsMsg, MessageDeleter>;

// What the ceiling's acks said.
struct Acks {
  std::atomic<std::int64_t> ok{0};
  std::atomic<std::int64_t> failed{0};
  std::mutex mutex;
  std::string first_error;
};

void OnAck(jsCtx* /*js*/, natsMsg* message, jsPubAck* /*ack*/, jsPubAckErr* error, void* closure) {
  auto& acks = *static_cast<Acks*>(closure);
  if (error == nullptr) {
    ++acks.ok;
  } else if (acks.failed++ == 0) {
    const std::lock_guard lock(acks.mutex);
    acks.first_error = error->ErrText != nullptr ? error->ErrText : natsStatus_GetText(error->Err);
  }
  natsMsg_Destroy(message);  // ours to destroy (nats.h, jsPubAckHandler)
}

// A connection with a JetStream context; `acks`, when given, receives every async publish's ack.
class NatsClient {
 public:
  NatsClient(const std::string& url, int window, Acks* acks = nullptr) {
    natsConnection* connection = nullptr;
    CheckNats(natsConnection_ConnectTo(&connection, url.c_str()), "connect to " + url);
    connection_.reset(connection);
    jsOptions options;
    jsOptions_Init(&options);
    options.PublishAsync.MaxPending = window;
    if (acks != nullptr) {
      options.PublishAsync.AckHandler = OnAck;
      options.PublishAsync.AckHandlerClosure = acks;
    }
    jsCtx* js = nullptr;
    CheckNats(natsConnection_JetStream(&js, connection, &options), "JetStream context");
    js_.reset(js);
  }
  [[nodiscard]] jsCtx* js() const { return js_.get(); }

 private:
  std::unique_ptr<natsConnection, ConnectionDeleter> connection_;  // outlives js_
  std::unique_ptr<jsCtx, JetStreamDeleter> js_;
};

// A file-storage stream over one subject, deleted when this object dies.
class BenchStream {
 public:
  BenchStream(const std::string& url, std::string name, const std::string& subject)
      : admin_(url, 1), name_(std::move(name)) {
    jsStreamConfig config;
    jsStreamConfig_Init(&config);
    config.Name = name_.c_str();
    const char* subjects[] = {subject.c_str()};
    config.Subjects = subjects;
    config.SubjectsLen = 1;
    config.Storage = js_FileStorage;
    jsStreamInfo* info = nullptr;
    jsErrCode code{};
    CheckNats(js_AddStream(&info, admin_.js(), &config, nullptr, &code), "add stream " + name_);
    const StreamInfoPtr owned{info};
    duplicate_window_s_ = static_cast<double>(info->Config->Duplicates) / 1e9;
  }
  ~BenchStream() { js_DeleteStream(admin_.js(), name_.c_str(), nullptr, nullptr); }
  BenchStream(const BenchStream&) = delete;
  BenchStream& operator=(const BenchStream&) = delete;

  // The messages the stream holds; -1 when it cannot be read.
  std::int64_t Count() {
    jsStreamInfo* info = nullptr;
    if (js_GetStreamInfo(&info, admin_.js(), name_.c_str(), nullptr, nullptr) != NATS_OK) {
      return -1;
    }
    const StreamInfoPtr owned{info};
    return static_cast<std::int64_t>(info->State.Msgs);
  }
  [[nodiscard]] double duplicate_window_s() const { return duplicate_window_s_; }

 private:
  NatsClient admin_;
  std::string name_;
  double duplicate_window_s_ = 0;
};

std::string StreamName(Env& env, const std::string& what) {
  std::string name = env.NewName(what);
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

// The ceiling: messages 0..count-1 as Preinsert makes them, with the headers the sink sets.
double NatsCeiling(const BrokerDrainOptions& options, BenchStream& stream,
                   const std::string& subject, std::int64_t count, std::size_t payload, int streams,
                   int window) {
  Acks acks;
  NatsClient client(options.url, window, &acks);
  ArrivalWatcher watcher([&stream] { return stream.Count(); }, count);
  const std::string content_type = "application/json";
  const std::string attempts = "0";
  for (std::int64_t i = 0; i < count; ++i) {
    const std::string body = Payload(i, payload);
    const std::string id = NewUuidV7().ToString();
    const std::string key = "s" + std::to_string(i % streams);
    const std::string seq = std::to_string(i / streams + 1);
    const std::string partition = std::to_string((i % streams) % 64);
    natsMsg* raw = nullptr;
    CheckNats(
        natsMsg_Create(&raw, subject.c_str(), nullptr, body.data(), static_cast<int>(body.size())),
        "message");
    MessagePtr message{raw};
    for (const auto& [name, value] :
         {std::pair<std::string_view, const std::string&>{"Nats-Msg-Id", id},
          {wire::kMessageId, id},
          {"content_type", content_type},
          {wire::kTopicHeader, subject},
          {wire::kStreamKeyHeader, key},
          {wire::kStreamSeqHeader, seq},
          {wire::kPartitionHeader, partition},
          {wire::kAttemptsHeader, attempts}}) {
      CheckNats(natsMsgHeader_Set(message.get(), std::string{name}.c_str(), value.c_str()),
                "header");
    }
    natsMsg* handed = message.release();  // the library owns it once accepted
    const natsStatus status = js_PublishMsgAsync(client.js(), &handed, nullptr);
    if (status != NATS_OK) {
      natsMsg_Destroy(handed);  // still ours when refused (then not NULL)
      CheckNats(status, "publish async");
    }
  }
  jsPubOptions complete;
  jsPubOptions_Init(&complete);
  complete.MaxWait = 600000;
  CheckNats(js_PublishAsyncComplete(client.js(), &complete), "publish async complete");
  if (acks.failed > 0 || acks.ok < count) {
    throw std::runtime_error("nats ceiling: " + std::to_string(acks.ok.load()) + " of " +
                             std::to_string(count) + " acked; first error: " + acks.first_error);
  }
  if (!watcher.Wait(std::chrono::seconds{60})) throw std::runtime_error("ceiling: stream not full");
  return watcher.Rate();
}

struct NatsDrainResult : OutboxdDrain {
  std::int64_t extra = 0;
};

NatsDrainResult NatsDrain(Env& env, const BrokerDrainOptions& options, BenchStream& stream,
                          const std::string& subject, std::int64_t count, std::size_t payload,
                          int streams, int window) {
  Schema schema(env);
  Preinsert(env, schema, subject, 0, count, payload, streams);
  ArrivalWatcher watcher([&stream] { return stream.Count(); }, count);
  const std::string sink = "type = \"nats\"\nurl = \"" + options.url +
                           "\"\nsubject = \"{topic}\"\nmax_pending = " + std::to_string(window) +
                           "\n";
  NatsDrainResult result;
  static_cast<OutboxdDrain&>(result) =
      RunOutboxdDrain(env, schema, sink, options.batch_size, watcher, "nats drain");
  result.extra = stream.Count() - count;
  return result;
}

}  // namespace

void NatsDrainBench(Env& env, const BrokerDrainOptions& options,
                    const std::vector<std::int64_t>& counts,
                    const std::vector<std::size_t>& payloads, int streams,
                    std::int64_t store_messages) {
  const int window = options.window > 0 ? options.window : kDefaultWindow;
  std::printf(
      "== burst drain into NATS JetStream: pre-inserted pending messages over %d streams, then "
      "outboxd starts;\n   next to the ceiling, a plain libnats %s JetStream client publishing the "
      "same messages asynchronously to the same server just before\n",
      streams, nats_GetVersion());
  PrintRelayConditions(env);
  std::printf(
      "relay.batch_size %d; sink: nats, subject = {topic}, max_pending %d (acks outstanding)\n"
      "ceiling: js_PublishMsgAsync with MaxPending %d, Nats-Msg-Id and the sink's headers "
      "(message_id, content_type, outbox-topic, -stream-key, -stream-seq, -partition, "
      "-attempts), keys s0..s%d\n"
      "server: %s, each case two new streams (file storage, the server's default duplicate "
      "window and sync interval)\n"
      "rate (both): the stream's message count (stream info), read every ~2 ms, from the first "
      "reading above 0 to the first at N; also: outboxd start -> N in the stream and -> the "
      "outbox table empty\n\n",
      options.batch_size, window, window, streams - 1, options.url.c_str());
  Flush();
  for (const std::size_t payload : payloads) {
    const double store = StoreClaimComplete(env, store_messages, payload, options.batch_size);
    std::printf(
        "payload %zu B: store claim+complete (batch %d, no broker, %s messages): %s msgs/s\n",
        payload, options.batch_size, Thousands(static_cast<double>(store_messages)).c_str(),
        Thousands(store).c_str());
    Flush();
    for (const std::int64_t count : counts) {
      for (int round = 1; round <= options.repeat; ++round) {
        const std::string ceiling_subject = "outbox-bench." + env.NewName("ceiling");
        const std::string drain_subject = "outbox-bench." + env.NewName("drain");
        double ceiling = 0;
        double window_s = 0;
        {
          BenchStream stream(options.url, StreamName(env, "ceiling"), ceiling_subject);
          window_s = stream.duplicate_window_s();
          ceiling = NatsCeiling(options, stream, ceiling_subject, count, payload, streams, window);
        }
        BenchStream stream(options.url, StreamName(env, "drain"), drain_subject);
        const auto drain =
            NatsDrain(env, options, stream, drain_subject, count, payload, streams, window);
        std::printf(
            "  %s x %zu B%s: ceiling %s msgs/s; drain %s msgs/s = %.0f %% of the ceiling (%.0f %% "
            "of store claim+complete)\n"
            "    drain: all in the stream %.2f s after outboxd started, table empty after %.2f s; "
            "messages beyond N: %lld; outboxd CPU %.2f s per 100k messages, peak RSS %s, %.4f "
            "statements/message; duplicate window %.0f s; memory available %s\n",
            Thousands(static_cast<double>(count)).c_str(), payload,
            options.repeat > 1 ? (" (round " + std::to_string(round) + ")").c_str() : "",
            Thousands(ceiling).c_str(), Thousands(drain.rate).c_str(), 100.0 * drain.rate / ceiling,
            100.0 * drain.rate / store, drain.filled, drain.emptied,
            static_cast<long long>(drain.extra),
            drain.process.cpu_seconds / static_cast<double>(count) * 1e5,
            Mib(drain.process.hwm_kib).c_str(), drain.statements / static_cast<double>(count),
            window_s, Mib(AvailableKib()).c_str());
        Flush();
      }
    }
  }
  std::printf("\n");
}

}  // namespace outbox::bench
