// outbox-claim-bench: what a claim costs while one target is paused (issue #14).
//
// A relay whose sink for target "paused" is down claims with ClaimRequest::paused_targets =
// {"paused"}; target "healthy" must flow at full rate. This program loads, in a schema of its own,
// a backlog of older messages for "paused" and younger ones for "healthy" (disjoint streams), then
// measures, for each paused backlog size:
//   - EXPLAIN (ANALYZE, BUFFERS) of the store's own claim statement (statements.h), in a
//     transaction rolled back, for each variant of the claim (below), median of --repeat runs;
//   - the wall time of Store::Claim through the C++ API while draining the healthy messages with
//     Claim + Complete (no broker), and the drain rate;
//   - the same drain through the variants' statements (libpq, fixed cursor), for comparison.
// Variants (the indexes each needs are made for it and dropped after):
//   exclusion                        the store's claim statement ($7 = the paused targets), without
//                                    the stream index below (as schema v8 had)
//   exclusion+stream-index           with an index of waiting messages by (target, stream_key, id)
//                                    (schema v9's messages_waiting_streams), the cursor at the
//                                    oldest fresh message (where the v8 store's stays)
//   ..., cursor past paused          the same, the cursor at the oldest fresh message of a target
//                                    not paused (where the v9 store's goes)
//   per-target+stream-index          a claim that asks for one target: `m.target = $10` instead of
//                                    the exclusion
//   per-target+both-indexes          the same with an index of fresh messages on (target, id)
//
//   outbox-claim-bench [--paused 0,10000,100000,1000000] [--healthy 10000]
//                      [--drain-paused 0,100000,1000000] [--drain-healthy 100000] [--batch 500]
//                      [--fillfactor 100] [--plans]
//
// Server: $OUTBOX_TEST_PG_URL (scripts/services) or --pg. The schema is named after this process
// and dropped at the end. Every phase is bounded: a drain stops after --drain-seconds and the run
// skips what is left after --max-seconds.

#include <libpq-fe.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "connection.h"  // the store's libpq layer
#include "outbox/core/uuid.h"
#include "outbox/store/postgres.h"
#include "statements.h"  // the store's statements, exactly as it sends them

namespace {

using Clock = std::chrono::steady_clock;
using outbox::postgres::Connection;
using outbox::postgres::Exec;
using outbox::postgres::Param;
using outbox::postgres::ReplaceAll;
using outbox::postgres::ResultPtr;

constexpr const char* kPaused = "paused";
constexpr const char* kHealthy = "healthy";
constexpr const char* kOwner = "claim-bench";
constexpr const char* kLease = "60000";

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double Millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

std::string Scalar(PGconn* conn, const std::string& sql) {
  const auto result = Exec(conn, "bench", sql);
  return PQntuples(result.get()) > 0 ? PQgetvalue(result.get(), 0, 0) : "";
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto index = static_cast<std::size_t>(p * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(index, values.size() - 1)];
}

struct Options {
  std::string pg_url;
  std::vector<std::int64_t> paused{0, 10000, 100000, 1000000};
  std::int64_t healthy = 10000;
  std::vector<std::int64_t> drain_paused{0, 100000, 1000000};
  std::int64_t drain_healthy = 100000;
  int batch = 500;
  int streams = 1000;
  int payload = 256;
  int repeat = 3;
  int drain_seconds = 60;
  int max_seconds = 1800;
  bool plans = false;
  int statement_timeout = 30;
  int fillfactor = 100;  // the messages table's (PostgreSQL's default)
};

// A claim statement as sent by the store, or a variant of it, and the indexes it is run with.
struct Variant {
  std::string name;
  std::string sql;
  bool per_target = false;    // $10 = the one target asked for
  bool stream_index = false;  // kStreamIndex
  bool target_index = false;  // kTargetIndex
  bool cursor_past = false;   // the cursor at the first fresh message of a target not paused
};

// The index of waiting messages by (target, stream): what the head-of-line clause "an earlier
// message of the stream waits for a paused target" can probe (schema v9 has it).
constexpr const char* kStreamIndexName = "messages_waiting_streams";
constexpr const char* kStreamIndex =
    " (target, stream_key, id) WHERE status IN ('pending', 'failed') AND stream_key IS NOT NULL";
// An index of fresh messages per target in claim order, for claims that ask for one target.
constexpr const char* kTargetIndexName = "claim_bench_fresh_by_target";
constexpr const char* kTargetIndex = " (target, id) WHERE status = 'pending' AND lease_epoch = 0";

class Bench {
 public:
  explicit Bench(Options options)
      : options_(std::move(options)),
        monitor_(options_.pg_url),
        schema_("claim_bench_" + std::to_string(getpid())),
        started_(Clock::now()) {}

