// outbox-chaos: a ledger check in the manner of Jepsen's (issue #40). Writers commit and roll
// back transactions that enqueue messages on many streams, each message carrying its stream and
// a per-stream counter in its payload; two outboxd relays publish them into one sink type while
// a scheduler injects faults; a consumer of this program records every delivery. At the end the
// ledger of what committed is compared with what arrived, per fault kind:
//
//   committed    messages whose transaction committed (the writer saw COMMIT succeed)
//   delivered    of those, delivered at least once
//   lost         committed, never delivered (within the drain bound after the faults stop)
//   phantom      delivered, never committed (rolled back, or never written)
//   duplicates   deliveries beyond the first (allowed: at-least-once; counted)
//   order        first deliveries of a stream's message after a later message of that stream
//   stall        the longest time with committed messages undelivered and no delivery at all
//
//   outbox-chaos --sink rabbitmq|nats|redis|http|kafka [--minutes 5] [--seed N]
//                [--faults kill,stop,cut-db,freeze-db,cut-broker,freeze-broker]
//
// The run is cut into one phase per fault kind (in --faults order, --minutes shared evenly);
// during a phase, every 1-4 s, one fault of that kind hits one of the relays at random (each
// logged). A message's row is the phase in which it was committed; a duplicate's or phantom's,
// the phase in which it arrived; a stall's, the phase in which it began. Faults, all on things
// this program started: `kill` (SIGKILL a relay, start it again 0.5-3 s later), `stop` (SIGSTOP
// 1-8 s, past the 3 s lease, then SIGCONT), `cut-db` / `cut-broker` (close every connection of
// that relay's proxy in front of PostgreSQL / the broker), `freeze-db` / `freeze-broker` (those
// connections stop forwarding for 1-10 s with their sockets open, new ones go through; for Kafka
// the brokers' answers are held, see KafkaLink). `none` is a phase without faults. The servers
// themselves are never restarted: they are shared (Kafka is a mock cluster of this run's own).
//
// Servers: $OUTBOX_TEST_PG_URL, $OUTBOX_TEST_AMQP_URL, $OUTBOX_TEST_NATS_URL,
// $OUTBOX_TEST_REDIS_URL (scripts/services); for Kafka, outbox-kafka-mock started here. It works
// in database outbox_bench, in a schema of its own, and a queue / stream / Redis key of its own,
// all removed at the end. Exit status 1
// on any lost, phantom or out-of-order message (or when a relay cannot be started).

#include <hiredis/hiredis.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <nats/nats.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_endpoint.h"
#include "bench_support.h"
#include "kafka/kafka_proxy.h"
#include "kafka_mock.h"
#include "support/amqp_test_client.h"
#include "support/child_process.h"
#include "support/tcp_proxy.h"

namespace {

using namespace outbox::bench;  // NOLINT(google-build-using-namespace): the bench's toolbox
using outbox::testing::TcpProxy;
using std::chrono::milliseconds;

// Seconds since the run began (every time in the ledger).
class RunClock {
 public:
  double Now() const { return Seconds(Clock::now() - start_); }

 private:
  Clock::time_point start_ = Clock::now();
};
RunClock run_clock;  // NOLINT: one run per process

void Log(const char* format, auto... args) {
  std::printf("[%7.2f s] ", run_clock.Now());
  std::printf(format, args...);
  std::printf("\n");
  Flush();
}

// --- what the consumers received ----------------------------------------------------------------

struct Arrival {
  std::string payload;
  double at = 0;
};

class Arrivals {
 public:
  void Add(std::string payload) {
    const double at = run_clock.Now();
    std::lock_guard lock(mutex_);
    list_.push_back({std::move(payload), at});
  }
  std::size_t Count() const {
    std::lock_guard lock(mutex_);
    return list_.size();
  }
  std::vector<Arrival> Take() const {
    std::lock_guard lock(mutex_);
    return list_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Arrival> list_;
};

// host and port of scheme://[user@]host:port[/...].
std::pair<std::string, int> HostPort(const std::string& url, int default_port) {
  std::string rest = url.substr(url.find("://") == std::string::npos ? 0 : url.find("://") + 3);
  rest = rest.substr(0, rest.find('/'));
  if (const auto at = rest.rfind('@'); at != std::string::npos) rest = rest.substr(at + 1);
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos) return {rest, default_port};
  return {rest.substr(0, colon), std::stoi(rest.substr(colon + 1))};
}

// A relay's way to the broker, which the faults cut and freeze.
class BrokerLink {
 public:
  virtual ~BrokerLink() = default;
  virtual int port() const = 0;  // where the relay connects, on 127.0.0.1
  virtual std::string address() const { return "127.0.0.1:" + std::to_string(port()); }
  virtual void Cut() = 0;
  virtual void Freeze(bool frozen) = 0;
};

// A TCP proxy (tests/support/tcp_proxy.h) in front of a server.
class TcpLink : public BrokerLink {
 public:
  explicit TcpLink(const std::pair<std::string, int>& upstream)
      : proxy_(upstream.first, upstream.second) {}
  int port() const override { return proxy_.port(); }
  void Cut() override { proxy_.DropAll(); }
  void Freeze(bool frozen) override {
    proxy_.SetMode(frozen ? TcpProxy::Mode::kFreeze : TcpProxy::Mode::kForward);
  }

