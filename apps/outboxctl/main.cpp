// outboxctl: the operator's command line for an outbox: migrate, status, list, show, replay,
// skip, abandon, purge. Run `outboxctl --help` and `outboxctl <command> --help`.
//
// The database is outboxd's: `--config outbox.toml` reads its [database] table through the store
// registry outboxd uses (PostgreSQL or SQLite), or `--db`/`--schema` name a PostgreSQL one. Every
// command is a call on the store's contracts (StoreSettings, Store::Stats, Admin): no SQL here.
// What a store type does not have (WAL mode, a migration script on SQLite) is refused with a
// clear message (exit 2) before anything is changed.
//
// Exit codes:
//   0  success; also a dry run, and a list, replay, skip or abandon that matched nothing
//   1  the database failed or refused: unreachable, schema not migrated, a statement failed
//   2  bad command line or --config file: unknown option, bad status, duration or id, replay or
//      abandon without a selection, abandon without --reason, a [database] table outboxd would
//      refuse, a command the store type has not (nothing is sent to the database)
//   3  not found: `show` of an id that does not exist, or `replay`/`skip`/`abandon` naming an id
//   that
//      does not exist (the ids that do exist are still processed)

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "database_config.h"
#include "duration.h"
#include "format.h"
#include "message_json.h"
#include "outbox/core/error.h"
#include "outbox/core/log_text.h"
#include "outbox/core/utf8.h"
#include "outbox/store/admin.h"
#include "outbox/store/postgres.h"
#include "outbox/store/registry.h"
#include "outbox/store/wal.h"
#include "version_line.h"

namespace {

using outbox::Admin;
using outbox::MessageFilter;
using outbox::MessageId;
using outbox::MessageStatus;
using outbox::MessageStatusName;
using outbox::MessageSummary;
using outbox::apps::DetailJson;
using outbox::apps::FormatTime;
using outbox::apps::SummaryJson;
using outboxctl::FormatDuration;
using outboxctl::OneLine;
using Json = nlohmann::ordered_json;  // keys in the order written: id first

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
constexpr int kExitNotFound = 3;

// Ids printed after "replayed N messages:" before the rest is summarized.
constexpr std::size_t kIdsShown = 50;

// A command line that is well-formed for CLI11 but still wrong (exit 2).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

MessageId ParseId(const std::string& text) {
  try {
    return outbox::apps::ParseMessageId(text);
  } catch (const std::invalid_argument& error) {
    throw UsageError(error.what());
  }
}

std::chrono::milliseconds Since(outbox::TimePoint earlier, outbox::TimePoint later) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(later - earlier);
}