  void Run() {
    Exec(monitor_.get(), "bench", "SET client_min_messages = warning");
    // Loads and index builds take as long as they take; claims are bounded (PGOPTIONS, Explain).
    Exec(monitor_.get(), "bench", "SET statement_timeout = 0");
    PrintConditions();
    Exec(monitor_.get(), "bench", "DROP SCHEMA IF EXISTS " + schema_ + " CASCADE");
    try {
      RunSizes();
    } catch (...) {
      Drop();
      throw;
    }
    Drop();
  }

 private:
  std::string Table() const { return schema_ + ".messages"; }

  bool OutOfTime() const { return Seconds(Clock::now() - started_) > options_.max_seconds; }

  void Drop() {
    ResultPtr dropped{
        PQexec(monitor_.get(), ("DROP SCHEMA IF EXISTS " + schema_ + " CASCADE").c_str())};
  }

  void PrintConditions() {
    std::ifstream loadavg("/proc/loadavg");
    std::string one, five, fifteen;
    loadavg >> one >> five >> fifteen;
    std::printf(
        "conditions: %u cores shared by PostgreSQL and this benchmark; %s; jit off; "
        "shared_buffers=%s fsync=%s; load average %s %s %s\n",
        std::thread::hardware_concurrency(),
        Scalar(monitor_.get(), "SELECT split_part(version(), ' on ', 1)").c_str(),
        Scalar(monitor_.get(), "SHOW shared_buffers").c_str(),
        Scalar(monitor_.get(), "SHOW fsync").c_str(), one.c_str(), five.c_str(), fifteen.c_str());
    std::printf(
        "sizes: paused backlog %s (claims), %s (drains); healthy %lld due behind them "
        "(claims), %lld (drains); batch %d; %d streams per target, disjoint; payload %d "
        "B; EXPLAIN median of %d; drains bounded at %d s; statement_timeout %d s\n",
        List(options_.paused).c_str(), List(options_.drain_paused).c_str(),
        static_cast<long long>(options_.healthy), static_cast<long long>(options_.drain_healthy),
        options_.batch, options_.streams, options_.payload, options_.repeat, options_.drain_seconds,
        options_.statement_timeout);
    std::fflush(stdout);
  }

  static std::string List(const std::vector<std::int64_t>& values) {
    std::string out;
    for (const auto v : values) out += (out.empty() ? "" : ",") + std::to_string(v);
    return out;
  }

  // The store's statement as it is; per target: `m.target = $10` instead of the exclusion.
  std::vector<Variant> Variants() const {
    const outbox::postgres::Statements statements{schema_, false};
    const std::string exclusion = "AND m.target <> ALL ($7::text[])";
    std::vector<Variant> variants{
        {"exclusion", statements.claim},
        {"exclusion+stream-index", statements.claim, false, true},
        {"exclusion+stream-index, cursor past paused", statements.claim, false, true, false, true}};
    if (statements.claim.find(exclusion) != std::string::npos) {
      const auto per_target = ReplaceAll(statements.claim, exclusion,
                                         "AND m.target = $10::text AND $7::text[] IS NOT NULL");
      variants.push_back({"per-target+stream-index", per_target, true, true});
      variants.push_back({"per-target+both-indexes", per_target, true, true, true});
    }
    return variants;
  }

  // Messages first..first+count-1 for `target`, pending and never claimed, over the target's own
  // streams with their stream_seq; ids in insertion order (the database clock).
  void Load(const char* target, std::int64_t first, std::int64_t count) {
    if (count <= 0) return;
    const auto streams = std::to_string(options_.streams);
    Exec(monitor_.get(), "load",
         "INSERT INTO " + Table() +
             " (id, topic, stream_key, stream_seq, partition, target, payload, content_type) "
             "SELECT " +
             schema_ + ".uuid_v7(), 'bench', '" + target + "-' || (g % " + streams + "), g / " +
             streams + " + 1, (g % " + streams + ") % 64, '" + target +
             "', convert_to('\"' || lpad(g::text, 12, '0') || repeat('x', " +
             std::to_string(options_.payload - 14) +
             ") || '\"', 'UTF8'), 'application/json' FROM generate_series(" +
             std::to_string(first) + ", " + std::to_string(first + count - 1) + ") g");
  }

