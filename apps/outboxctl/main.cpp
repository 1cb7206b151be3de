// outboxctl: the admin CLI. Today: migrate and status; list, show, replay, abandon and purge are
// still to come (see README).
//
// Exit codes: 0 success, 1 the database failed or refused, 2 bad command line.

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "outbox/core/version.h"
#include "outbox/store/postgres.h"

namespace {
constexpr int kExitUsage = 2;

constexpr int kExitFailure = 1;

int Migrate(const std::string& db, const std::string& schema) {
  const int before = outbox::postgres::Migrate(db, schema);
  const int latest = outbox::postgres::LatestSchemaVersion();
  if (before == latest) {
    std::cout << "schema " << schema << " is up to date (version " << latest << ")\n";
  } else {
    std::cout << "schema " << schema << " migrated from version " << before << " to " << latest
              << "\n";
  }
  return 0;
}

std::string Age(const std::optional<std::chrono::milliseconds>& age) {
  if (!age) return "-";
  const auto ms = age->count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms < 120000) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms / 60000) + " min";
}

int Status(const std::string& db, const std::string& schema, bool json) {
  auto store = outbox::postgres::OpenStore({.conninfo = db, .schema = schema});
  const auto stats = store->Stats();
  const char* approx = stats.counts_estimated ? "~" : "";
  if (json) {
    std::cout << "{\"pending\":" << stats.pending << ",\"processing\":" << stats.processing
              << ",\"failed\":" << stats.failed << ",\"abandoned\":" << stats.abandoned
              << ",\"published\":" << stats.published << ",\"oldest_pending_age_ms\":"
              << (stats.oldest_pending_age ? std::to_string(stats.oldest_pending_age->count())
                                           : "null")
              << ",\"active_leases\":" << stats.active_leases
              << ",\"counts_estimated\":" << (stats.counts_estimated ? "true" : "false") << "}\n";
    return 0;
  }
  std::cout << "pending     " << approx << stats.pending << "\n"
            << "processing  " << approx << stats.processing << "\n"
            << "failed      " << approx << stats.failed << "\n"
            << "abandoned   " << approx << stats.abandoned << "\n"
            << "published   " << approx << stats.published << " (retained)\n"
            << "oldest pending  " << Age(stats.oldest_pending_age) << "\n"
            << "relays holding leases  " << stats.active_leases << "\n";
  if (stats.counts_estimated) std::cout << "(~ : estimated by the planner; the count is large)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"outboxctl: inspect and repair an outbox", "outboxctl"};
  app.set_version_flag("--version", std::string{"outboxctl "} + outbox::kVersion);
  std::string db;
  std::string schema{outbox::postgres::kDefaultSchema};
  app.add_option("--db", db,
                 "PostgreSQL connection string (URI or key=value); default: libpq's PG* variables")
      ->envname("OUTBOX_DATABASE_URL");
  app.add_option("--schema", schema, "outbox schema")->envname("OUTBOX_SCHEMA");
  app.require_subcommand(1);
  auto* migrate = app.add_subcommand("migrate", "create or upgrade the outbox schema");
  auto* status = app.add_subcommand("status", "message counts by status, oldest pending age");
  bool json = false;
  status->add_flag("--json", json, "print JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version are "errors" that exit 0; everything else is a usage error: 2.
    return app.exit(error) == 0 ? 0 : kExitUsage;
  }

  try {
    if (migrate->parsed()) return Migrate(db, schema);
    if (status->parsed()) return Status(db, schema, json);
  } catch (const std::exception& error) {
    std::cerr << "outboxctl: " << error.what() << "\n";
    return kExitFailure;
  }
  return kExitFailure;
}