 private:
  TcpProxy proxy_;
};

// One sink type: where the relays publish (through a BrokerLink of each) and a consumer that
// records every delivery into `arrivals`, on its own thread, straight to the server.
class Destination {
 public:
  virtual ~Destination() = default;
  // The upstream of the relays' broker proxies.
  virtual std::pair<std::string, int> Upstream() const = 0;
  // A relay's link to the broker: a TCP proxy in front of Upstream() unless the sink says.
  virtual std::unique_ptr<BrokerLink> NewLink() const {
    return std::make_unique<TcpLink>(Upstream());
  }
  // The body of [sinks.default] for a relay that reaches the broker through `link`.
  virtual std::string SinkConfig(const BrokerLink& link) const = 0;
  // The topic the writers use.
  virtual std::string Topic() const = 0;
  Arrivals arrivals;
};

class RabbitDestination : public Destination {
 public:
  explicit RabbitDestination(const std::string& name)
      : queue_((outbox::testing::DeclareQueue(name), name)) {}
  ~RabbitDestination() override {
    consumer_.Stop();
    outbox::testing::DeleteQueue(queue_);
  }
  std::pair<std::string, int> Upstream() const override {
    return HostPort(outbox::testing::AmqpUrl(), 5672);
  }
  std::string SinkConfig(const BrokerLink& link) const override {
    std::string url = outbox::testing::AmqpUrl();
    const auto [host, port] = Upstream();
    const std::string upstream = host + ":" + std::to_string(port);
    url.replace(url.find(upstream), upstream.size(), "127.0.0.1:" + std::to_string(link.port()));
    return "type = \"rabbitmq\"\nurl = \"" + url + "\"\nrouting_key = \"{topic}\"\n";
  }
  std::string Topic() const override { return queue_; }

 private:
  std::string queue_;
  // The tests' consumer (prefetch 500, each delivery acked once recorded; a message not acked
  // when the connection is lost comes again: a duplicate).
  outbox::testing::Consumer consumer_{queue_, [this](outbox::testing::Delivery&& delivery) {
                                        arrivals.Add(std::move(delivery.body));
                                      }};
};

class NatsDestination : public Destination {
 public:
  NatsDestination(std::string url, const std::string& name)
      : url_(std::move(url)), stream_(name), subject_(name) {
    Check(natsConnection_ConnectTo(&connection_, url_.c_str()), "connect");
    Check(natsConnection_JetStream(&js_, connection_, nullptr), "JetStream");
    jsStreamConfig config;
    jsStreamConfig_Init(&config);
    config.Name = stream_.c_str();
    const char* subjects[] = {subject_.c_str()};
    config.Subjects = subjects;
    config.SubjectsLen = 1;
    config.Storage = js_FileStorage;
    jsStreamInfo* info = nullptr;
    Check(js_AddStream(&info, js_, &config, nullptr, nullptr), "add stream");
    jsStreamInfo_Destroy(info);
    thread_ = std::thread([this] { Loop(); });
  }
  ~NatsDestination() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    js_DeleteStream(js_, stream_.c_str(), nullptr, nullptr);
    jsCtx_Destroy(js_);
    natsConnection_Destroy(connection_);
  }
  std::pair<std::string, int> Upstream() const override { return HostPort(url_, 4222); }
  std::string SinkConfig(const BrokerLink& link) const override {
    return "type = \"nats\"\nurl = \"nats://127.0.0.1:" + std::to_string(link.port()) +
           "\"\nsubject = \"{topic}\"\n";
  }
  std::string Topic() const override { return subject_; }

 private:
  static void Check(natsStatus status, const std::string& what) {
    if (status != NATS_OK) {
      throw std::runtime_error("nats: " + what + ": " + natsStatus_GetText(status));
    }
  }
  // Reads the stream in sequence order as it fills: every message the relays stored.
  void Loop() {
    std::uint64_t next = 1;
    while (!stop_) {
      natsMsg* message = nullptr;
      if (js_GetMsg(&message, js_, stream_.c_str(), next, nullptr, nullptr) == NATS_OK) {
        arrivals.Add(std::string(natsMsg_GetData(message),
                                 static_cast<std::size_t>(natsMsg_GetDataLength(message))));
        natsMsg_Destroy(message);
        ++next;
        continue;
      }
      std::this_thread::sleep_for(milliseconds{10});
    }
  }
  std::string url_;
  std::string stream_;
  std::string subject_;
  natsConnection* connection_ = nullptr;
  jsCtx* js_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class RedisDestination : public Destination {
 public:
  RedisDestination(std::string url, const std::string& name) : url_(std::move(url)), key_(name) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~RedisDestination() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    const auto [host, port] = Upstream();
    if (redisContext* context = redisConnect(host.c_str(), port); context != nullptr) {
      freeReplyObject(redisCommand(context, "DEL %s", key_.c_str()));
      // The sink's deduplication keys.
      freeReplyObject(redisCommand(context, "EVAL %s 0 %s",
                                   "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do "
                                   "redis.call('DEL', k) end return 0",
                                   (key_ + "-dedup:*").c_str()));
      redisFree(context);
    }
  }
  std::pair<std::string, int> Upstream() const override { return HostPort(url_, 6379); }
  std::string SinkConfig(const BrokerLink& link) const override {
    return "type = \"redis\"\nurl = \"redis://127.0.0.1:" + std::to_string(link.port()) +
           "\"\nstream = \"{topic}\"\ndedup_prefix = \"" + key_ + "-dedup:\"\n";
  }
  std::string Topic() const override { return key_; }