std::string Plural(std::int64_t count, const char* noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

// --status, --topic, --stream, --target, --event, --older-than and (for replay and abandon)
// positional ids.
class FilterOptions {
 public:
  void Add(CLI::App* command, bool with_ids, const std::string& statuses) {
    status_ = command->add_option("--status", status_text_, "only this status: " + statuses);
    topic_ = command->add_option("--topic", topic_text_, "only this topic");
    stream_ = command->add_option("--stream", stream_text_, "only this stream key");
    target_ = command->add_option("--target", target_text_, "only this target (sink)");
    event_ = command->add_option("--event", event_text_,
                                 "only the copies of this event (an event id: the messages "
                                 "written together to several targets share one)");
    older_than_ = command->add_option("--older-than", older_than_text_,
                                      "only messages created longer ago than this: 30s, 10m, 2h, "
                                      "30d (on the database's clock)");
    if (with_ids) ids_ = command->add_option("ids", id_texts_, "message ids");
  }

  [[nodiscard]] CLI::Option* status_option() const { return status_; }
  [[nodiscard]] bool HasIds() const { return ids_ != nullptr && ids_->count() > 0; }
  // True when any criterion was given.
  [[nodiscard]] bool Any() const {
    return HasIds() || status_->count() > 0 || topic_->count() > 0 || stream_->count() > 0 ||
           target_->count() > 0 || event_->count() > 0 || older_than_->count() > 0;
  }

  // The filter, or UsageError naming the bad option.
  [[nodiscard]] MessageFilter Build() const {
    MessageFilter filter;
    if (status_->count() > 0) {
      try {
        filter.status = outbox::ParseMessageStatus(status_text_);
      } catch (const std::invalid_argument& error) {
        throw UsageError(std::string{"--status: "} + error.what());
      }
    }
    filter.topic = NonEmpty(topic_, topic_text_);
    filter.stream_key = NonEmpty(stream_, stream_text_);
    filter.target = NonEmpty(target_, target_text_);
    if (event_->count() > 0) {
      try {
        filter.event_id = outbox::apps::ParseMessageId(event_text_);
      } catch (const std::invalid_argument& error) {
        throw UsageError(std::string{"--event: "} + error.what());
      }
    }
    if (older_than_->count() > 0) {
      try {
        filter.older_than = outbox::apps::ParseDuration(older_than_text_);
      } catch (const std::invalid_argument& error) {
        throw UsageError(std::string{"--older-than: "} + error.what());
      }
    }
    if (HasIds()) {
      std::vector<MessageId> ids;
      for (const auto& text : id_texts_) ids.push_back(ParseId(text));
      filter.ids = std::move(ids);
    }
    return filter;
  }

 private:
  static std::optional<std::string> NonEmpty(const CLI::Option* option, const std::string& value) {
    if (option->count() == 0) return std::nullopt;
    if (value.empty()) throw UsageError(option->get_name() + " must not be empty");
    return value;
  }

  CLI::Option* status_ = nullptr;
  CLI::Option* topic_ = nullptr;
  CLI::Option* stream_ = nullptr;
  CLI::Option* target_ = nullptr;
  CLI::Option* event_ = nullptr;
  CLI::Option* older_than_ = nullptr;
  CLI::Option* ids_ = nullptr;
  std::string status_text_;
  std::string topic_text_;
  std::string stream_text_;
  std::string target_text_;
  std::string event_text_;
  std::string older_than_text_;
  std::vector<std::string> id_texts_;
};

// ---- migrate, status ----

int Migrate(const outbox::StoreSettings& database, bool wal_slot) {
  const std::string what = database.Description();
  if (const auto versions = database.MigrateSchema()) {
    if (versions->before == versions->after) {
      std::cout << what << " is up to date (version " << versions->after << ")\n";
    } else {
      std::cout << what << " migrated from version " << versions->before << " to "
                << versions->after << "\n";
    }
  } else {
    std::cout << what
              << " is ready (its tables created or upgraded; outboxd also does this at "
                 "start)\n";
  }
  if (wal_slot) {
    const auto ready = database.EnsureWalSlot();
    std::cout << "WAL slot " << ready.slot << " ready (set " << ready.setting
              << " = 'wal' to use it)\n";
  }
  return 0;
}

// migrate --all: each database in turn, its name before each line; the rest go on after a
// failure, which makes the exit code 1.
int MigrateAll(const outboxctl::AllDatabases& all, bool wal_slot) {
  int failed = 0;
  for (const auto& database : all.databases) {
    std::cout << "database " << (database.name.empty() ? "(the one)" : database.name) << ": "
              << std::flush;
    try {
      Migrate(*database.settings, wal_slot && database.settings->HasWalMode());
    } catch (const std::exception& error) {
      ++failed;
      std::cout << "FAILED: " << outbox::SanitizeForLog(error.what()) << "\n";
    }
  }
  for (const auto& [name, why] : all.refused) {
    ++failed;
    std::cout << "catalog row " << outbox::SanitizeForLog(name)
              << ": not migrated: " << outbox::SanitizeForLog(why) << "\n";
  }
  std::cout << all.databases.size() + all.refused.size() << " database(s), " << failed
            << " failed\n";
  return failed == 0 ? 0 : kExitFailure;
}

std::string Age(const std::optional<std::chrono::milliseconds>& age) {
  if (!age) return "-";
  const auto ms = age->count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms < 120000) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms / 60000) + " min";
}

