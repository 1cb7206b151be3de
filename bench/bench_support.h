#pragma once
// What outbox-bench's workloads share: the benchmark's own PostgreSQL database and schemas, the
// pending messages they start from, outboxd as a child process, number formatting, and the
// store's own claim+complete rate (the floor under every drain, whatever the broker).

#include <libpq-fe.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "outbox/relay/relay_config.h"  // the linger defaults it prints
#include "outbox/store/postgres.h"
#include "outbox/store/postgres_libpq.h"  // the store's RAII over libpq
#include "support/child_process.h"
#include "support/free_port.h"
#include "support/pg_test_support.h"

namespace outbox::bench {

using Clock = std::chrono::steady_clock;
using outbox::postgres::ConnPtr;
using outbox::postgres::ResultPtr;

inline constexpr std::string_view kTag = "/*bench*/ ";  // marks the benchmark's own statements

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
inline std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// 1234567.8 -> "1,234,568".
inline std::string Thousands(double value) {
  std::string digits = std::to_string(std::llround(value));
  const bool negative = !digits.empty() && digits[0] == '-';
  if (negative) digits.erase(0, 1);
  for (int at = static_cast<int>(digits.size()) - 3; at > 0; at -= 3) {
    digits.insert(static_cast<std::size_t>(at), ",");
  }
  return negative ? "-" + digits : digits;
}

inline std::string Mib(double kib) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", kib / 1024.0);
  return text;
}

inline void Flush() { std::fflush(stdout); }

// The environment variable `name`, or `fallback` when it is unset or empty.
inline std::string EnvOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : fallback;
}

// --- PostgreSQL -------------------------------------------------------------------------------

using outbox::testing::Connect;
using outbox::testing::FreePort;
using outbox::testing::Sql;

// A tagged statement of the benchmark's own: left out of the relay's statement counts.
inline ResultPtr Own(PGconn* conn, const std::string& sql) {
  return Sql(conn, std::string{kTag} + sql);
}

inline std::string Scalar(PGconn* conn, const std::string& sql) {
  const auto result = Own(conn, sql);
  return PQntuples(result.get()) > 0 ? PQgetvalue(result.get(), 0, 0) : "";
}

// `url` (URI or key=value) with its dbname replaced, as a key=value string.
inline std::string WithDatabase(const std::string& url, const std::string& database) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(url.c_str(), &error);
  if (options == nullptr) {
    const std::string message = error != nullptr ? error : "out of memory";
    PQfreemem(error);
    throw std::runtime_error("bad PostgreSQL URL: " + message);
  }
  std::string out;
  const auto quote = [](const std::string& value) {
    std::string quoted = "'";
    for (const char c : value) {
      if (c == '\'' || c == '\\') quoted += '\\';
      quoted += c;
    }
    return quoted + "'";
  };
  for (PQconninfoOption* option = options; option->keyword != nullptr; ++option) {
    const std::string key = option->keyword;
    if (key == "dbname" || option->val == nullptr || option->val[0] == '\0') continue;
    out += key + "=" + quote(option->val) + " ";
  }
  PQconninfoFree(options);
  return out + "dbname=" + quote(database);
}

// The servers and where this run keeps its files.
struct Env {
  std::string pg_url;     // as given (the tests' database)
  std::string bench_url;  // the benchmark's own database
  std::string database;
  std::string amqp_url;
  std::string outboxd;
  std::filesystem::path dir;
  ConnPtr monitor;  // on the benchmark's database: counters, sizes; every statement tagged
  bool statements_available = false;

  std::string NewName(const std::string& what) {
    static int counter = 0;
    return "bench_" + what + "_" + std::to_string(getpid()) + "_" + std::to_string(++counter);
  }
};

