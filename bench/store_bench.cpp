// End-to-end cost of the PostgreSQL store on this machine: how fast writers enqueue, how fast a
// relay claims and completes, and what each message costs the database (statements, row writes,
// WAL bytes). Prints its conditions first.
//
//   outbox_store_bench [--url URL] [--messages N] [--payload BYTES]
//
// It works in a schema of its own ("bench_store"), dropped and re-created at the start.

#include <libpq-fe.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "outbox/store/postgres.h"
#include "statements.h"  // the store's own SQL, for EXPLAIN

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kSchema = "bench_store";

struct ConnCloser {
  void operator()(PGconn* conn) const noexcept { PQfinish(conn); }
};
using Conn = std::unique_ptr<PGconn, ConnCloser>;

Conn Connect(const std::string& url) {
  Conn conn{PQconnectdb(url.c_str())};
  if (PQstatus(conn.get()) != CONNECTION_OK) {
    throw std::runtime_error(std::string{"connect: "} + PQerrorMessage(conn.get()));
  }
  PQclear(PQexec(conn.get(), "SET client_min_messages = warning"));
  return conn;
}

std::string Query(PGconn* conn, const std::string& sql) {
  std::unique_ptr<PGresult, decltype(&PQclear)> result{PQexec(conn, sql.c_str()), &PQclear};
  const auto status = PQresultStatus(result.get());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    throw std::runtime_error(sql.substr(0, 120) + ": " + PQerrorMessage(conn));
  }
  return PQntuples(result.get()) > 0 ? PQgetvalue(result.get(), 0, 0) : "";
}

