// outbox-bench drain --sink redis: N pending messages, then outboxd with a Redis Streams sink
// (deduplication on, its default), next to two ceilings measured just before on the same server
// by a plain hiredis client with the same window of commands in flight: pipelined XADD of the
// same entries (the ceiling), and the same entries through a deduplicating script like
// the sink's (EVALSHA: seen? XADD, remember the id), which shows what deduplication costs the
// server. All rates are read the same way: XLEN of the stream, every ~2 ms.

#include <hiredis/hiredis.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "drains.h"
#include "outbox/core/uuid.h"
#include "outbox/core/wire_names.h"

namespace outbox::bench {
namespace {

// The window the sink uses unless told otherwise (sink/redis.h, pipeline).
constexpr int kDefaultWindow = 1000;

// KEYS[1] the stream, KEYS[2] the dedup key; ARGV[1] the window in seconds, ARGV[2..] the fields.
// Seen: the entry id remembered; otherwise XADD, then remember its id.
constexpr std::string_view kDedupScript =
    "local seen = redis.call('GET', KEYS[2]) "
    "if seen then return seen end "
    "local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2)) "
    "redis.call('SET', KEYS[2], id, 'EX', ARGV[1]) "
    "return id";

struct ContextDeleter {
  void operator()(redisContext* context) const { redisFree(context); }
};
struct ReplyDeleter {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

// host and port of redis://host:port[/db] (the bench's servers are on loopback, without AUTH).
std::pair<std::string, int> HostPort(const std::string& url) {
  std::string rest = url.starts_with("redis://") ? url.substr(8) : url;
  rest = rest.substr(0, rest.find('/'));
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos) return {rest, 6379};
  return {rest.substr(0, colon), std::stoi(rest.substr(colon + 1))};
}

// The longest any reply may take (a pipelined XADD's included).
constexpr timeval kReplyTimeout{.tv_sec = 10, .tv_usec = 0};

class RedisClient {
 public:
  explicit RedisClient(const std::string& url) : url_(url) { Connect(); }
  void Connect() {
    const std::string& url = url_;
    const auto [host, port] = HostPort(url);
    context_.reset(redisConnectWithTimeout(host.c_str(), port, timeval{.tv_sec = 5, .tv_usec = 0}));
    if (!context_ || context_->err != 0) {
      throw std::runtime_error("redis: connect to " + url + ": " +
                               (context_ ? context_->errstr : "out of memory"));
    }
    // A reply that never comes is an error, not a hang: bench/run once waited 14 minutes in an
    // ArrivalWatcher's XLEN on a connection Redis no longer answered, Redis itself answering PING.
    if (redisSetTimeout(context_.get(), kReplyTimeout) != REDIS_OK) {
      throw std::runtime_error("redis: setting the reply timeout: " +
                               std::string{context_->errstr});
    }
  }
  // One command, its reply; throws on a connection error or an error reply.
  ReplyPtr Command(const std::vector<std::string>& args) {
    Append(args);
    return Read();
  }
  void Append(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lengths;
    for (const auto& arg : args) {
      argv.push_back(arg.data());
      lengths.push_back(arg.size());
    }
    if (redisAppendCommandArgv(context_.get(), static_cast<int>(argv.size()), argv.data(),
                               lengths.data()) != REDIS_OK) {
      throw std::runtime_error(std::string{"redis: append: "} + context_->errstr);
    }
  }
  ReplyPtr Read() {
    void* raw = nullptr;
    if (redisGetReply(context_.get(), &raw) != REDIS_OK) {
      throw std::runtime_error(std::string{"redis: reply: "} + context_->errstr);
    }
    ReplyPtr reply{static_cast<redisReply*>(raw)};
    if (reply->type == REDIS_REPLY_ERROR) {
      throw std::runtime_error("redis: " + std::string{reply->str, reply->len});
    }
    return reply;
  }
  // XLEN of `key`; -1 when it cannot be read (the next call connects again).
  std::int64_t Length(const std::string& key) {
    try {
      if (broken_) Connect();
      broken_ = false;
      return Command({"XLEN", key})->integer;
    } catch (const std::runtime_error&) {
      broken_ = true;  // a reply may be left unread: this connection is done
      return -1;
    }
  }
  // Deletes every key that starts with `prefix` (SCAN, then UNLINK in batches).
  void DeletePrefix(const std::string& prefix) {
    std::string cursor = "0";
    do {
      const auto reply = Command({"SCAN", cursor, "MATCH", prefix + "*", "COUNT", "1000"});
      cursor.assign(reply->element[0]->str, reply->element[0]->len);
      std::vector<std::string> unlink = {"UNLINK"};
      for (std::size_t i = 0; i < reply->element[1]->elements; ++i) {
        unlink.emplace_back(reply->element[1]->element[i]->str, reply->element[1]->element[i]->len);
      }
      if (unlink.size() > 1) Command(unlink);
    } while (cursor != "0");
  }
  std::string Info(const std::string& section, const std::string& field) {
    const auto reply = Command({"INFO", section});
    const std::string text{reply->str, reply->len};
    const auto at = text.find(field + ":");
    if (at == std::string::npos) return "?";
    const auto end = text.find("\r\n", at);
    return text.substr(at + field.size() + 1, end - at - field.size() - 1);
  }