int Status(const outbox::StoreSettings& database, bool json) {
  const auto stats = database.OpenStore(outbox::RetryPolicy{}, outbox::RetentionPolicy{})->Stats();
  // WAL mode's state where the store has one (PostgreSQL); a store without reads as table mode.
  const outbox::WalStatus wal = database.OpenAdmin(std::chrono::milliseconds{0})
                                    ->Wal()
                                    .value_or(outbox::WalStatus{.delivery = "table"});
  const char* approx = stats.counts_estimated ? "~" : "";
  if (json) {
    std::cout << "{\"pending\":" << stats.pending << ",\"processing\":" << stats.processing
              << ",\"failed\":" << stats.failed << ",\"abandoned\":" << stats.abandoned
              << ",\"published\":" << stats.published << ",\"oldest_pending_age_ms\":"
              << (stats.oldest_pending_age ? std::to_string(stats.oldest_pending_age->count())
                                           : "null")
              << ",\"active_leases\":" << stats.active_leases
              << ",\"live_relays\":" << stats.live_relays
              << ",\"unowned_partitions\":" << stats.unowned_partitions
              << ",\"streams_held\":" << stats.streams_held
              << ",\"counts_estimated\":" << (stats.counts_estimated ? "true" : "false")
              << ",\"delivery\":" << Json(wal.delivery).dump()
              << ",\"wal_topics\":" << wal.wal_topics << ",\"wal_slot\":"
              << (wal.slot ? Json{{"name", *wal.slot},
                                  {"exists", wal.state.exists},
                                  {"active", wal.state.active},
                                  {"wal_status", wal.state.wal_status},
                                  {"position", outbox::FormatLsn(wal.position)},
                                  {"unconfirmed_bytes", wal.state.unconfirmed_bytes},
                                  {"retained_bytes", wal.state.retained_bytes},
                                  {"flush_lag_seconds", wal.state.flush_lag_seconds
                                                            ? Json(*wal.state.flush_lag_seconds)
                                                            : Json(nullptr)},
                                  {"lease_owner", wal.owner ? Json(*wal.owner) : Json(nullptr)}}
                                 .dump()
                           : std::string{"null"})
              << "}\n";
    return 0;
  }
  std::cout << "pending     " << approx << stats.pending << "\n"
            << "processing  " << approx << stats.processing << "\n"
            << "failed      " << approx << stats.failed << "\n"
            << "abandoned   " << approx << stats.abandoned << "\n"
            << "published   " << approx << stats.published << " (retained)\n"
            << "oldest pending  " << Age(stats.oldest_pending_age) << "\n"
            << "relays holding leases  " << stats.active_leases << "\n"
            << "relays live  " << stats.live_relays
            << " (partitions without one: " << stats.unowned_partitions << ")\n";
  if (stats.streams_held > 0) {
    std::cout << "streams held  " << stats.streams_held
              << " (by abandoned messages: outboxctl list --held; release with skip or replay)\n";
  }
  if (stats.counts_estimated) std::cout << "(~ : estimated by the planner; the count is large)\n";
  std::cout << "delivery    " << wal.delivery;
  if (wal.wal_topics > 0) std::cout << " (" << wal.wal_topics << " topics: wal)";
  std::cout << "\n";
  if (wal.slot) {
    std::cout << "WAL slot    " << *wal.slot << ": ";
    if (!wal.state.exists) {
      std::cout << "MISSING (outboxctl migrate --wal-slot)\n";
    } else {
      std::cout << (wal.state.wal_status == "lost" ? "LOST, " : "")
                << (wal.state.active ? "being read" : "NOT being read") << ", read up to "
                << outbox::FormatLsn(wal.position) << ", " << wal.state.unconfirmed_bytes
                << " bytes of WAL since its confirmed position, " << wal.state.retained_bytes
                << " bytes kept for it";
      if (wal.state.flush_lag_seconds) {
        std::cout << ", its reader's confirmations " << *wal.state.flush_lag_seconds << " s behind";
      }
      std::cout << "; lease: " << wal.owner.value_or("none live") << "\n";
    }
  }
  return 0;
}

// ---- list, show ----

void PrintJson(const Json& json) {
  // Text from the database is UTF-8; replace rather than throw if it ever is not.
  std::cout << json.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
}

// What a message is waiting for, in a few words, then its last error.
std::string Detail(const MessageSummary& message, outbox::TimePoint now) {
  std::string detail;
  if (message.status == MessageStatus::kProcessing) {
    detail = "leased by " + message.lease_owner.value_or("?");
    if (message.lease_until) {
      const auto left = Since(now, *message.lease_until);
      detail += left.count() >= 0 ? ", " + FormatDuration(left) + " left"
                                  : ", expired " + FormatDuration(-left) + " ago";
    }
  } else if ((message.status == MessageStatus::kPending ||
              message.status == MessageStatus::kFailed) &&
             message.available_at > now) {
    detail = "retry in " + FormatDuration(Since(now, message.available_at));
  }
  if (message.holds_stream) detail = "holds its stream";
  if (message.last_error) detail += (detail.empty() ? "" : ": ") + *message.last_error;
  return OneLine(detail.empty() ? "-" : detail, 120);
}