inline void OpenEnv(Env& env) {
  {
    auto admin = Connect(env.pg_url);
    const auto exists =
        Sql(admin.get(), "SELECT 1 FROM pg_database WHERE datname = '" + env.database + "'");
    if (PQntuples(exists.get()) == 0) Sql(admin.get(), "CREATE DATABASE " + env.database);
  }
  env.bench_url = WithDatabase(env.pg_url, env.database);
  env.monitor = Connect(env.bench_url);
  ResultPtr created{PQexec(env.monitor.get(), "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")};
  ResultPtr probe{PQexec(env.monitor.get(), "SELECT count(*) FROM pg_stat_statements")};
  env.statements_available = PQresultStatus(probe.get()) == PGRES_TUPLES_OK;
  env.dir = std::filesystem::temp_directory_path() / ("outbox-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(env.dir);
}

// Statements the relay sent the benchmark's database since the last Reset().
class StatementCounter {
 public:
  explicit StatementCounter(Env& env) : env_(env) {}
  bool available() const { return env_.statements_available; }
  void Reset() {
    if (available()) Own(env_.monitor.get(), "SELECT pg_stat_statements_reset()");
  }
  double Total() {
    return available() ? std::atof(Scalar(env_.monitor.get(), Query("sum")).c_str()) : 0;
  }
  // The statements behind Total(), most called first.
  std::vector<std::pair<std::string, double>> Top(int limit) {
    std::vector<std::pair<std::string, double>> top;
    if (!available()) return top;
    const auto result = Own(env_.monitor.get(), Query("top") + " LIMIT " + std::to_string(limit));
    for (int row = 0; row < PQntuples(result.get()); ++row) {
      top.emplace_back(PQgetvalue(result.get(), row, 1),
                       std::atof(PQgetvalue(result.get(), row, 0)));
    }
    return top;
  }

 private:
  static std::string Query(const std::string& what) {
    const std::string from =
        " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = "
        "current_database()) AND query NOT LIKE '/*bench*/%' AND query NOT LIKE '%enqueue%' AND "
        "query NOT IN ('BEGIN', 'COMMIT', 'ROLLBACK')";
    if (what == "sum") return "SELECT coalesce(sum(calls), 0)" + from;
    return "SELECT calls, regexp_replace(left(query, 90), '\\s+', ' ', 'g')" + from +
           " ORDER BY calls DESC";
  }
  Env& env_;
};

// A migrated schema of its own, dropped when this object dies.
class Schema {
 public:
  explicit Schema(Env& env) : env_(env), name_(env.NewName("s")) {
    outbox::postgres::Migrate(env_.monitor.get(), name_);
  }
  ~Schema() {
    ResultPtr dropped{
        PQexec(env_.monitor.get(),
               (std::string{kTag} + "DROP SCHEMA IF EXISTS " + name_ + " CASCADE").c_str())};
  }
  Schema(const Schema&) = delete;
  Schema& operator=(const Schema&) = delete;
  const std::string& name() const { return name_; }
  std::string messages() const { return name_ + ".messages"; }

 private:
  Env& env_;
  std::string name_;
};

// The schema's slot for as long as this object lives (a slot left behind keeps WAL forever).
class WalSlot {
 public:
  WalSlot(Env& env, const std::string& schema) : env_(env), schema_(schema) {
    outbox::postgres::EnsureWalSlot(env_.monitor.get(), schema_);
    Own(env_.monitor.get(), "UPDATE " + schema_ + ".settings SET delivery = 'wal'");
  }
  ~WalSlot() {
    try {
      outbox::postgres::DropWalSlot(env_.monitor.get(), schema_);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "dropping the WAL slot of %s failed: %s\n", schema_.c_str(),
                   error.what());
    }
  }
  WalSlot(const WalSlot&) = delete;
  WalSlot& operator=(const WalSlot&) = delete;

 private:
  Env& env_;
  std::string schema_;
};

// A payload of exactly `size` bytes (at least 14) that is a JSON string and starts with the
// message's sequence number, so that the consumer can tell which message it received.
inline std::string Payload(std::int64_t seq, std::size_t size) {
  char digits[24];
  std::snprintf(digits, sizeof digits, "%012lld", static_cast<long long>(seq));
  std::string payload = "\"";
  payload += digits;
  payload.append(size - 14, 'x');
  payload += '"';
  return payload;
}