  void VacuumAnalyze() { Exec(monitor_.get(), "vacuum", "VACUUM ANALYZE " + Table()); }

  void SetIndex(const char* name, const char* definition, bool on) {
    const bool exists = Scalar(monitor_.get(), "SELECT to_regclass('" + schema_ + "." + name +
                                                   "') IS NOT NULL") == "t";
    if (on && !exists) {
      const auto start = Clock::now();
      Exec(monitor_.get(), "index",
           std::string{"CREATE INDEX "} + name + " ON " + Table() + definition);
      std::printf("         index %s built in %.2f s\n", name, Seconds(Clock::now() - start));
    } else if (!on && exists) {
      Exec(monitor_.get(), "index", "DROP INDEX " + schema_ + "." + name);
    }
  }

  void SetIndexes(const Variant& variant) {
    SetIndex(kStreamIndexName, kStreamIndex, variant.stream_index);
    SetIndex(kTargetIndexName, kTargetIndex, variant.target_index);
    Exec(monitor_.get(), "analyze", "ANALYZE " + Table());
  }

  // Where the store's cursor stands while the backlog waits: at the oldest fresh message, or
  // with `past_paused` at the oldest fresh message of a target not paused.
  std::string Cursor(bool past_paused) {
    const auto oldest =
        Scalar(monitor_.get(),
               "SELECT id FROM " + Table() + " WHERE status = 'pending' AND lease_epoch = 0" +
                   (past_paused ? " AND target <> '" + std::string{kPaused} + "'" : std::string{}) +
                   " ORDER BY id LIMIT 1");
    return oldest.empty() ? "00000000-0000-0000-0000-000000000000" : oldest;
  }

  std::vector<std::string> Params(const Variant& variant, const std::string& cursor) const {
    std::vector<std::string> params{std::to_string(options_.batch), kOwner, kLease, cursor,
                                    "{" + std::string{kPaused} + "}"};
    if (variant.per_target) params.emplace_back(kHealthy);
    return params;
  }

  static std::vector<Param> Bind(const std::vector<std::string>& p) {
    // $1 limit, $2 partitions NULL, $3 owner, $4 lease, $5 epochs NULL, $6 cursor, $7 paused,
    // $8 and $9 the previous batch to settle (none: each drain settles with its own Complete)[,
    // $10 target]
    std::vector<Param> params{Param{p[0]}, Param{},     Param{p[1]}, Param{p[2]}, Param{},
                              Param{p[3]}, Param{p[4]}, Param{"{}"}, Param{"{}"}};
    if (p.size() > 5) params.push_back(Param{p[5]});
    return params;
  }

  struct Explained {
    double execution_ms = 0;
    double planning_ms = 0;
    double buffers = 0;  // shared hit + read of the whole statement
    double claimed = 0;
  };

  // `explain` + the variant's statement, in a transaction of its own under the statement timeout,
  // rolled back (EXPLAIN ANALYZE runs the claim; the slow variants run for minutes).
  ResultPtr RolledBackExplain(const std::string& explain, const Variant& variant,
                              const std::vector<std::string>& params) {
    Exec(monitor_.get(), "begin", "BEGIN");
    Exec(monitor_.get(), "timeout",
         "SET LOCAL statement_timeout = '" + std::to_string(options_.statement_timeout) + "s'");
    ResultPtr result;
    try {
      result = Exec(monitor_.get(), "explain", explain + " " + variant.sql, Bind(params));
    } catch (...) {
      ResultPtr rollback{PQexec(monitor_.get(), "ROLLBACK")};
      throw;
    }
    Exec(monitor_.get(), "rollback", "ROLLBACK");
    return result;
  }

  Explained Explain(const Variant& variant, const std::string& cursor, bool print) {
    const auto params = Params(variant, cursor);
    const ResultPtr result =
        RolledBackExplain("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)", variant, params);
    const std::string text = PQgetvalue(result.get(), 0, 0);
    const auto json = nlohmann::json::parse(text).at(0);
    Explained out;
    out.execution_ms = json.at("Execution Time").get<double>();
    out.planning_ms = json.at("Planning Time").get<double>();
    const auto& plan = json.at("Plan");
    out.buffers = plan.value("Shared Hit Blocks", 0.0) + plan.value("Shared Read Blocks", 0.0);
    out.claimed = plan.value("Actual Rows", 0.0);
    if (print) {
      const ResultPtr plain =
          RolledBackExplain("EXPLAIN (ANALYZE, BUFFERS, WAL, COSTS OFF)", variant, params);
      std::printf("plan of %s:\n", variant.name.c_str());
      for (int row = 0; row < PQntuples(plain.get()); ++row) {
        std::printf("    %s\n", PQgetvalue(plain.get(), row, 0));
      }
    }
    return out;
  }