// Row writes and WAL as the database counts them, to diff around a phase.
struct DbCounters {
  double inserts = 0, updates = 0, deletes = 0, wal_bytes = 0;
  static DbCounters Read(PGconn* conn) {
    // Counters of backends that just exited reach the shared statistics a moment later.
    std::this_thread::sleep_for(std::chrono::milliseconds{500});
    Query(conn, "SELECT pg_stat_clear_snapshot()");
    DbCounters c;
    std::unique_ptr<PGresult, decltype(&PQclear)> r{
        PQexec(conn,
               "SELECT n_tup_ins, n_tup_upd, n_tup_del, pg_current_wal_lsn() - '0/0'::pg_lsn "
               "FROM pg_stat_user_tables WHERE schemaname = 'bench_store' AND relname = "
               "'messages'"),
        &PQclear};
    if (PQntuples(r.get()) == 1) {
      c.inserts = std::atof(PQgetvalue(r.get(), 0, 0));
      c.updates = std::atof(PQgetvalue(r.get(), 0, 1));
      c.deletes = std::atof(PQgetvalue(r.get(), 0, 2));
      c.wal_bytes = std::atof(PQgetvalue(r.get(), 0, 3));
    }
    return c;
  }
};

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](timeval t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

void ResetSchema(PGconn* admin, const std::string& url) {
  Query(admin, std::string{"DROP SCHEMA IF EXISTS "} + kSchema + " CASCADE");
  outbox::postgres::Migrate(url, kSchema);
}

struct EnqueueCase {
  const char* name;
  int writers;
  int streams;  // 0: unkeyed
  bool sequenced;
};

void BenchEnqueue(const std::string& url, PGconn* admin, const EnqueueCase& c, int messages,
                  const std::string& payload) {
  ResetSchema(admin, url);
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  const auto before = DbCounters::Read(admin);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < c.writers; ++w) {
    threads.emplace_back([&] {
      try {
        auto conn = Connect(url);
        const outbox::postgres::Writer writer{kSchema};
        for (int i = next++; i < messages; i = next++) {
          outbox::NewMessage message{.topic = "bench", .payload = payload};
          if (c.streams > 0) message.stream_key = "stream-" + std::to_string(i % c.streams);
          message.sequenced = c.sequenced;
          Query(conn.get(), "BEGIN");
          writer.Enqueue(conn.get(), message);
          Query(conn.get(), "COMMIT");
        }
      } catch (const std::exception& error) {
        std::fprintf(stderr, "writer failed: %s\n", error.what());
        failed = true;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const auto after = DbCounters::Read(admin);
  if (failed) throw std::runtime_error("a writer failed");
  std::printf("| enqueue | %-34s | %7d | %10.0f | %5.2f | %8.0f |\n", c.name, messages,
              messages / seconds,
              (after.inserts - before.inserts + after.updates - before.updates) / messages,
              (after.wal_bytes - before.wal_bytes) / messages);
}

void BenchDrain(const std::string& url, PGconn* admin, int batch, int messages,
                const std::string& payload) {
  ResetSchema(admin, url);
  // Pre-insert through the SQL function, as writers would have.
  Query(admin, std::string{"SELECT "} + kSchema + ".enqueue_message('bench', convert_to(" +
                   "repeat('x', " + std::to_string(payload.size()) +
                   "), 'UTF8'), 'application/json', 'stream-' || (g % 500), NULL, '{}', "
                   "'default', false) FROM generate_series(1, " +
                   std::to_string(messages) + ") g");
  Query(admin, std::string{"VACUUM ANALYZE "} + kSchema + ".messages");
  auto store = outbox::postgres::OpenStore({.conninfo = url, .schema = kSchema});
  const auto before = DbCounters::Read(admin);
  const double cpu_before = CpuSeconds();
  const auto start = Clock::now();
  long statements = 0;
  long done = 0;
  for (;;) {
    const auto claimed = store->Claim({.owner = "bench", .max_messages = batch});
    ++statements;
    if (claimed.empty()) break;
    std::vector<outbox::LeasedId> leases;
    leases.reserve(claimed.size());
    for (const auto& envelope : claimed) leases.push_back(outbox::LeasedId::Of(envelope));
    done += store->Complete("bench", leases).settled;
    ++statements;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double cpu = CpuSeconds() - cpu_before;
  store.reset();  // an exiting backend flushes its table counters; an idle one waits 10 s
  const auto after = DbCounters::Read(admin);
  if (done != messages) throw std::runtime_error("drained " + std::to_string(done));
  std::printf(
      "| claim+complete | batch %-28d | %7d | %10.0f | %5.2f | %8.0f | %.4f stmt/msg, "
      "%.1f us relay CPU/msg, writes/msg: %.2f upd %.2f del\n",
      batch, messages, messages / seconds,
      (after.updates - before.updates + after.deletes - before.deletes) / messages,
      (after.wal_bytes - before.wal_bytes) / messages, static_cast<double>(statements) / messages,
      cpu / messages * 1e6, (after.updates - before.updates) / messages,
      (after.deletes - before.deletes) / messages);
}

// A large backlog: the claim must still walk an index (EXPLAIN shows which), Stats must stay
// cheap, and the claim+complete rate must stay near the small-table rate.
void BenchBacklog(const std::string& url, PGconn* admin, long rows, const std::string& payload) {
  ResetSchema(admin, url);
  std::printf("\nbacklog: inserting %ld rows (10000 streams, %zu B payloads)...\n", rows,
              payload.size());
  std::fflush(stdout);
  const auto load_start = Clock::now();
  Query(admin, std::string{"INSERT INTO "} + kSchema +
                   ".messages (id, topic, stream_key, partition, target, payload, content_type) "
                   "SELECT " +
                   kSchema +
                   ".uuid_v7(), 'bench', 'stream-' || (g % 10000), g % 64, "
                   "'default', convert_to(repeat('x', " +
                   std::to_string(payload.size()) +
                   "), 'UTF8'), 'application/json' FROM generate_series(1, " +
                   std::to_string(rows) + ") g");
  Query(admin, std::string{"VACUUM ANALYZE "} + kSchema + ".messages");
  std::printf("loaded in %.0f s; table %s\n\n",
              std::chrono::duration<double>(Clock::now() - load_start).count(),
              Query(admin, std::string{"SELECT pg_size_pretty(pg_total_relation_size('"} + kSchema +
                               ".messages'))")
                  .c_str());

  const outbox::postgres::Statements statements{kSchema, false};
  Query(admin, "BEGIN");
  Query(admin, "PREPARE bench_claim(integer, integer[], text, bigint) AS " + statements.claim);
  std::unique_ptr<PGresult, decltype(&PQclear)> plan{
      PQexec(admin,
             "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE bench_claim(1000, NULL, "
             "'explain', 30000)"),
      &PQclear};
  std::printf("EXPLAIN (ANALYZE, BUFFERS) of the claim, batch 1000, %ld-row backlog:\n", rows);
  for (int i = 0; i < PQntuples(plan.get()); ++i)
    std::printf("    %s\n", PQgetvalue(plan.get(), i, 0));
  Query(admin, "ROLLBACK");

  auto store = outbox::postgres::OpenStore({.conninfo = url, .schema = kSchema});
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    const auto stats = store->Stats();
    std::printf("Stats(): %.1f ms (pending %lld%s, oldest %lld ms)\n",
                std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
                static_cast<long long>(stats.pending), stats.counts_estimated ? ", estimated" : "",
                static_cast<long long>(
                    stats.oldest_pending_age.value_or(std::chrono::milliseconds{0}).count()));
  }
  constexpr int kDrain = 100000;
  const auto start = Clock::now();
  long done = 0;
  while (done < kDrain) {
    const auto claimed = store->Claim({.owner = "bench", .max_messages = 1000});
    if (claimed.empty()) break;
    std::vector<outbox::LeasedId> leases;
    for (const auto& envelope : claimed) leases.push_back(outbox::LeasedId::Of(envelope));
    done += store->Complete("bench", leases).settled;
  }
  std::printf(
      "claim+complete, batch 1000, first %ld of the backlog: %.0f msgs/s\n", done,
      static_cast<double>(done) / std::chrono::duration<double>(Clock::now() - start).count());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"outbox PostgreSQL store benchmark"};
  const char* env = std::getenv("OUTBOX_TEST_PG_URL");
  std::string url = env != nullptr ? env : "postgresql://outbox:outbox@127.0.0.1:15432/outbox_test";
  int messages = 20000;
  int drain_messages = 100000;
  int payload_bytes = 200;
  app.add_option("--url", url, "PostgreSQL connection string");
  app.add_option("--messages", messages, "messages per enqueue case")->check(CLI::PositiveNumber);
  app.add_option("--drain-messages", drain_messages, "messages per drain case")
      ->check(CLI::PositiveNumber);
  app.add_option("--payload", payload_bytes, "payload bytes")->check(CLI::PositiveNumber);
  long backlog = 0;
  app.add_option("--backlog", backlog,
                 "only run the large-backlog case with this many rows (e.g. 10000000)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    auto admin = Connect(url);
    std::printf(
        "conditions: %s; %u cores shared by server and benchmark; payload %d B; "
        "server settings: synchronous_commit=%s fsync=%s shared_buffers=%s\n\n",
        Query(admin.get(), "SELECT version()").substr(0, 60).c_str(),
        std::thread::hardware_concurrency(), payload_bytes,
        Query(admin.get(), "SHOW synchronous_commit").c_str(),
        Query(admin.get(), "SHOW fsync").c_str(),
        Query(admin.get(), "SHOW shared_buffers").c_str());
    const std::string payload(static_cast<std::size_t>(payload_bytes), 'x');
    if (backlog > 0) {
      BenchBacklog(url, admin.get(), backlog, payload);
      Query(admin.get(), std::string{"DROP SCHEMA IF EXISTS "} + kSchema + " CASCADE");
      return 0;
    }
    std::printf(
        "| phase | case | messages | msgs/s | messages-table row writes/msg | WAL B/msg |\n");
    std::printf("|---|---|---|---|---|---|\n");
    const EnqueueCase cases[] = {
        {"1 writer, unkeyed", 1, 0, false},
        {"8 writers, unkeyed", 8, 0, false},
        {"8 writers, 500 streams, unsequenced", 8, 500, false},
        {"8 writers, 500 streams, stream_seq", 8, 500, true},
        {"8 writers, 1 stream, stream_seq", 8, 1, true},
    };
    for (const auto& c : cases) BenchEnqueue(url, admin.get(), c, messages, payload);
    for (const int batch : {100, 1000}) {
      BenchDrain(url, admin.get(), batch, drain_messages, payload);
    }
    Query(admin.get(), std::string{"DROP SCHEMA IF EXISTS "} + kSchema + " CASCADE");
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "benchmark failed: %s\n", error.what());
    return 1;
  }
}