// Inserts messages first..first+count-1 as writers would have left them: pending, over `streams`
// streams with their stream_seq, each stream in one partition. One statement, then VACUUM ANALYZE;
// with `analyze` false neither that nor autovacuum (turned off for the table): the table is as a
// burst leaves a just-created one, with no statistics.
inline void Preinsert(Env& env, const Schema& schema, const std::string& topic, std::int64_t first,
                      std::int64_t count, std::size_t payload, int streams, bool analyze = true) {
  if (!analyze) {
    Own(env.monitor.get(),
        "ALTER TABLE " + schema.messages() + " SET (autovacuum_enabled = false)");
  }
  const std::string s = schema.name();
  const std::string g = "g";
  Own(env.monitor.get(),
      "INSERT INTO " + schema.messages() +
          " (id, topic, stream_key, stream_seq, partition, target, payload, content_type) SELECT " +
          s + ".uuid_v7(), '" + topic + "', 's' || (g % " + std::to_string(streams) + "), g / " +
          std::to_string(streams) + " + 1, (g % " + std::to_string(streams) +
          ") % 64, 'default', convert_to('\"' || lpad(g::text, 12, '0') || repeat('x', " +
          std::to_string(payload - 14) + ") || '\"', 'UTF8'), 'application/json' FROM " +
          "generate_series(" + std::to_string(first) + ", " + std::to_string(first + count - 1) +
          ") g");
  if (analyze) Own(env.monitor.get(), "VACUUM ANALYZE " + schema.messages());
}

inline std::string TableSize(Env& env, const Schema& schema) {
  return Scalar(env.monitor.get(),
                "SELECT pg_size_pretty(pg_total_relation_size('" + schema.messages() + "'))");
}

// --- outboxd as a child process ---------------------------------------------------------------

// What /proc says of a process.
struct ProcSample {
  double cpu_seconds = 0;  // user + system, all threads
  double hwm_kib = 0;      // VmHWM: peak resident set
  double rss_kib = 0;
};

inline ProcSample SampleProcess(pid_t pid) {
  ProcSample sample;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto close_paren = line.rfind(')');
  if (close_paren != std::string::npos) {
    std::istringstream fields(line.substr(close_paren + 2));
    std::string field;
    double utime = 0, stime = 0;
    for (int i = 3; fields >> field; ++i) {  // field 3 is the state
      if (i == 14) utime = std::atof(field.c_str());
      if (i == 15) {
        stime = std::atof(field.c_str());
        break;
      }
    }
    sample.cpu_seconds = (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) sample.hwm_kib = std::atof(line.c_str() + 6);
    if (line.rfind("VmRSS:", 0) == 0) sample.rss_kib = std::atof(line.c_str() + 6);
  }
  return sample;
}

// Writes outboxd's config: its defaults (batch 500, confirm window 1000, sweep 1 s, lease 30 s,
// HTTP listener with stats every 5 s, published messages deleted at once) plus the servers. `sink`
// is the body of [sinks.default] (default: RabbitMQ, routing key = topic); `relay`, lines added to
// [relay].
inline std::string WriteConfig(Env& env, const std::string& schema, const std::string& sink,
                               const std::string& relay, int http_port,
                               const std::string& database = {}) {
  const auto path = env.dir / (schema + ".toml");
  std::ofstream out(path);
  out << "[database]\nurl = \"" << env.bench_url << "\"\nschema = \"" << schema << "\"\n"
      << database << "\n[relay]\ninstance = \"bench\"\n"
      << relay << "\n[log]\nlevel = \"warn\"\n\n[http]\nlisten = \"127.0.0.1:" << http_port
      << "\"\n\n[sinks.default]\n"
      << (sink.empty()
              ? "type = \"rabbitmq\"\nurl = \"" + env.amqp_url + "\"\nrouting_key = \"{topic}\"\n"
              : sink);
  return path.string();
}

class Outboxd {
 public:
  // `database`: lines added to its [database] table (e.g. mode = "wal").
  Outboxd(Env& env, const std::string& schema, const std::string& sink = {},
          const std::string& relay = {}, const std::string& database = {})
      : http_port_(FreePort()),
        config_(WriteConfig(env, schema, sink, relay, http_port_, database)),
        process_({env.outboxd, "--config", config_}, config_ + ".log",
                 outbox::testing::Ready::Notify()) {}
  ProcSample Sample() const { return SampleProcess(process_.pid()); }
  // Its HTTP listener (/metrics) on 127.0.0.1.
  [[nodiscard]] int http_port() const { return http_port_; }
  // SIGTERM; throws if it does not exit cleanly.
  void Stop() {
    const int code = process_.Stop();
    if (code != 0) {
      throw std::runtime_error("outboxd exited with " + std::to_string(code) + "; log: " + config_ +
                               ".log");
    }
  }

 private:
  int http_port_;
  std::string config_;
  outbox::testing::ChildProcess process_;
};

// Where the machine's CPU went over an interval: busy time of every core (/proc/stat) and the
// CPU time of the processes that share it, by command name (/proc/<pid>/stat), so that a rate can
// be read against what else ran. A process that exited during the interval is missing from it.
class CpuUse {
 public:
  CpuUse() : start_(Take()) {}

