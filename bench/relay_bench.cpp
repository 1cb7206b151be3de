// The relay end to end on this machine, PostgreSQL -> relay -> RabbitMQ -> a consumer:
//   0. idle cost: statements per second an idle relay sends the database (pg_stat_statements);
//   1. idle latency: one message at a time, from the writer's COMMIT to the consumer's receipt
//      (the relay is idle and woken by NOTIFY each time), p50/p99 over --latency-messages;
//   2. burst drain: --drain-messages pre-inserted messages, relay throughput in msgs/s, next to
//   3. the broker's own ceiling: the same number of messages published straight through the
//      RabbitMQ sink (window 1000), no database, measured in the same run.
//
//   outbox_relay_bench [--latency-messages 1000] [--drain-messages 100000] [--batch 500]

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <numeric>

#include "../tests/e2e/amqp_test_client.h"
#include "../tests/postgres/pg_test_support.h"
#include "outbox/relay/relay.h"
#include "outbox/sink/rabbitmq.h"

namespace {

using namespace outbox;
using outbox::testing::Consumer;
using SteadyClock = std::chrono::steady_clock;

double Seconds(SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); }

std::unique_ptr<Sink> RabbitSink() {
  rabbitmq::SinkOptions options;
  options.url = outbox::testing::AmqpUrl();
  options.routing_key = "{topic}";
  return rabbitmq::OpenSink(options);
}

// Runs a relay on its own thread for the lifetime of this object.
class RunningRelay {
 public:
  RunningRelay(const std::string& schema, int batch) {
    postgres::StoreOptions store;
    store.conninfo = outbox::testing::PgUrl();
    store.schema = schema;
    RelayOptions options;
    options.instance = "bench";
    options.batch_size = batch;
    SinkMap sinks;
    sinks.emplace("default", RabbitSink());
    relay_ =
        std::make_unique<Relay>(options, postgres::OpenStore(store),
                                postgres::OpenWakeup(store.conninfo, schema), std::move(sinks));
    thread_ = std::thread([this] { relay_->Run(); });
  }
  ~RunningRelay() {
    relay_->Stop();
    thread_.join();
  }

 private:
  std::unique_ptr<Relay> relay_;
  std::thread thread_;
};