 private:
  std::string url_;
  bool broken_ = false;
  std::unique_ptr<redisContext, ContextDeleter> context_;
};

// Deletes the bench's keys (its streams and the dedup keys under its prefix) when it ends.
class BenchKeys {
 public:
  BenchKeys(const std::string& url, std::string prefix)
      : client_(url), prefix_(std::move(prefix)) {}
  ~BenchKeys() {
    try {
      client_.DeletePrefix(prefix_);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "outbox-bench: cleaning up redis keys %s*: %s\n", prefix_.c_str(),
                   error.what());
    }
  }
  BenchKeys(const BenchKeys&) = delete;
  BenchKeys& operator=(const BenchKeys&) = delete;

 private:
  RedisClient client_;
  std::string prefix_;
};

// The entry of message i, as the sink writes it: id, payload and the outbox's fields.
std::vector<std::string> EntryFields(std::int64_t i, std::size_t payload, int streams,
                                     const std::string& stream) {
  return {"id",
          NewUuidV7().ToString(),
          "payload",
          Payload(i, payload),
          "content_type",
          "application/json",
          std::string{wire::kTopicHeader},
          stream,
          std::string{wire::kStreamKeyHeader},
          "s" + std::to_string(i % streams),
          std::string{wire::kStreamSeqHeader},
          std::to_string(i / streams + 1),
          std::string{wire::kPartitionHeader},
          std::to_string((i % streams) % 64),
          std::string{wire::kAttemptsHeader},
          "0"};
}

// Messages 0..count-1 into `stream`, `window` commands in flight; through the dedup script when
// `dedup_prefix` is set. The rate as XLEN saw it.
double RedisCeiling(const BrokerDrainOptions& options, const std::string& stream,
                    const std::string& dedup_prefix, std::int64_t count, std::size_t payload,
                    int streams, int window) {
  RedisClient client(options.url);
  RedisClient reader(options.url);
  std::string sha;
  if (!dedup_prefix.empty()) {
    const auto loaded = client.Command({"SCRIPT", "LOAD", std::string{kDedupScript}});
    sha.assign(loaded->str, loaded->len);
  }
  ArrivalWatcher watcher([&reader, &stream] { return reader.Length(stream); }, count);
  std::int64_t outstanding = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    std::vector<std::string> fields = EntryFields(i, payload, streams, stream);
    std::vector<std::string> command;
    if (dedup_prefix.empty()) {
      command = {"XADD", stream, "*"};
    } else {
      command = {"EVALSHA", sha, "2", stream, dedup_prefix + fields[1], "600"};
    }
    command.insert(command.end(), fields.begin(), fields.end());
    client.Append(command);
    if (++outstanding >= window) {
      client.Read();
      --outstanding;
    }
  }
  for (; outstanding > 0; --outstanding) client.Read();
  if (!watcher.Wait(std::chrono::seconds{60})) throw std::runtime_error("ceiling: stream not full");
  return watcher.Rate();
}

struct RedisDrainResult : OutboxdDrain {
  std::int64_t extra = 0;
};

RedisDrainResult RedisDrain(Env& env, const BrokerDrainOptions& options, const std::string& stream,
                            const std::string& dedup_prefix, std::int64_t count,
                            std::size_t payload, int streams, int window) {
  Schema schema(env);
  Preinsert(env, schema, stream, 0, count, payload, streams);
  RedisClient reader(options.url);
  ArrivalWatcher watcher([&reader, &stream] { return reader.Length(stream); }, count);
  const std::string sink = "type = \"redis\"\nurl = \"" + options.url +
                           "\"\nstream = \"{topic}\"\npipeline = " + std::to_string(window) +
                           "\ndedup_prefix = \"" + dedup_prefix + "\"\n";
  RedisDrainResult result;
  static_cast<OutboxdDrain&>(result) =
      RunOutboxdDrain(env, schema, sink, options.batch_size, watcher, "redis drain");
  result.extra = reader.Length(stream) - count;
  return result;
}

}  // namespace