  void ExplainAll(std::int64_t paused) {
    for (const auto& variant : Variants()) {
      SetIndexes(variant);
      const auto cursor = Cursor(variant.cursor_past);
      std::vector<double> execution, planning, buffers;
      double claimed = 0;
      try {
        for (int i = 0; i < options_.repeat; ++i) {
          const auto e = Explain(variant, cursor, options_.plans && i == 0);
          execution.push_back(e.execution_ms);
          planning.push_back(e.planning_ms);
          buffers.push_back(e.buffers);
          claimed = e.claimed;
        }
      } catch (const outbox::StoreError& error) {
        std::printf("explain  paused %8lld  %-44s %s\n", static_cast<long long>(paused),
                    variant.name.c_str(), error.what());
        std::fflush(stdout);
        continue;
      }
      std::printf(
          "explain  paused %8lld  %-44s execution %9.2f ms (min %.2f, max %.2f)  "
          "planning %.2f ms  buffers %8.0f  rows %.0f\n",
          static_cast<long long>(paused), variant.name.c_str(), Median(execution),
          *std::min_element(execution.begin(), execution.end()),
          *std::max_element(execution.begin(), execution.end()), Median(planning), Median(buffers),
          claimed);
      std::fflush(stdout);
    }
  }

  struct Drained {
    std::int64_t messages = 0;
    std::int64_t wrong_target = 0;
    std::vector<double> claim_ms;
    double seconds = 0;
    bool complete = true;
    std::string error;  // the claim that failed (a statement timeout)
  };

  void Report(const char* how, std::int64_t paused, std::int64_t healthy, const Drained& d) {
    std::printf(
        "drain    paused %8lld  %-44s %lld/%lld healthy in %.2f s: %8.0f msg/s; "
        "claim p50 %.2f ms p90 %.2f ms max %.2f ms over %zu claims%s%s\n",
        static_cast<long long>(paused), how, static_cast<long long>(d.messages),
        static_cast<long long>(healthy), d.seconds,
        d.seconds > 0 ? static_cast<double>(d.messages) / d.seconds : 0.0, Median(d.claim_ms),
        Percentile(d.claim_ms, 0.9),
        d.claim_ms.empty() ? 0.0 : *std::max_element(d.claim_ms.begin(), d.claim_ms.end()),
        d.claim_ms.size(), d.complete ? "" : " (stopped at the time bound)",
        d.wrong_target > 0 ? " PAUSED MESSAGES CLAIMED" : "");
    if (!d.error.empty()) std::printf("         stopped: %s\n", d.error.c_str());
    std::fflush(stdout);
  }

  // A claim's messages, and whether each is for the healthy target.
  using Batch = std::vector<std::pair<outbox::LeasedId, bool>>;

  // Claims with `claim` and completes with `complete` until `healthy` messages are done, nothing
  // more is claimed, a claim fails (a statement timeout) or --drain-seconds have passed.
  template <typename ClaimFn, typename CompleteFn>
  Drained Drain(std::int64_t healthy, ClaimFn claim, CompleteFn complete) {
    Drained d;
    const auto start = Clock::now();
    const auto bound = start + std::chrono::seconds{options_.drain_seconds};
    while (d.messages < healthy) {
      if (Clock::now() > bound) {
        d.complete = false;
        break;
      }
      const auto before = Clock::now();
      Batch batch;
      try {
        batch = claim();
      } catch (const outbox::StoreError& error) {
        d.error = error.what();
        break;
      }
      d.claim_ms.push_back(Millis(Clock::now() - before));
      if (batch.empty()) break;
      std::vector<outbox::LeasedId> ids;
      for (const auto& [id, is_healthy] : batch) {
        if (!is_healthy) ++d.wrong_target;
        ids.push_back(id);
      }
      complete(ids);
      d.messages += static_cast<std::int64_t>(batch.size());
    }
    d.seconds = Seconds(Clock::now() - start);
    return d;
  }