 private:
  // XREAD from the start, as the stream fills; reconnects when the reply does not come.
  void Loop() {
    std::string last = "0-0";
    while (!stop_) {
      const auto [host, port] = Upstream();
      redisContext* context = redisConnectWithTimeout(host.c_str(), port, timeval{5, 0});
      if (context == nullptr || context->err != 0) {
        if (context != nullptr) redisFree(context);
        std::this_thread::sleep_for(milliseconds{100});
        continue;
      }
      redisSetTimeout(context, timeval{5, 0});
      while (!stop_) {
        auto* reply = static_cast<redisReply*>(redisCommand(
            context, "XREAD COUNT 1000 BLOCK 200 STREAMS %s %s", key_.c_str(), last.c_str()));
        if (reply == nullptr) break;
        if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 1) {
          const redisReply* entries = reply->element[0]->element[1];
          for (std::size_t i = 0; i < entries->elements; ++i) {
            const redisReply* entry = entries->element[i];
            last.assign(entry->element[0]->str, entry->element[0]->len);
            const redisReply* fields = entry->element[1];
            for (std::size_t f = 0; f + 1 < fields->elements; f += 2) {
              if (std::string_view(fields->element[f]->str, fields->element[f]->len) == "payload") {
                arrivals.Add(std::string(fields->element[f + 1]->str, fields->element[f + 1]->len));
              }
            }
          }
        }
        freeReplyObject(reply);
      }
      redisFree(context);
    }
  }
  std::string url_;
  std::string key_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The HTTP drain's webhook endpoint (bench_endpoint.h) in this process: every POST answered 200
// once recorded. The arrival order of one stream's requests is the order the sink sent them in:
// it sends a stream's next message only once the one before it is answered.
class HttpDestination : public Destination {
 public:
  explicit HttpDestination(const std::string& name)
      : path_("/hooks/" + name),
        endpoint_(2, 0, {}, [this](std::string_view body) { arrivals.Add(std::string{body}); }) {}
  std::pair<std::string, int> Upstream() const override { return {"127.0.0.1", endpoint_.port()}; }
  std::string SinkConfig(const BrokerLink& link) const override {
    return "type = \"http\"\nurl = \"http://127.0.0.1:" + std::to_string(link.port()) + path_ +
           "\"\nrequest_timeout = \"3s\"\n";
  }
  std::string Topic() const override { return "chaos"; }

 private:
  std::string path_;
  BenchEndpoint endpoint_;
};

// Kafka: outbox-kafka-mock (librdkafka's mock cluster, 3 brokers) of this run, a topic of 6
// partitions, each relay through a KafkaProxy of its own (tests/kafka/kafka_proxy.h: it rewrites
// the brokers' addresses in Metadata responses, so that every connection of the relay goes
// through it). A cut closes the relay's connections (and lets it connect again at once); a freeze
// holds what the brokers answer (what the relay sends still goes through: the proxy has no mode
// that holds both directions). The consumer reads every partition from the start, directly.
class KafkaLink : public BrokerLink {
 public:
  explicit KafkaLink(const std::string& bootstraps) : proxy_(bootstraps) {}
  int port() const override { return 0; }
  std::string address() const override { return proxy_.bootstraps(); }
  void Cut() override {
    proxy_.Stop();
    proxy_.Start();
  }
  void Freeze(bool frozen) override { proxy_.Hold(frozen); }

 private:
  outbox::testing::KafkaProxy proxy_;
};

class KafkaDestination : public Destination {
 public:
  static constexpr int kPartitions = 6;
  KafkaDestination(const std::string& mock_program, const std::string& name)
      : mock_(mock_program, 3), topic_(name) {
    mock_.Command("topic " + topic_ + " " + std::to_string(kPartitions));
    std::array<char, 512> error{};
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    const auto set = [&](const char* key, const std::string& value) {
      if (rd_kafka_conf_set(conf, key, value.c_str(), error.data(), error.size()) !=
          RD_KAFKA_CONF_OK) {
        throw std::runtime_error(std::string{"kafka consumer: "} + error.data());
      }
    };
    set("bootstrap.servers", mock_.bootstraps());
    set("group.id", topic_);
    set("enable.auto.commit", "false");
    consumer_ = rd_kafka_new(RD_KAFKA_CONSUMER, conf, error.data(), error.size());
    if (consumer_ == nullptr) throw std::runtime_error(std::string{"kafka: "} + error.data());
    rd_kafka_topic_partition_list_t* partitions = rd_kafka_topic_partition_list_new(kPartitions);
    for (int p = 0; p < kPartitions; ++p) {
      rd_kafka_topic_partition_list_add(partitions, topic_.c_str(), p)->offset =
          RD_KAFKA_OFFSET_BEGINNING;
    }
    const rd_kafka_resp_err_t assigned = rd_kafka_assign(consumer_, partitions);
    rd_kafka_topic_partition_list_destroy(partitions);
    if (assigned != RD_KAFKA_RESP_ERR_NO_ERROR) {
      throw std::runtime_error(std::string{"kafka assign: "} + rd_kafka_err2str(assigned));
    }
    thread_ = std::thread([this] { Loop(); });
  }
  ~KafkaDestination() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    rd_kafka_consumer_close(consumer_);
    rd_kafka_destroy(consumer_);
  }
  std::pair<std::string, int> Upstream() const override { return {"127.0.0.1", 0}; }
  std::unique_ptr<BrokerLink> NewLink() const override {
    return std::make_unique<KafkaLink>(mock_.bootstraps());
  }
  std::string SinkConfig(const BrokerLink& link) const override {
    return "type = \"kafka\"\nbrokers = \"" + link.address() + "\"\ntopic = \"{topic}\"\n";
  }
  std::string Topic() const override { return topic_; }

 private:
  void Loop() {
    while (!stop_) {
      rd_kafka_message_t* message = rd_kafka_consumer_poll(consumer_, 100);
      if (message == nullptr) continue;
      if (message->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        arrivals.Add(std::string(static_cast<const char*>(message->payload), message->len));
      }
      rd_kafka_message_destroy(message);
    }
  }
  KafkaMock mock_;
  std::string topic_;
  rd_kafka_t* consumer_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// --- relays -------------------------------------------------------------------------------------