  // "busy 187 % of 200 %: postgres 62 %, beam.smp 81 %, ..." since construction.
  [[nodiscard]] std::string Describe() const {
    const Snapshot end = Take();
    const double wall = end.total - start_.total;  // jiffies, all cores
    const double cores = static_cast<double>(std::thread::hardware_concurrency());
    if (wall <= 0 || cores <= 0) return "not measured";
    const double scale = 100.0 * cores / wall;  // jiffies -> % of one core
    char text[96];
    std::snprintf(text, sizeof text, "busy %.0f %% of %.0f %%", (end.busy - start_.busy) * scale,
                  100.0 * cores);
    std::string line = text;
    const char* separator = ":";
    for (const auto& [name, ticks] : end.by_command) {
      const auto before = start_.by_command.find(name);
      const double used = ticks - (before == start_.by_command.end() ? 0.0 : before->second);
      if (used * scale < 1.0) continue;
      std::snprintf(text, sizeof text, "%s %s %.0f %%", separator, name.c_str(), used * scale);
      line += text;
      separator = ",";
    }
    return line;
  }

 private:
  struct Snapshot {
    double busy = 0;                           // jiffies, all cores
    double total = 0;                          // busy + idle + iowait
    std::map<std::string, double> by_command;  // utime + stime jiffies
  };

  static Snapshot Take() {
    Snapshot snapshot;
    std::ifstream stat("/proc/stat");
    std::string cpu;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    snapshot.busy = user + nice + system + irq + softirq + steal;
    snapshot.total = snapshot.busy + idle + iowait;
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string pid = entry.path().filename();
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream process(entry.path() / "stat");
      std::string line;
      if (!std::getline(process, line)) continue;
      const auto open = line.find('(');
      const auto close = line.rfind(')');
      if (open == std::string::npos || close == std::string::npos) continue;
      std::string name = line.substr(open + 1, close - open - 1);
      if (name != "postgres" && name != "beam.smp" && name != "outboxd" && name != "outbox-bench" &&
          name != "nats-server" && name != "redis-server") {
        continue;
      }
      std::istringstream fields(line.substr(close + 2));
      std::string field;
      double ticks = 0;
      for (int i = 3; fields >> field && i <= 15; ++i) {  // field 3 is the state
        if (i == 14 || i == 15) ticks += std::atof(field.c_str());
      }
      snapshot.by_command[name] += ticks;
    }
    return snapshot;
  }

  Snapshot start_;
};

inline void PrintRelayConditions(const Env& env) {
  std::printf(
      "relay: %s as a child process, its defaults: batch_size 500, confirm_window 1000, "
      "sweep_interval 10s, linger %lldms (WAL mode %lldms), lease 30s, HTTP listener on (stats "
      "every 5s), retention.published 0s (a confirmed message is deleted)\n",
      env.outboxd.c_str(), static_cast<long long>(outbox::kTableLinger.count()),
      static_cast<long long>(outbox::kWalLinger.count()));
}

// The relay's own store calls without a broker: Claim (lease) then Complete (delete).
inline double StoreClaimComplete(Env& env, std::int64_t count, std::size_t payload, int batch) {
  Schema schema(env);
  Preinsert(env, schema, "store", 0, count, payload, 1000);
  auto store = outbox::postgres::OpenStore({.conninfo = env.bench_url, .schema = schema.name()});
  std::int64_t done = 0;
  const auto start = Clock::now();
  for (;;) {
    const auto claimed = store->Claim({.owner = "bench", .max_messages = batch});
    if (claimed.empty()) break;
    std::vector<outbox::LeasedId> leases;
    leases.reserve(claimed.size());
    for (const auto& envelope : claimed) leases.push_back(outbox::LeasedId::Of(envelope));
    done += static_cast<std::int64_t>(store->Complete("bench", leases).settled);
  }
  const double seconds = Seconds(Clock::now() - start);
  if (done != count) throw std::runtime_error("store claim+complete took " + std::to_string(done));
  return static_cast<double>(count) / seconds;
}