// Statements the server executed, counted by pg_stat_statements (loaded by scripts/services);
// nullopt when the extension is not available. Excludes this benchmark's own bookkeeping.
class StatementCounter {
 public:
  explicit StatementCounter(PGconn* conn) : conn_(conn) {
    PGresult* created = PQexec(conn_, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    available_ = PQresultStatus(created) == PGRES_COMMAND_OK;
    PQclear(created);
    if (available_) available_ = Read().has_value();
  }
  bool available() const { return available_; }
  void Reset() {
    if (available_) PQclear(PQexec(conn_, "SELECT pg_stat_statements_reset()"));
  }
  std::optional<double> Read() {
    PGresult* result = PQexec(
        conn_,
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM "
        "pg_database WHERE datname = current_database()) AND query NOT LIKE '%pg_stat_statements%' "
        "AND query NOT LIKE '%enqueue%' AND query NOT IN ('BEGIN', 'COMMIT', 'ROLLBACK')");
    std::optional<double> calls;
    if (PQresultStatus(result) == PGRES_TUPLES_OK) calls = std::atof(PQgetvalue(result, 0, 0));
    PQclear(result);
    return calls;
  }

 private:
  PGconn* conn_;
  bool available_ = false;
};

bool WaitForCount(const Consumer& consumer, std::size_t count, std::chrono::seconds limit) {
  const auto until = SteadyClock::now() + limit;
  while (consumer.count() < count) {
    if (SteadyClock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds{100});
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"outbox relay benchmark: PostgreSQL -> outbox relay -> RabbitMQ"};
  int latency_messages = 1000;
  int drain_messages = 100000;
  int batch = 500;
  app.add_option("--latency-messages", latency_messages)->check(CLI::PositiveNumber);
  app.add_option("--drain-messages", drain_messages)->check(CLI::PositiveNumber);
  app.add_option("--batch", batch)->check(CLI::Range(1, 10000));
  int idle_seconds = 10;
  app.add_option("--idle-seconds", idle_seconds, "how long to watch an idle relay")
      ->check(CLI::Range(1, 600));
  CLI11_PARSE(app, argc, argv);

  try {
    outbox::testing::TestSchema schema;
    const std::string queue = "bench_" + schema.name();
    outbox::testing::DeclareQueue(queue);
    auto writer = outbox::testing::Connect();
    std::printf(
        "conditions: %u cores shared by PostgreSQL 15, RabbitMQ, relay and consumer; "
        "200 B JSON payloads; one classic durable queue, persistent messages; "
        "relay batch %d, confirm window 1000\n\n",
        std::thread::hardware_concurrency(), batch);
    const std::string payload = "'{\"pad\": \"" + std::string(185, 'x') + "\"}'";

    StatementCounter statements{writer.get()};
    {  // 0. an idle relay's cost to the database
      RunningRelay relay(schema.name(), batch);
      std::this_thread::sleep_for(std::chrono::seconds{2});
      if (statements.available()) {
        statements.Reset();
        std::this_thread::sleep_for(std::chrono::seconds{idle_seconds});
        std::printf(
            "idle relay: %.2f statements/s sent to the database (pg_stat_statements, "
            "%d s)\n",
            statements.Read().value_or(0) / idle_seconds, idle_seconds);
      } else {
        std::printf(
            "idle relay: statements/s not measured (pg_stat_statements is not loaded; "
            "restart PostgreSQL with scripts/services stop && scripts/services)\n");
      }
    }

    {  // 1. idle latency
      Consumer consumer(queue);
      RunningRelay relay(schema.name(), batch);
      std::this_thread::sleep_for(std::chrono::milliseconds{500});  // let it go idle
      std::vector<double> latencies;
      for (int i = 0; i < latency_messages; ++i) {
        outbox::testing::Sql(writer.get(), "BEGIN");
        outbox::testing::Sql(
            writer.get(), "SELECT " + schema.name() + ".enqueue('" + queue + "', " + payload + ")");
        const auto committed = SteadyClock::now();
        outbox::testing::Sql(writer.get(), "COMMIT");
        if (!WaitForCount(consumer, static_cast<std::size_t>(i + 1), std::chrono::seconds{10})) {
          throw std::runtime_error("message " + std::to_string(i) + " not delivered in 10 s");
        }
        latencies.push_back(Seconds(SteadyClock::now() - committed) * 1000.0);
        std::this_thread::sleep_for(std::chrono::milliseconds{5});  // idle again between messages
      }
      std::sort(latencies.begin(), latencies.end());
      const auto at = [&](double q) {
        return latencies[static_cast<std::size_t>(q * static_cast<double>(latencies.size() - 1))];
      };
      std::printf(
          "idle commit -> consumer receipt, %d single messages: p50 %.2f ms, p99 %.2f ms, "
          "max %.2f ms\n",
          latency_messages, at(0.5), at(0.99), latencies.back());
    }

    double relay_rate = 0;
    {  // 2. burst drain
      outbox::testing::Sql(writer.get(), "SELECT " + schema.name() + ".enqueue('" + queue + "', " +
                                             payload +
                                             ", stream_key => 's' || (g % 500)) FROM "
                                             "generate_series(1, " +
                                             std::to_string(drain_messages) + ") g");
      outbox::testing::Sql(writer.get(), "VACUUM ANALYZE " + schema.name() + ".messages");
      Consumer consumer(queue);
      const std::size_t base = 0;
      statements.Reset();
      const auto start = SteadyClock::now();
      RunningRelay relay(schema.name(), batch);
      if (!WaitForCount(consumer, base + static_cast<std::size_t>(drain_messages),
                        std::chrono::seconds{600})) {
        throw std::runtime_error("drain did not finish in 600 s");
      }
      relay_rate = drain_messages / Seconds(SteadyClock::now() - start);
      std::printf(
          "burst drain of %d pre-inserted messages (500 streams) through the relay: "
          "%.0f msgs/s\n",
          drain_messages, relay_rate);
      if (statements.available()) {
        std::printf("relay statements per published message: %.4f\n",
                    statements.Read().value_or(0) / drain_messages);
      }
    }

    {  // 3. the broker's own confirmed-publish ceiling, same run, same queue kind
      auto sink = RabbitSink();
      std::vector<Envelope> batch_envelopes;
      const std::string body = "{\"pad\": \"" + std::string(185, 'x') + "\"}";
      Consumer consumer(queue);
      const auto start = SteadyClock::now();
      for (int sent = 0; sent < drain_messages;) {
        batch_envelopes.clear();
        for (int i = 0; i < 1000 && sent < drain_messages; ++i, ++sent) {
          Envelope envelope;
          envelope.id = NewUuidV7();
          envelope.topic = queue;
          envelope.payload = body;
          batch_envelopes.push_back(std::move(envelope));
        }
        const auto outcomes =
            sink->Publish(batch_envelopes, SteadyClock::now() + std::chrono::seconds{30});
        for (const auto& outcome : outcomes) {
          if (!outcome.published()) throw std::runtime_error(outcome.failure->Describe());
        }
      }
      const double raw_rate = drain_messages / Seconds(SteadyClock::now() - start);
      WaitForCount(consumer, static_cast<std::size_t>(drain_messages), std::chrono::seconds{120});
      std::printf(
          "RabbitMQ confirmed-publish ceiling (sink alone, window 1000, no database): "
          "%.0f msgs/s\nrelay / ceiling: %.0f %%\n",
          raw_rate, 100.0 * relay_rate / raw_rate);
    }
    outbox::testing::DeleteQueue(queue);
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "benchmark failed: %s\n", error.what());
    return 1;
  }
}