std::string Stream(const MessageSummary& message) {
  if (!message.stream_key) return "-";
  std::string stream = OneLine(*message.stream_key, 40);
  if (message.stream_seq) stream += "#" + std::to_string(*message.stream_seq);
  return stream;
}

int List(Admin& admin, const MessageFilter& filter, int limit,
         const std::optional<MessageId>& after, bool json) {
  const auto page = admin.List(filter, limit, after);
  if (json) {
    Json messages = Json::array();
    for (const auto& message : page.messages) messages.push_back(SummaryJson(message));
    PrintJson(
        Json{{"messages", std::move(messages)},
             {"more", page.more},
             {"next_after", page.more ? Json(page.messages.back().id.ToString()) : Json(nullptr)}});
    return 0;
  }
  if (page.messages.empty()) {
    std::cout << "no messages match\n";
    return 0;
  }
  // The EVENT column only when the page holds a copy of a message written to several targets
  // (its event id is another message's id); otherwise it would repeat the ID column.
  const bool copies = std::any_of(page.messages.begin(), page.messages.end(),
                                  [](const MessageSummary& m) { return m.event_id != m.id; });
  std::vector<std::string> header{"ID",     "STATUS", "ATTEMPTS", "TOPIC", "STREAM",
                                  "TARGET", "TYPE",   "AGE",      "BYTES", "DETAIL"};
  if (copies) header.insert(header.begin() + 1, "EVENT");
  outboxctl::Table table{header};
  for (const auto& message : page.messages) {
    std::vector<std::string> row{message.id.ToString(),
                                 std::string{MessageStatusName(message.status)},
                                 std::to_string(message.attempts),
                                 OneLine(message.topic, 40),
                                 Stream(message),
                                 OneLine(message.target, 20),
                                 OneLine(message.type.value_or("-"), 30),
                                 FormatDuration(Since(message.created_at, page.database_now)),
                                 std::to_string(message.payload_bytes),
                                 Detail(message, page.database_now)};
    if (copies) row.insert(row.begin() + 1, message.event_id.ToString());
    table.Add(row);
  }
  std::cout << table.Render();
  if (page.more) std::cout << "more: --after " << page.messages.back().id.ToString() << "\n";
  return 0;
}

int Show(Admin& admin, const MessageId& id, bool json) {
  const auto found = admin.Show(id);
  if (!found) {
    std::cerr << "outboxctl: message " << id.ToString() << " not found\n";
    return kExitNotFound;
  }
  const auto& detail = *found;
  const auto& message = detail.summary;
  const bool text = outbox::IsPrintableUtf8(detail.payload);
  if (json) {
    PrintJson(DetailJson(detail));
    return 0;
  }
  const auto now = detail.database_now;
  const auto when = [now](const std::optional<outbox::TimePoint>& time) -> std::string {
    if (!time) return "-";
    const auto since = Since(*time, now);
    return FormatTime(*time) + (since.count() >= 0 ? " (" + FormatDuration(since) + " ago)"
                                                   : " (in " + FormatDuration(-since) + ")");
  };
  outboxctl::Table fields{{"id", message.id.ToString()}};
  fields.Add({"event", message.event_id.ToString() +
                           (message.event_id == message.id
                                ? ""
                                : " (a copy: outboxctl list --event " +
                                      message.event_id.ToString() + " lists them all)")});
  fields.Add({"status", std::string{MessageStatusName(message.status)}});
  fields.Add({"attempts", std::to_string(message.attempts)});
  fields.Add({"topic", OneLine(message.topic, 1000)});
  fields.Add({"stream",
              Stream(message) + (message.holds_stream ? " (held by this message: outboxctl skip or "
                                                        "replay releases it)"
                                                      : "")});
  fields.Add({"partition", std::to_string(message.partition)});
  fields.Add({"target", OneLine(message.target, 1000)});
  fields.Add({"type", OneLine(message.type.value_or("-"), 1000)});
  fields.Add({"created", when(message.created_at)});
  fields.Add({"available", when(message.available_at)});
  if (detail.published_at) fields.Add({"published", when(detail.published_at)});
  if (detail.abandoned_at) fields.Add({"abandoned", when(detail.abandoned_at)});
  fields.Add({"last error", OneLine(message.last_error.value_or("-"), 4000)});
  if (message.lease_owner) {
    fields.Add({"lease", OneLine(*message.lease_owner, 200) + " until " +
                             when(message.lease_until) + ", epoch " +
                             std::to_string(detail.lease_epoch)});
  }
  fields.Add({"content type", OneLine(detail.content_type, 200)});
  std::cout << fields.Render();
  std::cout << "headers" << (detail.headers.empty() ? "       -" : "") << "\n";
  for (const auto& [name, value] : detail.headers) {
    std::cout << "  " << OneLine(name, 200) << ": " << OneLine(value, 4000) << "\n";
  }
  std::cout << "payload (" << Plural(static_cast<std::int64_t>(detail.payload.size()), "byte")
            << (text ? ", text" : ", hex") << ")\n";
  if (text) {
    std::cout << detail.payload;
    if (!detail.payload.empty() && detail.payload.back() != '\n') std::cout << "\n";
  } else {
    std::cout << outbox::apps::Hex(detail.payload, 32) << "\n";
  }
  return 0;
}

