// outbox-mariadb-bench: the MariaDB store (issue #45) measured the way outbox-bench measures
// PostgreSQL, so that the two can be read side by side (bench/RESULTS.md):
//   enqueue  writers alone, one transaction per message (START TRANSACTION; Writer::Enqueue;
//            COMMIT), the cases of `outbox-bench enqueue` that apply
//   drain    a burst: N messages written first, then the real outboxd publishes them to RabbitMQ;
//            next to it the store's own claim+complete with no broker
//   idle     an idle outboxd: statements/s it sends (MariaDB's per-user statistics, the relay
//            logging in as a user of its own), then commit -> consumer latency one message at a
//            time, 10 ms apart (the poll just after work) and 500 ms apart (the poll backed off)
// Servers from scripts/services (OUTBOX_TEST_MARIADB_URL, OUTBOX_TEST_AMQP_URL).

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "connection.h"
#include "outbox/store/mariadb.h"
#include "support/amqp_test_client.h"
#include "support/child_process.h"
#include "support/free_port.h"

namespace {

using Clock = std::chrono::steady_clock;
using outbox::mariadb::Connection;
using outbox::mariadb::Value;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : fallback;
}

struct Env {
  std::string url;       // the benchmark's own connections (the test user)
  std::string amqp_url;  // where outboxd publishes
  std::string outboxd;
  std::filesystem::path dir;
};

std::string Payload(std::int64_t seq, std::size_t size) {
  std::string payload = "{\"seq\":" + std::to_string(seq) + ",\"pad\":\"";
  while (payload.size() + 2 < size) payload += 'x';
  return payload + "\"}";
}

std::int64_t SeqOf(const std::string& body) {
  const auto at = body.find("\"seq\":");
  return at == std::string::npos ? -1 : std::atoll(body.c_str() + at + 6);
}

// A database of the benchmark's own, migrated; dropped afterwards.
class Schema {
 public:
  explicit Schema(const Env& env) : conn_(env.url, std::chrono::milliseconds{0}) {
    std::random_device device;
    name_ = "bench_" + std::to_string(device() % 1000000);
    outbox::mariadb::Migrate(conn_.Ready(), name_);
  }
  ~Schema() {
    try {
      conn_.Execute("drop", "DROP DATABASE IF EXISTS " + name_);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "dropping %s failed: %s\n", name_.c_str(), error.what());
    }
  }
  Schema(const Schema&) = delete;
  Schema& operator=(const Schema&) = delete;
  [[nodiscard]] const std::string& name() const { return name_; }
  Connection& conn() { return conn_; }

  std::int64_t Count(const std::string& where = "") {
    return outbox::mariadb::ToInt64(
        conn_.Run("count", "SELECT COUNT(*) FROM " + name_ + ".messages " + where)
            .sets.at(0)
            .rows.at(0)
            .at(0),
        "count");
  }

 private:
  Connection conn_;
  std::string name_;
};