// One outboxd reaching PostgreSQL and the broker through proxies of its own.
class Relay {
 public:
  Relay(int index, const Env& env, const std::string& schema, const Destination& destination,
        const std::string& pg_host, int pg_port)
      : name_("relay-" + std::to_string(index)),
        db_proxy_(pg_host, pg_port),
        broker_link_(destination.NewLink()),
        config_((env.dir / (name_ + ".toml")).string()),
        outboxd_(env.outboxd) {
    std::ofstream out(config_);
    out << "[database]\nurl = \"" << env.bench_url << " host=127.0.0.1 port=" << db_proxy_.port()
        << "\"\nschema = \"" << schema << "\"\nstatement_deadline = \"2s\"\n"
        << "[relay]\ninstance = \"" << name_ << "\"\nbatch_size = 100\nlease = \"3000ms\"\n"
        << "sweep_interval = \"200ms\"\npublish_timeout = \"1400ms\"\n"
        << "shutdown_timeout = \"3s\"\nmin_backoff = \"50ms\"\nmax_backoff = \"1s\"\n"
        << "[retry]\ninitial_delay = \"100ms\"\nmax_delay = \"1s\"\nmax_attempts = 50\n"
        << "[log]\nlevel = \"info\"\n[http]\nlisten = \"\"\n[sinks.default]\n"
        << destination.SinkConfig(*broker_link_);
  }
  const std::string& name() const { return name_; }
  TcpProxy& db_proxy() { return db_proxy_; }
  BrokerLink& broker_link() { return *broker_link_; }
  bool running() const { return process_ != nullptr; }
  pid_t pid() const { return process_ ? process_->pid() : -1; }

  void Start() {
    process_ = std::make_unique<outbox::testing::ChildProcess>(
        std::vector<std::string>{outboxd_, "--config", config_}, config_ + ".log",
        outbox::testing::Ready::Notify());
    if (!process_->WaitReady(std::chrono::seconds{30})) {
      throw std::runtime_error(name_ + " did not start; log: " + config_ + ".log");
    }
  }
  void Kill() {
    process_->Signal(SIGKILL);
    process_->Wait(std::chrono::seconds{10});
    process_.reset();
  }
  void Signal(int signal) { process_->Signal(signal); }
  // SIGTERM; the exit status (-1: it did not exit within 20 s, then SIGKILL).
  int Stop() {
    const int code = process_->Stop(SIGTERM, std::chrono::seconds{20});
    process_.reset();
    return code;
  }

 private:
  std::string name_;
  TcpProxy db_proxy_;
  std::unique_ptr<BrokerLink> broker_link_;
  std::string config_;
  std::string outboxd_;
  std::unique_ptr<outbox::testing::ChildProcess> process_;
};

// --- writers ------------------------------------------------------------------------------------

struct Written {
  double at = 0;  // when COMMIT returned (committed), or was sent (uncertain)
  enum class Outcome : std::uint8_t { kCommitted, kRolledBack, kUncertain } outcome{};
};