void RedisDrainBench(Env& env, const BrokerDrainOptions& options,
                     const std::vector<std::int64_t>& counts,
                     const std::vector<std::size_t>& payloads, int streams,
                     std::int64_t store_messages) {
  const int window = options.window > 0 ? options.window : kDefaultWindow;
  RedisClient info(options.url);
  std::printf(
      "== burst drain into Redis Streams: pre-inserted pending messages over %d streams, then "
      "outboxd starts;\n   next to two ceilings, a plain hiredis %d.%d.%d client writing the same "
      "entries to the same server just before\n",
      streams, HIREDIS_MAJOR, HIREDIS_MINOR, HIREDIS_PATCH);
  PrintRelayConditions(env);
  std::printf(
      "relay.batch_size %d; sink: redis, stream = {topic}, dedup on (its default), pipeline %d\n"
      "ceilings: %d commands in flight, entries with the sink's fields (id, payload, content_type, "
      "outbox-topic, -stream-key, -stream-seq, -partition, -attempts); XADD: pipelined XADD; "
      "dedup: EVALSHA of a script that returns the remembered entry id or XADDs and remembers it "
      "(GET, XADD, SET EX)\n"
      "server: %s, redis %s, appendonly %s, maxmemory %s\n"
      "rate (all): XLEN of the stream, read every ~2 ms, from the first reading above 0 to the "
      "first at N; also: outboxd start -> N in the stream and -> the outbox table empty\n\n",
      options.batch_size, window, window, options.url.c_str(),
      info.Info("server", "redis_version").c_str(),
      info.Info("persistence", "aof_enabled") == "1" ? "yes" : "no",
      info.Info("memory", "maxmemory_human").c_str());
  Flush();
  const std::string prefix = "outbox-bench:" + std::to_string(getpid()) + ":";
  const BenchKeys keys(options.url, prefix);
  for (const std::size_t payload : payloads) {
    const double store = StoreClaimComplete(env, store_messages, payload, options.batch_size);
    std::printf(
        "payload %zu B: store claim+complete (batch %d, no broker, %s messages): %s msgs/s\n",
        payload, options.batch_size, Thousands(static_cast<double>(store_messages)).c_str(),
        Thousands(store).c_str());
    Flush();
    for (const std::int64_t count : counts) {
      for (int round = 1; round <= options.repeat; ++round) {
        const std::string name = prefix + env.NewName("stream");
        const double xadd =
            RedisCeiling(options, name + ":xadd", "", count, payload, streams, window);
        const double dedup = RedisCeiling(options, name + ":dedup", name + ":seen:", count, payload,
                                          streams, window);
        const auto drain = RedisDrain(env, options, name + ":drain", name + ":sink-seen:", count,
                                      payload, streams, window);
        std::printf(
            "  %s x %zu B%s: ceilings XADD %s msgs/s, dedup script %s msgs/s; drain %s msgs/s = "
            "%.0f %% of XADD, %.0f %% of dedup script (%.0f %% of store claim+complete)\n"
            "    drain: all in the stream %.2f s after outboxd started, table empty after %.2f s; "
            "entries beyond N: %lld; outboxd CPU %.2f s per 100k messages, peak RSS %s, %.4f "
            "statements/message; redis used memory %s; memory available %s\n",
            Thousands(static_cast<double>(count)).c_str(), payload,
            options.repeat > 1 ? (" (round " + std::to_string(round) + ")").c_str() : "",
            Thousands(xadd).c_str(), Thousands(dedup).c_str(), Thousands(drain.rate).c_str(),
            100.0 * drain.rate / xadd, 100.0 * drain.rate / dedup, 100.0 * drain.rate / store,
            drain.filled, drain.emptied, static_cast<long long>(drain.extra),
            drain.process.cpu_seconds / static_cast<double>(count) * 1e5,
            Mib(drain.process.hwm_kib).c_str(), drain.statements / static_cast<double>(count),
            info.Info("memory", "used_memory_human").c_str(), Mib(AvailableKib()).c_str());
        Flush();
        RedisClient(options.url).DeletePrefix(name);  // this round's streams and dedup keys
      }
    }
  }
  std::printf("\n");
}

}  // namespace outbox::bench