// ---- replay, skip, abandon ----

enum class Change : std::uint8_t { kReplay, kSkip, kAbandon };

const char* Verb(Change change) {
  switch (change) {
    case Change::kReplay:
      return "replay";
    case Change::kSkip:
      return "skipp";  // + "ed"
    case Change::kAbandon:
      return "abandon";
  }
  return "change";
}

// Why a named message was left alone.
std::string WhyUntouched(Change change, const MessageSummary& message) {
  const std::string status{MessageStatusName(message.status)};
  switch (message.status) {
    case MessageStatus::kProcessing:
      return "processing: leased by " + message.lease_owner.value_or("a relay") + ", left alone";
    case MessageStatus::kAbandoned:
      if (change == Change::kSkip && !message.holds_stream) {
        return "abandoned, not holding its stream: nothing to skip";
      }
      return change == Change::kAbandon ? "abandoned already" : status + ", but not selected";
    case MessageStatus::kPending:
      if (change == Change::kSkip) return status + ": not abandoned, nothing to skip";
      return change == Change::kReplay ? "pending already" : status + ", but not selected";
    case MessageStatus::kFailed:
      return change == Change::kSkip ? status + ": not abandoned, nothing to skip"
                                     : status + ", but not selected";
    case MessageStatus::kPublished:
      return "published";
  }
  return status;
}

int RunChange(Admin& admin, Change change, const MessageFilter& filter, const std::string& reason,
              bool dry_run) {
  const auto result = change == Change::kReplay ? admin.Replay(filter, dry_run)
                      : change == Change::kSkip ? admin.Skip(filter, dry_run)
                                                : admin.Abandon(filter, reason, dry_run);
  const std::string verb = Verb(change);
  const std::string base = change == Change::kSkip ? "skip" : verb;
  std::cout << (dry_run ? "would " + base : verb + "ed") << " " << Plural(result.count, "message");
  if (!result.ids.empty()) {
    std::cout << ":";
    const std::size_t shown = std::min(result.ids.size(), kIdsShown);
    for (std::size_t i = 0; i < shown; ++i) std::cout << " " << result.ids[i].ToString();
    if (shown < result.ids.size()) {
      std::cout << " ... and " << result.ids.size() - shown
                << " more (see them with outboxctl list)";
    }
  }
  std::cout << "\n";

  // Named ids that were not changed: say why, and whether they exist at all.
  int code = 0;
  if (!filter.ids) return code;
  const std::set<MessageId> changed(result.ids.begin(), result.ids.end());
  std::vector<MessageId> untouched;
  for (const auto& id : *filter.ids) {
    if (!changed.contains(id) &&
        std::find(untouched.begin(), untouched.end(), id) == untouched.end()) {
      untouched.push_back(id);
    }
  }
  if (untouched.empty()) return code;
  if (untouched.size() > static_cast<std::size_t>(Admin::kMaxListLimit)) {
    untouched.resize(static_cast<std::size_t>(Admin::kMaxListLimit));
  }
  MessageFilter lookup;
  lookup.ids = untouched;
  const auto page = admin.List(lookup, static_cast<int>(untouched.size()));
  for (const auto& id : untouched) {
    const auto found = std::find_if(page.messages.begin(), page.messages.end(),
                                    [&id](const MessageSummary& m) { return m.id == id; });
    if (found == page.messages.end()) {
      std::cerr << "outboxctl: message " << id.ToString() << " not found\n";
      code = kExitNotFound;
    } else {
      std::cout << "not " << verb << "ed: " << id.ToString() << " (" << WhyUntouched(change, *found)
                << ")\n";
    }
  }
  return code;
}