// `count` threads, each with a connection of its own straight to PostgreSQL (no proxy: the
// faults are the relays'), each owning the streams s<k> with k mod count = its index, so that a
// stream's transactions are one thread's, one after another. A transaction enqueues 1-5 messages,
// each "s<k>/<n>" with n the stream's next counter (its payload, a JSON string), and commits or
// (20 %) rolls back. `pause` between transactions.
class Writers {
 public:
  Writers(const std::string& conninfo, const std::string& schema, const std::string& topic,
          int count, int streams, milliseconds pause, std::uint32_t seed)
      : conninfo_(conninfo),
        sql_("SELECT " + schema + ".enqueue(topic => $1, payload => $2::json, stream_key => $3)"),
        topic_(topic),
        count_(count),
        streams_(streams),
        pause_(pause) {
    for (int w = 0; w < count; ++w) {
      threads_.emplace_back([this, w, seed] { Loop(w, seed + static_cast<std::uint32_t>(w)); });
    }
  }
  ~Writers() { Stop(); }
  void Stop() {
    stop_ = true;
    for (auto& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
  }
  std::map<std::string, Written> ledger() const {
    std::lock_guard lock(mutex_);
    return ledger_;
  }
  std::string errors() const {
    std::lock_guard lock(mutex_);
    return errors_;
  }

 private:
  void Record(const std::vector<std::string>& keys, Written::Outcome outcome, double at) {
    std::lock_guard lock(mutex_);
    for (const auto& key : keys) ledger_[key] = {at, outcome};
  }

  void Loop(int w, std::uint32_t seed) {
    std::mt19937 random(seed);
    std::map<int, std::int64_t> counters;
    ConnPtr conn;
    while (!stop_) {
      if (!conn || PQstatus(conn.get()) != CONNECTION_OK) {
        conn.reset(PQconnectdb(conninfo_.c_str()));
        if (PQstatus(conn.get()) != CONNECTION_OK) {
          std::this_thread::sleep_for(milliseconds{200});
          continue;
        }
      }
      std::vector<std::string> keys;
      bool ok = PQresultStatus(ResultPtr{PQexec(conn.get(), "BEGIN")}.get()) == PGRES_COMMAND_OK;
      const int messages = 1 + static_cast<int>(random() % 5);
      for (int m = 0; m < messages && ok; ++m) {
        const int mine = streams_ / count_;
        const int stream = w + count_ * static_cast<int>(random() % static_cast<unsigned>(mine));
        const std::string stream_key = "s" + std::to_string(stream);
        const std::string key = stream_key + "/" + std::to_string(++counters[stream]);
        const std::string payload = "\"" + key + "\"";
        const char* values[] = {topic_.c_str(), payload.c_str(), stream_key.c_str()};
        ResultPtr result{
            PQexecParams(conn.get(), sql_.c_str(), 3, nullptr, values, nullptr, nullptr, 0)};
        ok = PQresultStatus(result.get()) == PGRES_TUPLES_OK;
        if (!ok) AddError(PQerrorMessage(conn.get()));
        keys.push_back(key);
      }
      if (!ok || random() % 5 == 0) {
        // Rolled back, or failed before COMMIT: nothing of it can commit.
        ResultPtr rolled_back{PQexec(conn.get(), "ROLLBACK")};
        Record(keys, Written::Outcome::kRolledBack, run_clock.Now());
      } else {
        const double sent = run_clock.Now();
        ResultPtr committed{PQexec(conn.get(), "COMMIT")};
        if (PQresultStatus(committed.get()) == PGRES_COMMAND_OK) {
          Record(keys, Written::Outcome::kCommitted, run_clock.Now());
        } else {
          AddError(PQerrorMessage(conn.get()));
          Record(keys, Written::Outcome::kUncertain, sent);
          conn.reset();
        }
      }
      std::this_thread::sleep_for(pause_);
    }
  }
  void AddError(const std::string& error) {
    std::lock_guard lock(mutex_);
    if (errors_.size() < 2000) errors_ += error;
  }

  std::string conninfo_;
  std::string sql_;
  std::string topic_;
  int count_;
  int streams_;
  milliseconds pause_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mutex_;
  std::map<std::string, Written> ledger_;
  std::string errors_;
  std::vector<std::thread> threads_;
};

// --- faults -------------------------------------------------------------------------------------

struct Phase {
  std::string fault;
  double begin = 0;
  double end = 0;
  int injected = 0;
};

// Sleeps `seconds`.
void Nap(double seconds) {
  std::this_thread::sleep_for(milliseconds{static_cast<std::int64_t>(seconds * 1000)});
}

class Scheduler {
 public:
  Scheduler(std::vector<std::unique_ptr<Relay>>& relays, std::uint32_t seed)
      : relays_(relays), random_(seed) {}

  // Runs phase `phase` until its end: a fault of its kind every 1-4 s on a random relay, each
  // healed before the next one.
  void Run(Phase& phase) {
    while (run_clock.Now() < phase.end) {
      Nap(Uniform(1, 4));
      if (run_clock.Now() >= phase.end) break;
      Relay& relay = *relays_[random_() % relays_.size()];
      Inject(phase, relay);
      if (phase.fault != "none") ++phase.injected;
    }
  }

 private:
  double Uniform(double low, double high) {
    return std::uniform_real_distribution<double>(low, high)(random_);
  }
  void Inject(const Phase& phase, Relay& relay) {
    const std::string& fault = phase.fault;
    if (fault == "none") {
      return;  // a baseline phase
    }
    if (fault == "kill") {
      const double down = Uniform(0.5, 3);
      Log("fault kill: SIGKILL %s (pid %d), started again in %.1f s", relay.name().c_str(),
          relay.pid(), down);
      relay.Kill();
      Nap(down);
      relay.Start();
      Log("  %s started again (pid %d)", relay.name().c_str(), relay.pid());
    } else if (fault == "stop") {
      const double frozen = Uniform(1, 8);
      Log("fault stop: SIGSTOP %s (pid %d) for %.1f s", relay.name().c_str(), relay.pid(), frozen);
      relay.Signal(SIGSTOP);
      Nap(frozen);
      relay.Signal(SIGCONT);
      Log("  SIGCONT %s", relay.name().c_str());
    } else if (fault == "cut-db" || fault == "cut-broker") {
      Log("fault %s: close every connection of %s through its %s proxy", fault.c_str(),
          relay.name().c_str(), fault == "cut-db" ? "database" : "broker");
      if (fault == "cut-db") {
        relay.db_proxy().DropAll();
      } else {
        relay.broker_link().Cut();
      }
    } else if (fault == "freeze-db" || fault == "freeze-broker") {
      const double frozen = Uniform(1, 10);
      Log("fault %s: freeze the open connections of %s for %.1f s", fault.c_str(),
          relay.name().c_str(), frozen);
      if (fault == "freeze-db") {
        relay.db_proxy().SetMode(TcpProxy::Mode::kFreeze);
        Nap(frozen);
        relay.db_proxy().SetMode(TcpProxy::Mode::kForward);
      } else {
        relay.broker_link().Freeze(true);
        Nap(frozen);
        relay.broker_link().Freeze(false);
      }
      Log("  thawed %s", relay.name().c_str());
    } else {
      throw std::runtime_error("unknown fault " + fault);
    }
  }