// How many messages a destination holds, read by a thread every ~2 ms (`count` is called only
// there): the arrival rate from the first reading above 0 to the first at `target`, as the Kafka
// drain's TopicFill measures it. `count` returns -1 when it cannot read; the watcher keeps trying.
class ArrivalWatcher {
 public:
  ArrivalWatcher(std::function<std::int64_t()> count, std::int64_t target)
      : count_(std::move(count)), target_(target), thread_([this] { Run(); }) {}
  ~ArrivalWatcher() {
    stop_ = true;
    thread_.join();
  }
  ArrivalWatcher(const ArrivalWatcher&) = delete;
  ArrivalWatcher& operator=(const ArrivalWatcher&) = delete;

  // Waits until `target` messages are there; false after `limit`.
  bool Wait(std::chrono::seconds limit) {
    const auto until = Clock::now() + limit;
    while (!done_ && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds{5});
    return done_;
  }
  [[nodiscard]] double Rate() const {
    const double seconds = Seconds(done_at_ - first_at_);
    return seconds > 0 ? static_cast<double>(target_ - first_count_) / seconds : 0;
  }
  [[nodiscard]] Clock::time_point done_at() const { return done_at_; }
  // The last reading: what the destination holds (more than the target means duplicates).
  [[nodiscard]] std::int64_t last() const { return last_; }

 private:
  void Run() {
    while (!stop_) {
      const std::int64_t now = count_();
      if (now >= 0) {
        last_ = now;
        if (now > 0 && first_count_ < 0) {
          first_count_ = now;
          first_at_ = Clock::now();
        }
        if (now >= target_ && !done_) {
          done_at_ = Clock::now();
          done_ = true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds{2});
    }
  }

  std::function<std::int64_t()> count_;
  std::int64_t target_;
  std::int64_t first_count_ = -1;
  Clock::time_point first_at_{};
  Clock::time_point done_at_{};
  std::atomic<std::int64_t> last_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Waits (at most 60 s) until `schema`'s outbox table is empty: every message confirmed and
// deleted. Returns the seconds since `start`; throws, naming `what`, when it is not.
inline double WaitForEmptyOutbox(Env& env, const Schema& schema, Clock::time_point start,
                                 const std::string& what) {
  for (int i = 0; i < 6000; ++i) {
    if (Scalar(env.monitor.get(), "SELECT count(*) FROM " + schema.messages()) == "0") {
      return Seconds(Clock::now() - start);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds{10});
  }
  throw std::runtime_error(what + ": the outbox table was not empty 60 s after N arrived");
}

// What every drain into a broker or endpoint measures of outboxd.
struct OutboxdDrain {
  double rate = 0;     // as the watcher measures it
  double filled = 0;   // outboxd start -> N at the destination
  double emptied = 0;  // outboxd start -> the outbox table empty (every message confirmed)
  ProcSample process;
  double statements = 0;
};

// Starts outboxd on `schema` with the [sinks.default] table `sink` and `batch_size`, waits (at
// most 30 min) until `watcher` (ArrivalWatcher, TopicFill: Wait, Rate, done_at) has seen every
// message and the table is empty, samples outboxd and stops it. `what` names the drain in errors.
template <typename Watcher>
OutboxdDrain RunOutboxdDrain(Env& env, const Schema& schema, const std::string& sink,
                             int batch_size, Watcher& watcher, const std::string& what) {
  StatementCounter statements(env);
  statements.Reset();
  const auto start = Clock::now();
  Outboxd relay(env, schema.name(), sink, "batch_size = " + std::to_string(batch_size) + "\n");
  if (!watcher.Wait(std::chrono::seconds{1800})) {
    throw std::runtime_error(what + " did not finish in 30 min");
  }
  OutboxdDrain drain;
  drain.rate = watcher.Rate();
  drain.filled = Seconds(watcher.done_at() - start);
  drain.emptied = WaitForEmptyOutbox(env, schema, start, what);
  drain.process = relay.Sample();
  drain.statements = statements.Total();
  relay.Stop();
  return drain;
}

// MemAvailable from /proc/meminfo, in KiB.
inline double AvailableKib() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  double available_kib = 0;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemAvailable:", 0) == 0) available_kib = std::atof(line.c_str() + 13);
  }
  return available_kib;
}

// What the broker drains (NATS, Redis) share: the server, outboxd's batch and the client window.
struct BrokerDrainOptions {
  std::string url;       // the server (--nats / --redis)
  int batch_size = 500;  // outboxd's relay.batch_size
  int window = 0;        // acks (NATS) or replies (Redis) outstanding; 0: the sink's default
  int repeat = 1;        // rounds of each case
};

}  // namespace outbox::bench