  // Store::Claim + Store::Complete, on the schema's own indexes.
  Drained DrainThroughStore(std::int64_t healthy) {
    SetIndexes({"schema", "", false, schema_stream_index_, false});
    outbox::postgres::StoreOptions store_options;
    store_options.conninfo = options_.pg_url;
    store_options.schema = schema_;
    const auto store = outbox::postgres::OpenStore(store_options);
    outbox::ClaimRequest request;
    request.owner = kOwner;
    request.max_messages = options_.batch;
    request.lease_duration = std::chrono::seconds{60};
    request.paused_targets = {kPaused};
    return Drain(
        healthy,
        [&] {
          Batch batch;
          for (const auto& envelope : store->Claim(request)) {
            batch.emplace_back(outbox::LeasedId::Of(envelope), envelope.target == kHealthy);
          }
          return batch;
        },
        [&](const std::vector<outbox::LeasedId>& ids) { store->Complete(kOwner, ids); });
  }

  // The same loop on the variant's statement and the store's complete, the cursor fixed where the
  // store's would stay.
  Drained DrainThroughStatement(const Variant& variant, std::int64_t healthy) {
    const outbox::postgres::Statements statements{schema_, false};
    Connection connection{options_.pg_url};
    const auto params = Params(variant, Cursor(variant.cursor_past));
    return Drain(
        healthy,
        [&] {
          const auto rows = Exec(connection.get(), "claim", variant.sql, Bind(params));
          Batch batch;
          for (int row = 0; row < PQntuples(rows.get()); ++row) {
            if (PQgetisnull(rows.get(), row, 0) != 0) continue;  // the cursor's row
            const auto id = outbox::Uuid::Parse(PQgetvalue(rows.get(), row, 0));
            if (!id) throw std::runtime_error("claim: a row without an id");
            batch.emplace_back(outbox::LeasedId{*id, std::stoll(PQgetvalue(rows.get(), row, 12))},
                               std::string_view{PQgetvalue(rows.get(), row, 5)} == kHealthy);
          }
          return batch;
        },
        [&](const std::vector<outbox::LeasedId>& leased) {
          std::vector<outbox::MessageId> ids;
          std::vector<std::int64_t> epochs;
          for (const auto& lease : leased) {
            ids.push_back(lease.id);
            epochs.push_back(lease.lease_epoch);
          }
          const auto id_array = outbox::postgres::UuidArray(ids);
          const auto epoch_array = outbox::postgres::NumberArray(epochs);
          Exec(connection.get(), "complete", statements.complete,
               {Param{kOwner}, Param{id_array}, Param{epoch_array}});
        });
  }

  void RunSizes() {
    std::vector<std::int64_t> sizes = options_.paused;
    for (const auto p : options_.drain_paused) {
      if (std::find(sizes.begin(), sizes.end(), p) == sizes.end()) sizes.push_back(p);
    }
    std::sort(sizes.begin(), sizes.end());
    std::int64_t loaded_paused = 0;
    std::int64_t next = 1;
    outbox::postgres::Migrate(monitor_.get(), schema_);
    if (options_.fillfactor != 100) {
      Exec(monitor_.get(), "fillfactor",
           "ALTER TABLE " + Table() + " SET (fillfactor = " + std::to_string(options_.fillfactor) +
               ")");
      std::printf("messages table fillfactor %d\n", options_.fillfactor);
    }
    schema_stream_index_ = Scalar(monitor_.get(), "SELECT to_regclass('" + schema_ + "." +
                                                      kStreamIndexName + "') IS NOT NULL") == "t";
    std::printf("schema version %d%s\n", outbox::postgres::LatestSchemaVersion(),
                schema_stream_index_ ? ", with the stream index" : ", without the stream index");
    for (const auto paused : sizes) {
      if (OutOfTime()) {
        std::printf("skipped paused %lld and larger: past --max-seconds\n",
                    static_cast<long long>(paused));
        break;
      }
      // The paused backlog grows from one size to the next; the healthy messages are younger.
      const auto load_start = Clock::now();
      Load(kPaused, next, paused - loaded_paused);
      next += paused - loaded_paused;
      loaded_paused = paused;
      const bool claims = std::find(options_.paused.begin(), options_.paused.end(), paused) !=
                          options_.paused.end();
      const bool drains = std::find(options_.drain_paused.begin(), options_.drain_paused.end(),
                                    paused) != options_.drain_paused.end();
      if (claims) {
        Load(kHealthy, next, options_.healthy);
        next += options_.healthy;
        VacuumAnalyze();
        std::printf("-- paused backlog %lld, %lld healthy behind it (loaded in %.1f s), table %s\n",
                    static_cast<long long>(paused), static_cast<long long>(options_.healthy),
                    Seconds(Clock::now() - load_start),
                    Scalar(monitor_.get(),
                           "SELECT pg_size_pretty(pg_total_relation_size('" + Table() + "'))")
                        .c_str());
        ExplainAll(paused);
        Report("Store::Claim", paused, options_.healthy, DrainThroughStore(options_.healthy));
      }
      if (drains) {
        for (const auto& variant : Variants()) {
          if (OutOfTime()) break;
          Load(kHealthy, next, options_.drain_healthy);
          next += options_.drain_healthy;
          VacuumAnalyze();
          SetIndexes(variant);
          Report(("stmt " + variant.name).c_str(), paused, options_.drain_healthy,
                 DrainThroughStatement(variant, options_.drain_healthy));
        }
        if (OutOfTime()) continue;
        Load(kHealthy, next, options_.drain_healthy);
        next += options_.drain_healthy;
        VacuumAnalyze();
        Report("Store::Claim", paused, options_.drain_healthy,
               DrainThroughStore(options_.drain_healthy));
      }
      // What a drain left behind (stopped at its bound) goes, so that the next size starts clean.
      Exec(monitor_.get(), "clean",
           "DELETE FROM " + Table() + " WHERE target = '" + std::string{kHealthy} + "'");
    }
  }