  std::vector<std::unique_ptr<Relay>>& relays_;
  std::mt19937 random_;
};

// --- the ledger check ---------------------------------------------------------------------------

struct Row {
  std::string fault;
  int injected = 0;
  std::int64_t committed = 0, rolled_back = 0, uncertain = 0, delivered = 0, lost = 0, phantom = 0,
               duplicates = 0, order = 0;
  double stall = 0;
  std::string stall_stream;  // where it was, from when
  double stall_from = 0;
  std::string examples;
};

std::size_t PhaseAt(const std::vector<Phase>& phases, double at) {
  for (std::size_t i = 0; i < phases.size(); ++i) {
    if (at < phases[i].end) return i;
  }
  return phases.size() - 1;
}

void Example(Row& row, const std::string& text) {
  if (std::count(row.examples.begin(), row.examples.end(), '\n') < 8) row.examples += text + "\n";
}

std::vector<Row> Check(const std::vector<Phase>& phases,
                       const std::map<std::string, Written>& ledger,
                       const std::vector<Arrival>& arrivals, double drained_at) {
  std::vector<Row> rows(phases.size());
  for (std::size_t i = 0; i < phases.size(); ++i) {
    rows[i].fault = phases[i].fault;
    rows[i].injected = phases[i].injected;
  }
  for (const auto& [key, written] : ledger) {
    Row& row = rows[PhaseAt(phases, written.at)];
    if (written.outcome == Written::Outcome::kCommitted) ++row.committed;
    if (written.outcome == Written::Outcome::kRolledBack) ++row.rolled_back;
    if (written.outcome == Written::Outcome::kUncertain) ++row.uncertain;
  }
  std::map<std::string, double> first;          // key -> first arrival
  std::map<std::string, std::int64_t> highest;  // stream -> highest counter first-delivered
  std::vector<double> deliveries;               // first arrivals of committed messages
  for (const auto& arrival : arrivals) {
    std::string key = arrival.payload;
    if (key.size() >= 2 && key.front() == '"') key = key.substr(1, key.size() - 2);
    if (first.contains(key)) {
      ++rows[PhaseAt(phases, arrival.at)].duplicates;
      continue;
    }
    first[key] = arrival.at;
    const auto written = ledger.find(key);
    if (written == ledger.end() || written->second.outcome == Written::Outcome::kRolledBack) {
      Row& row = rows[PhaseAt(phases, arrival.at)];
      ++row.phantom;
      Example(row, "phantom " + key +
                       (written == ledger.end() ? " (never written)" : " (rolled back)") + " at " +
                       std::to_string(arrival.at) + " s");
      continue;
    }
    if (written->second.outcome == Written::Outcome::kCommitted) {
      ++rows[PhaseAt(phases, written->second.at)].delivered;
      deliveries.push_back(std::max(arrival.at, written->second.at));
    }
    const auto slash = key.find('/');
    const std::string stream = key.substr(0, slash);
    const std::int64_t counter = std::stoll(key.substr(slash + 1));
    auto& high = highest[stream];
    if (counter < high) {
      Row& row = rows[PhaseAt(phases, written->second.at)];
      ++row.order;
      Example(row, "order: " + key + " first delivered at " + std::to_string(arrival.at) +
                       " s, after " + stream + "/" + std::to_string(high));
    }
    high = std::max(high, counter);
  }
  // Stalls, per stream: a sweep of its commits (+1) and first deliveries (-1) in time; a stall
  // runs from the stream's last progress (a delivery, or its pending count going from 0 to 1) to
  // its next delivery while something of it is pending. Lost messages are left out here (they
  // show as lost); a stall still open at the end runs to the end of the drain.
  std::map<std::string, std::vector<std::pair<double, int>>> events;  // stream -> (at, +1 / -1)
  for (const auto& [key, written] : ledger) {
    if (written.outcome != Written::Outcome::kCommitted) continue;
    const std::string stream = key.substr(0, key.find('/'));
    if (!first.contains(key)) {
      Row& row = rows[PhaseAt(phases, written.at)];
      ++row.lost;
      Example(row, "lost " + key + " committed at " + std::to_string(written.at) + " s");
      continue;
    }
    events[stream].emplace_back(written.at, +1);
    events[stream].emplace_back(std::max(first[key], written.at), -1);
  }
  for (auto& [stream, list] : events) {
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;  // commits first
    });
    std::int64_t pending = 0;
    double progress = 0;
    for (const auto& [at, change] : list) {
      if (change > 0) {
        if (pending++ == 0) progress = at;
        continue;
      }
      Row& row = rows[PhaseAt(phases, progress)];
      if (at - progress > row.stall) {
        row.stall = at - progress;
        row.stall_stream = stream;
        row.stall_from = progress;
      }
      progress = at;
      --pending;
    }
    if (pending > 0) {
      Row& row = rows[PhaseAt(phases, progress)];
      row.stall = std::max(row.stall, drained_at - progress);
    }
  }
  return rows;
}