int Purge(Admin& admin, const outbox::RetentionPolicy& retention) {
  const auto deleted = admin.Purge(retention, 1000);
  std::cout << "purged " << Plural(deleted, "message") << " (published older than "
            << outboxctl::FormatRetention(retention.published) << ", abandoned older than "
            << outboxctl::FormatRetention(retention.abandoned) << ")\n";
  return 0;
}

std::chrono::seconds DurationOption(const std::string& option, const std::string& text) {
  try {
    return outbox::apps::ParseDuration(text);
  } catch (const std::invalid_argument& error) {
    throw UsageError(option + ": " + error.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"outboxctl: inspect and repair an outbox", "outboxctl"};
  app.set_version_flag("--version", outbox::apps::VersionLine("outboxctl"));
  app.footer(
      "Exit codes: 0 success, 1 database failure or refusal, 2 bad command line, 3 not found.\n\n"
      "Documentation: docs/operations.md in the outbox source tree (every command, its output,\n"
      "the admin API, metrics and alerts); docs/wal-mode.md for migrate --wal-slot.");
  std::string config_path;
  auto* config_option = app.add_option(
      "-c,--config", config_path,
      "outboxd's configuration file: its [database] table names the database (PostgreSQL or "
      "SQLite); its other sections are not read");
  std::string db;
  std::string schema{outbox::postgres::kDefaultSchema};
  // The environment is read below, not by CLI11: a variable set for other tools must not clash
  // with --config.
  auto* db_option = app.add_option("--db", db,
                                   "PostgreSQL connection string (URI or key=value); default: "
                                   "OUTBOX_DATABASE_URL, else libpq's PG* variables");
  auto* schema_option = app.add_option(
      "--schema", schema, "outbox schema (PostgreSQL); default: OUTBOX_SCHEMA or outbox");
  std::string database_name;
  auto* database_option = app.add_option(
      "--database", database_name,
      "with --config naming many databases ([[databases]], [discovery]): the one of this name "
      "(the catalog is read when the file does not list it)");
  app.require_subcommand(1);
  app.fallthrough();  // --config, --db and --schema may also follow the command

  auto* migrate = app.add_subcommand("migrate", "create or upgrade the outbox schema");
  bool print_sql = false;
  int migrate_from = 0;
  migrate->add_flag("--print-sql", print_sql,
                    "print the migration SQL instead of running it (for a migration tool or a "
                    "DBA; apply it in one transaction); needs no database");
  auto* from_option = migrate->add_option(
      "--from", migrate_from,
      "with --print-sql: the schema version the database is at (0: a new database)");
  bool migrate_all = false;
  migrate->add_flag("--all", migrate_all,
                    "with --config naming many databases: every one of them ([[databases]] and "
                    "the catalog's rows), one after the other; a failure does not stop the rest");
  bool wal_slot = false;
  migrate->add_flag("--wal-slot", wal_slot,
                    "also create the logical replication slot (and publication) WAL mode reads; "
                    "needs wal_level = logical and the REPLICATION attribute");

  auto* status = app.add_subcommand("status", "message counts by status, oldest pending age");
  bool status_json = false;
  status->add_flag("--json", status_json, "print JSON");

  auto* list = app.add_subcommand("list", "list messages in id (creation) order, a page at a time");
  FilterOptions list_filter;
  list_filter.Add(list, /*with_ids=*/false, "pending, processing, failed, published or abandoned");
  int limit = 50;
  std::string after_text;
  bool list_json = false;
  list->add_option("--limit", limit, "messages per page (1-10000)")->capture_default_str();
  auto* after_option = list->add_option("--after", after_text,
                                        "start after this id (the last of the previous page)");
  list->add_flag("--json", list_json, "print JSON: {messages, more, next_after}");
  bool list_held = false;
  list->add_flag("--held", list_held,
                 "only abandoned messages that hold their stream (on_abandon = \"hold\"): one "
                 "per held stream");

  auto* show = app.add_subcommand("show", "one message in full, with its payload and headers");
  std::string show_id;
  bool show_json = false;
  show->add_option("id", show_id, "message id")->required();
  show->add_flag("--json", show_json, "print JSON");

  auto* replay = app.add_subcommand(
      "replay",
      "make abandoned (and failed) messages pending again, with attempts reset; never touches "
      "processing rows");
  FilterOptions replay_filter;
  replay_filter.Add(replay, /*with_ids=*/true, "abandoned or failed");
  bool all_abandoned = false;
  bool replay_dry_run = false;
  replay->add_flag("--all-abandoned", all_abandoned, "every abandoned message")
      ->excludes(replay_filter.status_option());
  replay->add_flag("--dry-run", replay_dry_run, "show what would be replayed; change nothing");

  auto* skip = app.add_subcommand(
      "skip",
      "let the streams held by abandoned messages (on_abandon = \"hold\") go on past them; the "
      "messages stay abandoned");
  FilterOptions skip_filter;
  skip_filter.Add(skip, /*with_ids=*/true, "abandoned");
  bool all_held = false;
  bool skip_dry_run = false;
  skip->add_flag("--all-held", all_held, "every message that holds its stream");
  skip->add_flag("--dry-run", skip_dry_run, "show what would be skipped; change nothing");

  auto* abandon = app.add_subcommand(
      "abandon", "give up on pending or failed messages; never touches processing rows");
  FilterOptions abandon_filter;
  abandon_filter.Add(abandon, /*with_ids=*/true, "pending or failed");
  std::string reason;
  bool abandon_dry_run = false;
  abandon->add_option("--reason", reason, "why; recorded as the message's last error")->required();
  abandon->add_flag("--dry-run", abandon_dry_run, "show what would be abandoned; change nothing");

  auto* purge = app.add_subcommand(
      "purge", "delete published and abandoned messages older than their retention");
  std::string purge_published = "0s";
  std::string purge_abandoned = "30d";
  purge->add_option("--published", purge_published, "retention of published messages")
      ->capture_default_str();
  purge->add_option("--abandoned", purge_abandoned, "retention of abandoned messages")
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version are "errors" that exit 0; everything else is a usage error: 2.
    return app.exit(error) == 0 ? 0 : kExitUsage;
  }

  try {
    // Check the whole command line before connecting to anything.
    MessageFilter filter;
    std::optional<MessageId> after;
    std::optional<MessageId> id;
    outbox::RetentionPolicy retention;
    if (migrate->parsed() && from_option->count() > 0 && !print_sql) {
      throw UsageError("migrate: --from is for --print-sql; migrate itself reads the version");
    }
    if (migrate->parsed() && wal_slot && print_sql) {
      throw UsageError("migrate: --wal-slot creates a slot on the server; not with --print-sql");
    }
    if (list->parsed()) {
      filter = list_filter.Build();
      if (limit < 1 || limit > Admin::kMaxListLimit) {
        throw UsageError("--limit must be between 1 and " + std::to_string(Admin::kMaxListLimit) +
                         ", got " + std::to_string(limit));
      }
      if (after_option->count() > 0) after = ParseId(after_text);
      filter.held = list_held;
    } else if (show->parsed()) {
      id = ParseId(show_id);
    } else if (replay->parsed()) {
      filter = replay_filter.Build();
      if (all_abandoned) filter.status = MessageStatus::kAbandoned;
      if (!all_abandoned && !replay_filter.Any()) {
        throw UsageError(
            "replay: say which messages: ids, --all-abandoned, or a filter (--status, --topic, "
            "--stream, --target, --event, --older-than); refusing to replay everything");
      }
      if (filter.status && *filter.status != MessageStatus::kAbandoned &&
          *filter.status != MessageStatus::kFailed) {
        throw UsageError("replay: --status must be abandoned or failed (only those are replayed)");
      }
    } else if (skip->parsed()) {
      filter = skip_filter.Build();
      filter.held = true;
      if (!all_held && !skip_filter.Any()) {
        throw UsageError(
            "skip: say which messages: ids, --all-held, or a filter (--topic, --stream, --target, "
            "--event, --older-than); refusing to skip everything");
      }
      if (filter.status && *filter.status != MessageStatus::kAbandoned) {
        throw UsageError(
            "skip: --status must be abandoned (only held abandoned messages are "
            "skipped)");
      }
    } else if (abandon->parsed()) {
      filter = abandon_filter.Build();
      if (!abandon_filter.Any()) {
        throw UsageError(
            "abandon: say which messages: ids or a filter (--status, --topic, --stream, --target, "
            "--event, --older-than); refusing to abandon everything");
      }
      if (filter.status && *filter.status != MessageStatus::kPending &&
          *filter.status != MessageStatus::kFailed) {
        throw UsageError("abandon: --status must be pending or failed (only those are abandoned)");
      }
      if (reason.empty()) throw UsageError("abandon: --reason must not be empty");
    } else if (purge->parsed()) {
      retention.published = DurationOption("--published", purge_published);
      retention.abandoned = DurationOption("--abandoned", purge_abandoned);
    }

    // The database: outboxd's [database] table, or PostgreSQL by --db and --schema.
    if (config_option->count() > 0 && (db_option->count() > 0 || schema_option->count() > 0)) {
      throw UsageError("--config names the database; not with --db or --schema");
    }
    if ((database_option->count() > 0 || migrate_all) && config_option->count() == 0) {
      throw UsageError(std::string{database_option->count() > 0 ? "--database" : "migrate --all"} +
                       " needs --config (the file that names the databases)");
    }
    if (migrate_all && (database_option->count() > 0 || print_sql)) {
      throw UsageError("migrate --all: not with --database or --print-sql");
    }
    const outbox::config::GetenvFn getenv = [](const char* name) -> const char* {
      return std::getenv(name);
    };
    if (migrate_all) {
      outboxctl::AllDatabases all;
      try {
        all = outboxctl::LoadAllDatabases(config_path, getenv);
      } catch (const outbox::ConfigError& error) {
        throw UsageError(config_path + ": " + error.what());
      }
      return MigrateAll(all, wal_slot);
    }
    outboxctl::Database database;
    if (config_option->count() > 0) {
      try {
        database = outboxctl::LoadDatabase(config_path, getenv, database_name);
      } catch (const outbox::ConfigError& error) {
        throw UsageError(config_path + ": " + error.what());
      }
    } else {
      if (const char* env = std::getenv("OUTBOX_DATABASE_URL");
          db_option->count() == 0 && env != nullptr) {
        db = env;
      }
      if (const char* env = std::getenv("OUTBOX_SCHEMA");
          schema_option->count() == 0 && env != nullptr && *env != '\0') {
        schema = env;
      }
      database = outboxctl::PostgresDatabase(db, schema);
    }
    const outbox::StoreSettings& store = *database.settings;
    if (migrate->parsed() && wal_slot && !store.HasWalMode()) {
      throw UsageError("migrate --wal-slot: " + store.Description() +
                       " has no WAL mode (only PostgreSQL has one); nothing was changed");
    }

    if (migrate->parsed() && print_sql) {
      std::optional<std::string> script;
      try {
        script = store.MigrationScript(migrate_from);
      } catch (const std::invalid_argument& error) {
        throw UsageError(error.what());
      }
      if (!script) {
        throw UsageError("migrate --print-sql: " + store.Description() +
                         " has no migration script; `outboxctl migrate` (or outboxd at start) "
                         "readies it");
      }
      std::cout << *script;
      return 0;
    }
    if (migrate->parsed()) return Migrate(store, wal_slot);
    if (status->parsed()) return Status(store, status_json);
    auto admin = store.OpenAdmin(std::chrono::milliseconds{0});
    if (list->parsed()) return List(*admin, filter, limit, after, list_json);
    if (show->parsed()) return Show(*admin, *id, show_json);
    if (replay->parsed()) return RunChange(*admin, Change::kReplay, filter, "", replay_dry_run);
    if (skip->parsed()) return RunChange(*admin, Change::kSkip, filter, "", skip_dry_run);
    if (abandon->parsed()) {
      return RunChange(*admin, Change::kAbandon, filter, reason, abandon_dry_run);
    }
    if (purge->parsed()) return Purge(*admin, retention);
  } catch (const UsageError& error) {
    // Errors may quote the command line or the database (its error texts, a topic, a reason):
    // control characters escaped, length bounded (outbox/core/log_text.h).
    std::cerr << "outboxctl: " << outbox::SanitizeForLog(error.what())
              << "\nRun with --help for more information.\n";
    return kExitUsage;
  } catch (const std::exception& error) {
    std::cerr << "outboxctl: " << outbox::SanitizeForLog(error.what()) << "\n";
    return kExitFailure;
  }
  return kExitFailure;
}