  Options options_;
  Connection monitor_;
  std::string schema_;
  Clock::time_point started_;
  bool schema_stream_index_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"outbox-claim-bench: the claim's cost while a target is paused (issue #14)"};
  Options options;
  const char* url = std::getenv("OUTBOX_TEST_PG_URL");
  options.pg_url = url != nullptr ? url : "";
  app.add_option("--pg", options.pg_url, "PostgreSQL URL (default $OUTBOX_TEST_PG_URL)");
  app.add_option("--paused", options.paused, "paused backlogs for the claim measurements")
      ->delimiter(',')
      ->check(CLI::Range(0, 100000000));
  app.add_option("--healthy", options.healthy, "healthy messages behind them")
      ->check(CLI::Range(1, 100000000));
  app.add_option("--drain-paused", options.drain_paused, "paused backlogs for the drains")
      ->delimiter(',')
      ->check(CLI::Range(0, 100000000));
  app.add_option("--drain-healthy", options.drain_healthy, "healthy messages drained")
      ->check(CLI::Range(1, 100000000));
  app.add_option("--batch", options.batch, "messages per claim")->check(CLI::Range(1, 100000));
  app.add_option("--streams", options.streams, "streams per target")->check(CLI::Range(1, 1000000));
  app.add_option("--payload", options.payload, "payload bytes")->check(CLI::Range(14, 1048576));
  app.add_option("--repeat", options.repeat, "EXPLAIN runs per variant")->check(CLI::Range(1, 100));
  app.add_option("--drain-seconds", options.drain_seconds, "bound of each drain")
      ->check(CLI::Range(1, 3600));
  app.add_option("--max-seconds", options.max_seconds, "bound of the whole run")
      ->check(CLI::Range(1, 86400));
  app.add_flag("--plans", options.plans, "print each variant's plan");
  app.add_option("--fillfactor", options.fillfactor, "the messages table's fillfactor")
      ->check(CLI::Range(10, 100));
  app.add_option("--statement-timeout", options.statement_timeout,
                 "statement_timeout of every connection, seconds")
      ->check(CLI::Range(1, 3600));
  CLI11_PARSE(app, argc, argv);
  // Every connection, the store's too, gives up on a statement after this (a claim that walks a
  // large table per candidate would otherwise run for many minutes).
  const std::string pgoptions =
      "-c statement_timeout=" + std::to_string(options.statement_timeout) + "s";
  setenv("PGOPTIONS", pgoptions.c_str(), 1);
  if (options.pg_url.empty()) {
    std::fprintf(stderr, "no PostgreSQL: set OUTBOX_TEST_PG_URL (scripts/services env) or --pg\n");
    return 2;
  }
  try {
    Bench{options}.Run();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "outbox-claim-bench: %s\n", error.what());
    return 1;
  }
  return 0;
}