void PrintTable(const std::string& sink, const std::vector<Row>& rows) {
  std::printf(
      "\n| sink | fault | faults | committed | rolled back | uncertain | delivered | lost | "
      "phantom | duplicates | order violations | longest stall |\n"
      "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  Row total;
  total.fault = "**all**";
  for (const auto& row : rows) {
    std::printf(
        "| %s | %s | %d | %lld | %lld | %lld | %lld | %lld | %lld | %lld | %lld | %.1f s |\n",
        sink.c_str(), row.fault.c_str(), row.injected, static_cast<long long>(row.committed),
        static_cast<long long>(row.rolled_back), static_cast<long long>(row.uncertain),
        static_cast<long long>(row.delivered), static_cast<long long>(row.lost),
        static_cast<long long>(row.phantom), static_cast<long long>(row.duplicates),
        static_cast<long long>(row.order), row.stall);
    total.injected += row.injected;
    total.committed += row.committed;
    total.rolled_back += row.rolled_back;
    total.uncertain += row.uncertain;
    total.delivered += row.delivered;
    total.lost += row.lost;
    total.phantom += row.phantom;
    total.duplicates += row.duplicates;
    total.order += row.order;
    total.stall = std::max(total.stall, row.stall);
  }
  std::printf("| %s | %s | %d | %lld | %lld | %lld | %lld | %lld | %lld | %lld | %lld | %.1f s |\n",
              sink.c_str(), total.fault.c_str(), total.injected,
              static_cast<long long>(total.committed), static_cast<long long>(total.rolled_back),
              static_cast<long long>(total.uncertain), static_cast<long long>(total.delivered),
              static_cast<long long>(total.lost), static_cast<long long>(total.phantom),
              static_cast<long long>(total.duplicates), static_cast<long long>(total.order),
              total.stall);
  std::printf("\nlongest stalls: ");
  for (const auto& row : rows) {
    std::printf("%s %.1f s (stream %s from %.1f s); ", row.fault.c_str(), row.stall,
                row.stall_stream.c_str(), row.stall_from);
  }
  std::printf("\n");
  for (const auto& row : rows) {
    if (!row.examples.empty()) std::printf("\n%s:\n%s", row.fault.c_str(), row.examples.c_str());
  }
  Flush();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"outbox-chaos: a ledger check of outboxd under injected faults (issue #40)"};
  std::string sink = "rabbitmq";
  double minutes = 5;
  std::string faults = "kill,stop,cut-db,freeze-db,cut-broker,freeze-broker";
  std::uint32_t seed = 0;
  int relay_count = 2, writer_count = 4, streams = 200, pause_ms = 20, drain_seconds = 120;
  app.add_option("--sink", sink, "rabbitmq, nats, redis, http or kafka (outbox-kafka-mock)")
      ->check(CLI::IsMember({"rabbitmq", "nats", "redis", "http", "kafka"}));
  app.add_option("--minutes", minutes, "length of the faulty part of the run");
  app.add_option("--faults", faults, "fault kinds, one phase each, in this order");
  app.add_option("--seed", seed, "seed of the writers and the scheduler (0: from the clock)");
  app.add_option("--relays", relay_count, "outboxd processes");
  app.add_option("--writers", writer_count, "writer connections");
  app.add_option("--streams", streams, "stream keys (a multiple of --writers)");
  app.add_option("--pause-ms", pause_ms, "each writer's pause between transactions");
  app.add_option("--drain-seconds", drain_seconds, "bound on the drain after the faults stop");
  CLI11_PARSE(app, argc, argv);
  if (seed == 0) seed = static_cast<std::uint32_t>(std::random_device{}());

  std::vector<Phase> phases;
  {
    std::stringstream list(faults);
    for (std::string fault; std::getline(list, fault, ',');) phases.push_back({fault});
  }
  if (phases.empty()) {
    std::fprintf(stderr, "no faults\n");
    return 2;
  }
  const double phase_seconds = minutes * 60 / static_cast<double>(phases.size());

  Env env;
  env.pg_url = EnvOr("OUTBOX_TEST_PG_URL", outbox::testing::PgUrl());
  env.database = "outbox_bench";
  env.outboxd = OUTBOXD_PATH;
  OpenEnv(env);
  Schema schema(env);
  const std::string name = "outbox-chaos-" + std::to_string(getpid());
  std::unique_ptr<Destination> destination;
  if (sink == "rabbitmq") destination = std::make_unique<RabbitDestination>(name);
  if (sink == "nats") {
    destination = std::make_unique<NatsDestination>(
        EnvOr("OUTBOX_TEST_NATS_URL", "nats://127.0.0.1:4222"), name);
  }
  if (sink == "redis") {
    destination = std::make_unique<RedisDestination>(
        EnvOr("OUTBOX_TEST_REDIS_URL", "redis://127.0.0.1:6379"), name);
  }
  if (sink == "http") destination = std::make_unique<HttpDestination>(name);
  if (sink == "kafka") destination = std::make_unique<KafkaDestination>(KAFKA_MOCK_PATH, name);

  const auto [pg_host, pg_port] = HostPort(env.pg_url, 5432);
  std::printf(
      "outbox-chaos: sink %s, %.1f min of faults (%s, %.0f s each), seed %u; %d relays "
      "(batch 100, lease 3 s, sweep 200 ms, publish_timeout 1.4 s, statement_deadline 2 s), "
      "each through its own proxies to PostgreSQL (%s:%d) and the broker; %d writers, %d "
      "streams, 1-5 messages a transaction, 20 %% rolled back, %d ms between transactions; "
      "schema %s; files in %s\n",
      sink.c_str(), minutes, faults.c_str(), phase_seconds, seed, relay_count, pg_host.c_str(),
      pg_port, writer_count, streams, pause_ms, schema.name().c_str(), env.dir.c_str());
  Flush();

  std::vector<std::unique_ptr<Relay>> relays;
  for (int i = 0; i < relay_count; ++i) {
    relays.push_back(
        std::make_unique<Relay>(i, env, schema.name(), *destination, pg_host, pg_port));
    relays.back()->Start();
  }
  Writers writers(env.bench_url, schema.name(), destination->Topic(), writer_count, streams,
                  milliseconds{pause_ms}, seed);
  Scheduler scheduler(relays, seed ^ 0x5eedU);
  for (auto& phase : phases) {
    phase.begin = run_clock.Now();
    phase.end = phase.begin + phase_seconds;
    Log("phase %s begins (%.0f s)", phase.fault.c_str(), phase_seconds);
    scheduler.Run(phase);
  }
  phases.back().end = 1e18;  // what comes after the last phase is its
  writers.Stop();
  const double stopped = run_clock.Now();
  const auto ledger = writers.ledger();
  std::int64_t committed = 0;
  std::set<std::string> expected;
  for (const auto& [key, written] : ledger) {
    if (written.outcome == Written::Outcome::kCommitted) expected.insert(key);
  }
  committed = static_cast<std::int64_t>(expected.size());
  Log("writers stopped: %lld committed; draining (at most %d s)", static_cast<long long>(committed),
      drain_seconds);
  double drained_at = stopped;
  for (std::size_t checked = 0; run_clock.Now() < stopped + drain_seconds;) {
    const auto arrivals = destination->arrivals.Take();
    for (; checked < arrivals.size(); ++checked) {
      std::string key = arrivals[checked].payload;
      if (key.size() >= 2 && key.front() == '"') key = key.substr(1, key.size() - 2);
      expected.erase(key);
    }
    drained_at = run_clock.Now();
    if (expected.empty()) break;
    std::this_thread::sleep_for(milliseconds{200});
  }
  Log("drain: %zu committed messages undelivered", expected.size());
  Nap(2);  // late duplicates
  int exit_codes_bad = 0;
  for (auto& relay : relays) {
    const int code = relay->Stop();
    Log("%s stopped: exit %d", relay->name().c_str(), code);
    if (code != 0) ++exit_codes_bad;
  }
  // A connection of its own for the end: the monitor's may have died since the start (the
  // shared server, restarted by someone else's test, did that once).
  env.monitor = Connect(env.bench_url);
  const std::string left =
      Scalar(env.monitor.get(),
             "SELECT count(*) || ' rows left (' || count(*) FILTER (WHERE status = "
             "'abandoned') || ' abandoned, ' || count(*) FILTER (WHERE status = "
             "'failed') || ' failed)' FROM " +
                 schema.messages());
  Log("outbox table: %s", left.c_str());
  const auto arrivals = destination->arrivals.Take();
  {
    // The raw ledger, for a failure's post-mortem: kept (with the relays' logs) when it fails.
    std::ofstream out(env.dir / "ledger.txt");
    for (const auto& [key, written] : ledger) {
      out << key << " " << written.at << " "
          << (written.outcome == Written::Outcome::kCommitted    ? "committed"
              : written.outcome == Written::Outcome::kRolledBack ? "rolled-back"
                                                                 : "uncertain")
          << "\n";
    }
    std::ofstream received(env.dir / "arrivals.txt");
    for (const auto& arrival : arrivals) received << arrival.at << " " << arrival.payload << "\n";
  }
  const auto rows = Check(phases, ledger, arrivals, drained_at);
  PrintTable(sink, rows);
  if (!writers.errors().empty()) std::printf("\nwriter errors:\n%s", writers.errors().c_str());
  bool failed = false;
  for (const auto& row : rows) failed = failed || row.lost > 0 || row.phantom > 0 || row.order > 0;
  std::printf("\nresult: %s (seed %u)\n",
              failed ? "FAILED: lost, phantom or out-of-order messages" : "ok", seed);
  Flush();
  destination.reset();
  std::error_code ignored;
  if (!failed) std::filesystem::remove_all(env.dir, ignored);
  return failed ? 1 : 0;
}