// `count` messages over `streams` streams written by `writers` connections, `per_transaction`
// per transaction; returns messages per second.
double Write(const Env& env, const std::string& schema, std::int64_t count, int writers,
             int per_transaction, int streams, std::size_t payload, const std::string& topic,
             bool sequenced = true, int targets = 0) {
  std::atomic<std::int64_t> next{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int w = 0; w < writers; ++w) {
    threads.emplace_back([&] {
      try {
        Connection conn{env.url, std::chrono::milliseconds{0}};
        const outbox::mariadb::Writer writer{schema};
        std::vector<outbox::NewMessage> batch;
        while (true) {
          const std::int64_t first = next.fetch_add(per_transaction);
          if (first >= count) break;
          const std::int64_t last = std::min<std::int64_t>(count, first + per_transaction);
          batch.clear();
          for (std::int64_t i = first; i < last; ++i) {
            outbox::NewMessage message{.topic = topic, .payload = Payload(i, payload)};
            if (streams > 0) message.stream_key = "s" + std::to_string(i % streams);
            message.sequenced = sequenced;
            for (int t = 0; t < targets; ++t) message.targets.push_back("t" + std::to_string(t));
            batch.push_back(std::move(message));
          }
          for (int attempt = 0;; ++attempt) {
            try {
              conn.Execute("begin", "START TRANSACTION");
              writer.Enqueue(conn.Ready(), batch);
              conn.Execute("commit", "COMMIT", true);
              break;
            } catch (const outbox::StoreError& error) {
              // A deadlock (two batches taking the same streams in opposite orders): again.
              if (attempt >= 10 || error.kind() != outbox::FailureKind::kUnavailable) throw;
              try {
                conn.Execute("rollback", "ROLLBACK");
              } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): reconnects
              }
            }
          }
        }
      } catch (const std::exception& error) {
        std::fprintf(stderr, "writer failed: %s\n", error.what());
        failed = true;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  if (failed) throw std::runtime_error("a writer failed");
  return static_cast<double>(count) / Seconds(Clock::now() - start);
}

void PrintConditions(const Env& env) {
  Connection conn{env.url, std::chrono::milliseconds{0}};
  const auto row = conn.Run("conditions",
                            "SELECT VERSION(), @@innodb_flush_log_at_trx_commit, "
                            "@@innodb_buffer_pool_size DIV 1048576, @@log_bin, @@innodb_doublewrite")
                       .sets.at(0)
                       .rows.at(0);
  std::ifstream loadavg("/proc/loadavg");
  std::string one, five, fifteen;
  loadavg >> one >> five >> fifteen;
  std::printf(
      "conditions: %u cores shared by MariaDB, RabbitMQ, outboxd and this benchmark; MariaDB "
      "%s, innodb_flush_log_at_trx_commit=%s, doublewrite %s, buffer pool %s MiB, binary log %s; load "
      "average %s %s %s\n",
      std::thread::hardware_concurrency(), row[0].value_or("?").c_str(),
      row[1].value_or("?").c_str(), row[4].value_or("0") == "1" ? "on" : "off",
      row[2].value_or("?").c_str(),
      row[3].value_or("0") == "1" ? "on" : "off", one.c_str(), five.c_str(), fifteen.c_str());
  std::fflush(stdout);
}

void Enqueue(const Env& env, std::int64_t messages, std::size_t payload) {
  std::printf(
      "== enqueue: writers alone, one transaction per message (START TRANSACTION; "
      "Writer::Enqueue; COMMIT), %zu B payloads, %lld messages per case\n\n| case | msgs/s |\n"
      "|---|---|\n",
      payload, static_cast<long long>(messages));
  struct Case {
    const char* name;
    int writers;
    int streams;
    bool sequenced;
    int targets = 0;
    int per_transaction = 1;
  };
  const Case cases[] = {
      {"1 writer, unkeyed", 1, 0, false},
      {"8 writers, unkeyed", 8, 0, false},
      {"8 writers, 500 streams, unsequenced", 8, 500, false},
      {"8 writers, 500 streams, stream_seq", 8, 500, true},
      {"8 writers, 1 stream, stream_seq", 8, 1, true},
      {"8 writers, 500 streams, stream_seq, 2 targets (msgs/s counts events)", 8, 500, true, 2},
      {"32 writers, 500 streams, stream_seq", 32, 500, true},
      {"8 writers, 500 streams, stream_seq, 100 per transaction", 8, 500, true, 0, 100},
  };
  for (const auto& c : cases) {
    Schema schema(env);
    const std::int64_t count = c.per_transaction > 1 ? messages * 5 : messages;
    const double rate = Write(env, schema.name(), count, c.writers, c.per_transaction, c.streams,
                              payload, "bench", c.sequenced, c.targets);
    std::printf("| %s | %.0f |\n", c.name, rate);
    std::fflush(stdout);
  }
  std::printf("\n");
}

std::string WriteConfig(const Env& env, const std::string& schema, const std::string& url,
                        const std::string& relay, int http_port) {
  const auto path = env.dir / (schema + ".toml");
  std::ofstream out(path);
  out << "[database]\ntype = \"mariadb\"\nurl = \"" << url << "\"\nschema = \"" << schema
      << "\"\n\n[relay]\ninstance = \"bench\"\n"
      << relay << "\n[log]\nlevel = \"warn\"\n\n[http]\nlisten = \"127.0.0.1:" << http_port
      << "\"\n\n[sinks.default]\ntype = \"rabbitmq\"\nurl = \"" << env.amqp_url
      << "\"\nrouting_key = \"{topic}\"\n";
  return path.string();
}

// The store alone: Claim(500) then Complete, until the outbox is empty.
double StoreClaimComplete(const Env& env, std::int64_t count, std::size_t payload, int streams) {
  Schema schema(env);
  Write(env, schema.name(), count, 4, 1000, streams, payload, "store");
  auto store = outbox::mariadb::OpenStore({.url = env.url, .schema = schema.name()});
  std::int64_t done = 0;
  const auto start = Clock::now();
  for (;;) {
    const auto claimed = store->Claim({.owner = "bench", .max_messages = 500});
    if (claimed.empty()) break;
    std::vector<outbox::LeasedId> leases;
    leases.reserve(claimed.size());
    for (const auto& envelope : claimed) leases.push_back(outbox::LeasedId::Of(envelope));
    done += store->Complete("bench", leases).settled;
  }
  const double seconds = Seconds(Clock::now() - start);
  if (done != count) throw std::runtime_error("store claim+complete took " + std::to_string(done));
  return static_cast<double>(count) / seconds;
}

void Drain(const Env& env, const std::vector<std::int64_t>& counts, std::size_t payload,
           int streams) {
  std::printf(
      "== drain: N messages over %d streams written first (4 writers, 1,000 per transaction), "
      "then outboxd (batch_size 500, defaults) publishes them to RabbitMQ; %zu B payloads\n\n"
      "| messages | store claim+complete alone | outboxd drain | drain / store |\n"
      "|---|---|---|---|\n",
      streams, payload);
  for (const std::int64_t count : counts) {
    const double store = StoreClaimComplete(env, count, payload, streams);
    Schema schema(env);
    const std::string queue = "mariadb_bench_" + schema.name();
    outbox::testing::DeclareQueue(queue);
    Write(env, schema.name(), count, 4, 1000, streams, payload, queue);
    const auto config =
        WriteConfig(env, schema.name(), env.url, "batch_size = 500\n", outbox::testing::FreePort());
    const auto start = Clock::now();
    outbox::testing::ChildProcess relay({env.outboxd, "--config", config}, config + ".log",
                                        outbox::testing::Ready::Notify());
    std::optional<Clock::time_point> first;
    std::int64_t ready = 0;
    while (Seconds(Clock::now() - start) < 1800) {
      ready = outbox::testing::ReadyMessages(queue).value_or(0);
      if (ready > 0 && !first) first = Clock::now();
      if (ready >= count) break;
      std::this_thread::sleep_for(std::chrono::milliseconds{2});
    }
    const double seconds = Seconds(Clock::now() - first.value_or(start));
    relay.Stop();
    outbox::testing::DeleteQueue(queue);
    if (ready < count) throw std::runtime_error("the drain did not finish");
    const double rate = static_cast<double>(count) / seconds;
    std::printf("| %lld | %.0f/s | %.0f/s | %.0f %% |\n", static_cast<long long>(count), store,
                rate, 100 * rate / store);
    std::fflush(stdout);
  }
  std::printf("\n");
}

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, max = 0;
};
Percentiles Summarize(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const auto at = [&](double q) {
    return values[std::min(values.size() - 1,
                           static_cast<std::size_t>(q * static_cast<double>(values.size())))];
  };
  return {at(0.5), at(0.9), at(0.99), values.back()};
}

void Idle(const Env& env, int seconds, int latency_messages) {
  std::printf(
      "== idle relay: statements/s to MariaDB (information_schema.USER_STATISTICS of the "
      "relay's own user), then commit -> consumer received, one at a time\n");
  Schema schema(env);
  auto& admin = schema.conn();
  // outboxd logs in as a user of its own, so that its statements can be told from ours.
  const std::string user = "relay_" + schema.name();
  admin.Execute("user", "CREATE USER '" + user + "'@'127.0.0.1' IDENTIFIED BY 'bench'");
  admin.Execute("grant", "GRANT ALL ON " + schema.name() + ".* TO '" + user + "'@'127.0.0.1'");
  admin.Execute("userstat", "SET GLOBAL userstat = 1");
  const auto url = outbox::mariadb::ParseUrl(env.url);
  const std::string relay_url =
      "mariadb://" + user + ":bench@127.0.0.1:" + std::to_string(url.port) + "/" + schema.name();
  const auto statements = [&] {
    const Value name[] = {user};
    const auto rows = admin
                          .Run("statistics",
                               "SELECT SELECT_COMMANDS + UPDATE_COMMANDS + OTHER_COMMANDS FROM "
                               "information_schema.USER_STATISTICS WHERE USER = ?",
                               name)
                          .sets.at(0)
                          .rows;
    return rows.empty() ? 0 : outbox::mariadb::ToInt64(rows[0][0], "statements");
  };
  const std::string queue = "mariadb_bench_idle_" + schema.name();
  outbox::testing::DeclareQueue(queue);
  std::mutex mutex;
  std::vector<std::int64_t> received(static_cast<std::size_t>(latency_messages) * 2, 0);
  std::atomic<std::int64_t> arrivals{0};
  outbox::testing::Consumer consumer(queue, [&](outbox::testing::Delivery&& delivery) {
    const auto seq = SeqOf(delivery.body);
    std::lock_guard lock(mutex);
    if (seq >= 0 && static_cast<std::size_t>(seq) < received.size() &&
        received[static_cast<std::size_t>(seq)] == 0) {
      received[static_cast<std::size_t>(seq)] = Clock::now().time_since_epoch().count();
      ++arrivals;
    }
  });
  const auto config = WriteConfig(env, schema.name(), relay_url, "", outbox::testing::FreePort());
  outbox::testing::ChildProcess relay({env.outboxd, "--config", config}, config + ".log",
                                      outbox::testing::Ready::Notify());
  std::this_thread::sleep_for(std::chrono::seconds{3});  // connected, idle
  const auto before = statements();
  std::this_thread::sleep_for(std::chrono::seconds{seconds});
  const auto after = statements();
  std::printf("idle: %.2f statements/s over %d s (the relay's user, HTTP listener on)\n",
              static_cast<double>(after - before) / static_cast<double>(seconds), seconds);

  Connection writer_conn{env.url, std::chrono::milliseconds{0}};
  const outbox::mariadb::Writer writer{schema.name()};
  for (const int gap_ms : {10, 500}) {
    const std::int64_t offset = gap_ms == 10 ? 0 : latency_messages;
    const int n = gap_ms == 10 ? latency_messages : std::max(1, latency_messages / 5);
    std::vector<double> latencies;
    for (int i = 0; i < n; ++i) {
      const std::int64_t seq = offset + i;
      writer_conn.Execute("begin", "START TRANSACTION");
      writer.Enqueue(writer_conn.Ready(),
                     outbox::NewMessage{.topic = queue,
                                        .payload = Payload(seq, 256),
                                        .stream_key = "s" + std::to_string(i % 1000)});
      writer_conn.Execute("commit", "COMMIT", true);
      const auto committed = Clock::now().time_since_epoch().count();
      const auto until = Clock::now() + std::chrono::seconds{10};
      while (arrivals.load() < seq + 1 && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::microseconds{50});
      }
      std::int64_t at = 0;
      {
        std::lock_guard lock(mutex);
        at = received[static_cast<std::size_t>(seq)];
      }
      if (at == 0) throw std::runtime_error("message " + std::to_string(seq) + " not received");
      latencies.push_back(static_cast<double>(at - committed) / 1e6);
      std::this_thread::sleep_for(std::chrono::milliseconds{gap_ms});
    }
    const auto p = Summarize(latencies);
    std::printf(
        "idle latency, COMMIT returned -> consumer received, 256 B, %d single messages %d ms "
        "apart: p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms\n",
        n, gap_ms, p.p50, p.p90, p.p99, p.max);
    std::fflush(stdout);
  }
  relay.Stop();
  consumer.Stop();
  outbox::testing::DeleteQueue(queue);
  admin.Execute("drop user", "DROP USER '" + user + "'@'127.0.0.1'");
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"outbox-mariadb-bench: the MariaDB store's writers, drain and idle cost"};
  app.require_subcommand(1);
  Env env;
  env.url = EnvOr("OUTBOX_TEST_MARIADB_URL", "mariadb://outbox:outbox@127.0.0.1:13306/outbox_test");
  env.amqp_url = EnvOr("OUTBOX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/");
  env.outboxd = OUTBOXD_PATH;
  app.add_option("--url", env.url, "MariaDB (default $OUTBOX_TEST_MARIADB_URL)");
  app.add_option("--amqp-url", env.amqp_url, "RabbitMQ (default $OUTBOX_TEST_AMQP_URL)");
  app.add_option("--outboxd", env.outboxd, "the outboxd binary")->check(CLI::ExistingFile);

  auto* enqueue = app.add_subcommand("enqueue", "writers alone: enqueue rates");
  std::int64_t enqueue_messages = 20000;
  enqueue->add_option("--messages", enqueue_messages)->check(CLI::Range(1, 100000000));
  auto* drain = app.add_subcommand("drain", "burst drain into RabbitMQ, next to the store alone");
  std::vector<std::int64_t> drain_counts{100000};
  std::size_t payload = 256;
  int streams = 1000;
  drain->add_option("--messages", drain_counts)->delimiter(',')->check(CLI::Range(1, 100000000));
  drain->add_option("--payload", payload)->check(CLI::Range(14, 1048576));
  drain->add_option("--streams", streams)->check(CLI::Range(1, 1000000));
  auto* idle = app.add_subcommand("idle", "idle relay: statements/s, then latency");
  int idle_seconds = 30;
  int latency_messages = 500;
  idle->add_option("--seconds", idle_seconds)->check(CLI::Range(1, 3600));
  idle->add_option("--latency-messages", latency_messages)->check(CLI::Range(1, 1000000));
  CLI11_PARSE(app, argc, argv);
  setenv("OUTBOX_TEST_AMQP_URL", env.amqp_url.c_str(), 1);
  env.dir =
      std::filesystem::temp_directory_path() / ("outbox-mariadb-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(env.dir);
  try {
    PrintConditions(env);
    if (enqueue->parsed()) Enqueue(env, enqueue_messages, 256);
    if (drain->parsed()) Drain(env, drain_counts, payload, streams);
    if (idle->parsed()) Idle(env, idle_seconds, latency_messages);
    std::filesystem::remove_all(env.dir);
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "outbox-mariadb-bench: %s (files kept in %s)\n", error.what(),
                 env.dir.c_str());
    return 1;
  }
}
