// outboxd: the relay daemon. Publishes committed outbox messages to brokers, with confirms.
//
//   outboxd --config outbox.toml [--check-config] [--log-level LEVEL]
//
// Exit codes: 0 clean shutdown (SIGTERM/SIGINT: drain, release leases, exit), 1 runtime failure
// or a drain longer than relay.shutdown_timeout, 2 bad command line or configuration, 130 a second
// signal during the drain (exit at once). After 1 or 130 the leases expire and another relay, or
// this one restarted, publishes what was in flight.

#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "config.h"
#include "discovery.h"
#include "operations.h"
#include "outbox/core/error.h"
#include "outbox/core/log_text.h"
#include "outbox/core/secrets.h"
#include "outbox/core/version.h"
#include "outbox/observe/metrics.h"
#include "outbox/relay/relay_config.h"
#include "service_manager.h"
#include "version_line.h"

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
constexpr int kExitSecondSignal = 130;

std::shared_ptr<spdlog::logger> MakeLogger(const outbox::outboxd::Config& config, bool journal) {
  auto logger = spdlog::stderr_logger_mt("outboxd");
  logger->set_level(spdlog::level::from_str(config.log_level));
  if (config.log_format == "json") {
    logger->set_pattern("%v");  // each message is rendered as a whole JSON object below
  } else if (journal) {
    logger->set_pattern("%v");  // the journal has the time; MakeLogFn puts the priority first
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %l %v");
  }
  return logger;
}

// Every log line of outboxd passes here, the libraries' (through the LogFn) and main's own. A
// message may carry text from outside (abandon reasons, topics, ids, broker and database errors),
// so it is sanitized here, once (outbox/core/log_text.h): both formats redact the configured
// secrets first (outbox/core/secrets.h); the plain format escapes control characters and invalid
// UTF-8 and bounds the length; the JSON format bounds the length and lets the JSON library escape
// (invalid UTF-8 becomes U+FFFD). On the journal, a plain line starts with its syslog priority
// ("<3>" for an error), so `journalctl -p warning` finds it.
outbox::LogFn MakeLogFn(std::shared_ptr<spdlog::logger> logger, bool json, bool journal) {
  return [logger = std::move(logger), json, journal](outbox::LogLevel level,
                                                     std::string_view message) {
    const auto spd = level == outbox::LogLevel::kDebug  ? spdlog::level::debug
                     : level == outbox::LogLevel::kInfo ? spdlog::level::info
                     : level == outbox::LogLevel::kWarn ? spdlog::level::warn
                                                        : spdlog::level::err;
    if (!logger->should_log(spd)) return;
    if (!json && journal) {
      const int priority = spd == spdlog::level::debug  ? 7
                           : spd == spdlog::level::info ? 6
                           : spd == spdlog::level::warn ? 4
                                                        : 3;
      logger->log(spd, "<{}>{}", priority, outbox::SanitizeForLog(message));
      return;
    }
    if (!json) {
      logger->log(spd, "{}", outbox::SanitizeForLog(message));
      return;
    }
    const auto now = std::chrono::system_clock::now();
    // As a std::string: nlohmann::json writes spdlog's string_view_t as an array of bytes.
    const auto level_name = spdlog::level::to_string_view(spd);
    const nlohmann::json line = {
        {"time_ms",
         std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count()},
        {"level", std::string{level_name.data(), level_name.size()}},
        {"msg", outbox::BoundForLog(message)}};
    logger->log(
        spd, "{}",
        line.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace));
  };
}

outbox::SinkMap OpenSinks(const outbox::outboxd::Config& config,
                          const outbox::SinkContext& context) {
  outbox::SinkMap sinks;
  for (const auto& sink : config.sinks) {
    // The sinks name their own keys ("url"); the user wrote "sinks.<name>.url".
    try {
      sinks.emplace(sink.name, sink.settings->Open(context));
    } catch (const outbox::ConfigError& error) {
      throw outbox::ConfigError("sinks." + sink.name + "." + error.key(), error.message());
    }
  }
  return sinks;
}

outbox::RelayGroup::Settings RelaySettingsOf(const outbox::outboxd::Config& config) {
  outbox::RelayGroup::Settings settings{
      .relay = config.relay, .retry = config.retry, .retention = config.retention};
  for (const auto& sink : config.sinks) {
    if (sink.rate_limit) settings.rate_limits.emplace(sink.name, *sink.rate_limit);
  }
  return settings;
}

// Everything a start checks before it needs the database or the network, run by --check-config
// as a start runs it, so that the two refuse the same configurations (exit 2): the sinks' options
// (by building the sinks), the relays' options (RelayGroup::Check), and
// the metric families (by registering the operations side's series in a registry of its own; the
// relay's per-target series follow the same rule, observe::SeriesPerTarget). What only the
// database or the network can tell (reachable, migrated, the listen port free) is not checked.
void CheckStart(const outbox::outboxd::Config& config) {
  const outbox::SinkMap sinks = OpenSinks(config, outbox::SinkContext{});
  if (config.database) outbox::RelayGroup::Check(RelaySettingsOf(config), *config.database);
  for (const auto& database : config.databases) {
    try {
      outbox::RelayGroup::Check(RelaySettingsOf(config), *database.settings);
    } catch (const outbox::ConfigError& error) {
      throw outbox::ConfigError("databases." + database.name + "." + error.key(), error.message());
    }
  }
  outbox::observe::Registry registry;
  const outbox::RelayCounters counters;
  const outbox::outboxd::Operations operations(
      config, registry, outbox::outboxd::Operations::TotalsOf(counters), outbox::LogFn{});
}

// What main will exit with once its drain is done; kDraining until then.
constexpr int kDraining = -1;

// What the signal thread needs of main: how to stop the relays while they exist, and the code main
// will exit with once its drain is done.
struct Shutdown {
  std::mutex mutex;
  std::function<void()> stop;                         // guarded by mutex; set while relays exist
  outbox::outboxd::Operations* operations = nullptr;  // guarded by mutex; likewise
  std::atomic<int> exit_code{kDraining};
};

// Waits for SIGTERM/SIGINT on a thread of its own (the signals are blocked everywhere else),
// started before outboxd reaches the database: a signal while it starts (the database may not
// answer) exits at once, 0, as nothing was claimed yet. Once the relays run, the first asks them to
// drain, a second exits at once, and so does a drain that outlasts `shutdown_timeout` (a broker
// that never confirms, a database that does not answer). The process ends by shutdown_timeout
// whatever it waits for: a drain that finished (`exit_code` set) but whose closing still waits
// (the stats thread on a silent database, issue #40) exits with the drain's code at that time.
void HandleSignals(Shutdown& shutdown, const outbox::LogFn& log,
                   const std::shared_ptr<spdlog::logger>& logger, const sigset_t& signals,
                   std::chrono::milliseconds shutdown_timeout) {
  const std::atomic<int>& exit_code = shutdown.exit_code;
  int signal = 0;
  if (sigwait(&signals, &signal) != 0) return;
  {
    // Held while the relays are asked to stop: main cannot destroy them meanwhile.
    std::lock_guard lock(shutdown.mutex);
    if (!shutdown.stop) {
      const int code = exit_code.load();
      log(outbox::LogLevel::kInfo,
          "received " + std::string{strsignal(signal)} +
              (code == kDraining ? " while starting: exiting (nothing was claimed yet)"
                                 : " while closing: exiting"));
      logger->flush();
      _exit(code == kDraining ? 0 : code);
    }
    log(outbox::LogLevel::kInfo, "received " + std::string{strsignal(signal)} +
                                     ": draining (send it again to exit at once)");
    outbox::outboxd::NotifyStopping(shutdown_timeout);
    if (shutdown.operations != nullptr) shutdown.operations->BeginDrain();
    shutdown.stop();
  }
  // Waits out the rest of the timeout when interrupted (EINTR): a tracer attaching does that
  // (LeakSanitizer's check at exit, a debugger), and main may have returned by then, its log
  // function gone.
  const auto until = std::chrono::steady_clock::now() + shutdown_timeout;
  do {
    const auto left = std::max(std::chrono::nanoseconds{0},
                               std::chrono::nanoseconds{until - std::chrono::steady_clock::now()});
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(left);
    const timespec timeout{.tv_sec = static_cast<time_t>(seconds.count()),
                           .tv_nsec = static_cast<long>((left - seconds).count())};
    signal = sigtimedwait(&signals, nullptr, &timeout);
  } while (signal < 0 && errno == EINTR);
  if (signal > 0) {
    log(outbox::LogLevel::kWarn,
        "received " + std::string{strsignal(signal)} + " again: exiting without draining");
    logger->flush();
    _exit(kExitSecondSignal);
  }
  // Timed out (EAGAIN). Main may
  // be on its way out already, or stuck closing after its drain: end it either way.
  if (const int code = exit_code.load(); code != kDraining) {
    log(outbox::LogLevel::kWarn,
        "the drain finished, but closing did not within relay.shutdown_timeout (" +
            std::to_string(shutdown_timeout.count()) + " ms): exiting");
    logger->flush();
    _exit(code);
  }
  log(outbox::LogLevel::kError,
      "the drain did not finish within relay.shutdown_timeout (" +
          std::to_string(shutdown_timeout.count()) +
          " ms): exiting; what it held is published again once its leases expire");
  logger->flush();
  _exit(kExitFailure);
}

// From its construction until its destruction (while the relays exist), a signal drains the
// relays through `stop` and tells `operations` (Shutdown).
class ArmedShutdown {
 public:
  ArmedShutdown(Shutdown& shutdown, std::function<void()> stop,
                outbox::outboxd::Operations* operations)
      : shutdown_(shutdown) {
    std::lock_guard lock(shutdown_.mutex);
    shutdown_.stop = std::move(stop);
    shutdown_.operations = operations;
  }
  ~ArmedShutdown() {
    std::lock_guard lock(shutdown_.mutex);
    shutdown_.stop = nullptr;
    shutdown_.operations = nullptr;
  }
  ArmedShutdown(const ArmedShutdown&) = delete;
  ArmedShutdown& operator=(const ArmedShutdown&) = delete;

 private:
  Shutdown& shutdown_;
};

// The last line of a run: what the relays did since start.
void LogBye(const outbox::LogFn& log_fn, std::uint64_t published, std::uint64_t failed,
            std::uint64_t unconfirmed) {
  log_fn(outbox::LogLevel::kInfo, "published " + std::to_string(published) + " messages, " +
                                      std::to_string(failed) + " failed attempts, " +
                                      std::to_string(unconfirmed) + " republished; bye");
}

// Runs a start and its relays; a configuration refused then exits 2, anything else thrown 1.
template <typename Run>
int ExitCodeOf(const outbox::LogFn& log_fn, Run&& run) {
  try {
    return run();
  } catch (const outbox::ConfigError& error) {
    log_fn(outbox::LogLevel::kError, std::string{"configuration: "} + error.what());
    return kExitUsage;
  } catch (const std::exception& error) {
    log_fn(outbox::LogLevel::kError, error.what());
    return kExitFailure;
  }
}

// A database costs its relay about four file descriptors (three connections, a wake-up pipe):
// 500 of them pass the soft limit of 1,024 that most systems start a process with. The hard limit
// (systemd's default 524,288) is what the administrator allows, so outboxd takes it, as a server
// holding many connections does; it says so when the soft limit was lower, and what it got.
void RaiseOpenFileLimit(const outbox::LogFn& log_fn) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  const rlim_t was = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  log_fn(outbox::LogLevel::kInfo, "open files: soft limit raised from " + std::to_string(was) +
                                      " to the hard limit " + std::to_string(limit.rlim_max));
}

// Many databases ([[databases]], [discovery]): one dispatcher over the sinks, a relay per
// database (TenantRelays), the discovery keeping the set current, the operations side on them.
int RunManyDatabases(const outbox::outboxd::Config& config, Shutdown& shutdown,
                     const outbox::LogFn& log_fn, const std::shared_ptr<spdlog::logger>& logger) {
  RaiseOpenFileLimit(log_fn);
  return ExitCodeOf(log_fn, [&] {
    outbox::observe::Registry registry;
    outbox::TenantRelays relays(RelaySettingsOf(config),
                                OpenSinks(config, {.log = log_fn, .lease = config.relay.lease}),
                                registry, log_fn);
    std::unique_ptr<outbox::Catalog> catalog;
    if (config.discovery) {
      catalog = outbox::apps::OpenCatalog(*config.discovery);
    }
    outbox::outboxd::Discovery discovery(config, std::move(catalog), relays, log_fn);
    std::optional<outbox::outboxd::Operations> operations;
    operations.emplace(
        config, registry,
        [&relays] {
          const auto totals = relays.CountersTotal();
          return outbox::observe::RelayTotals{
              .published = totals.published,
              .failed = totals.failed,
              .unconfirmed = totals.unconfirmed,
              .takeovers = totals.takeovers,
              .partitions_owned = totals.partitions_owned,
              .broker_unavailable = relays.dispatcher().AnyPaused(),
          };
        },
        log_fn, [&relays] { return relays.paused_targets(); });
    operations->SetManyDatabases(
        {.states = [&relays] { return relays.States(); },
         .find = [&discovery](const std::string& name) { return discovery.Find(name); },
         .discovery_problem = [&discovery] { return discovery.Problem(); }});
    operations->Start();
    const std::string relaying =
        "relaying " + std::to_string(config.databases.size()) + " database(s)" +
        (config.discovery ? " and those the catalog names (every " +
                                std::to_string(config.discovery->interval.count()) + " ms)"
                          : std::string{}) +
        " as " + config.relay.instance + " to " + std::to_string(config.sinks.size()) + " sink(s)";
    log_fn(outbox::LogLevel::kInfo, "outboxd " + std::string{outbox::kVersion} + " " + relaying);
    const ArmedShutdown armed(
        shutdown,
        [&relays, &discovery] {
          discovery.Stop();
          relays.Stop();
        },
        &*operations);
    discovery.Start();
    outbox::outboxd::NotifyReady(relaying);
    relays.Run();  // until a signal; then every database drains
    discovery.Stop();
    shutdown.exit_code = 0;
    operations->Stop();
    const auto totals = relays.CountersTotal();
    LogBye(log_fn, totals.published, totals.failed, totals.unconfirmed);
    logger->flush();
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"outboxd: publishes committed outbox messages to brokers, with confirms", "outboxd"};
  app.set_version_flag("--version", outbox::apps::VersionLine("outboxd"));
  std::string config_path;
  app.add_option("-c,--config", config_path, "TOML configuration file (see outbox.example.toml)")
      ->envname("OUTBOX_CONFIG");
  bool check_config = false;
  app.add_flag("--check-config", check_config,
               "Validate the configuration, print it with secrets masked, and exit");
  std::string log_level;
  app.add_option("--log-level", log_level, "Override [log] level")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  app.footer(
      "Exit codes: 0 clean stop, 1 runtime failure, 2 bad command line or configuration,\n"
      "130 a second SIGTERM or SIGINT.\n\n"
      "Documentation: docs/outboxd.md in the outbox source tree (the configuration, what the\n"
      "relay does, signals and failures), docs/operations.md (metrics, the admin API, the\n"
      "dashboard) and a page per sink in docs/; every key with its default in\n"
      "outbox.example.toml (/usr/share/doc/outboxd/examples/ in the Debian package).");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version are "errors" that exit 0; everything else is a usage error.
    return app.exit(error) == 0 ? 0 : kExitUsage;
  }
  if (config_path.empty()) {
    std::cerr << "outboxd: --config is required (or OUTBOX_CONFIG); see --help\n";
    return kExitUsage;
  }

  // Block the shutdown signals before any thread starts (building the sinks to check them
  // starts some), so only the signal thread sees them: one that comes while outboxd starts is
  // held until it can drain, instead of killing it.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed stdout pipe is a write error for the file sink

  outbox::outboxd::Config config;
  try {
    config = outbox::outboxd::LoadConfig(config_path);
    if (!log_level.empty()) config.log_level = log_level;
    // From here on, no configured secret of 8 bytes or more appears in a log line, a failure's
    // reason (last_error) or an API answer, whoever quotes it (outbox/core/secrets.h).
    outbox::InstallKnownSecrets(
        std::make_shared<const outbox::SecretRedactor>(outbox::outboxd::Secrets(config)));
    // What the libraries check beyond the file's syntax, as a start checks it.
    CheckStart(config);
    if (check_config) {
      std::cout << outbox::outboxd::Describe(config);
      std::cerr << "outboxd: configuration " << config_path << " is valid\n";
      return 0;
    }
  } catch (const outbox::ConfigError& error) {
    std::cerr << "outboxd: " << config_path << ": " << error.what() << "\n";
    return kExitUsage;
  }

  const bool journal = outbox::outboxd::StderrIsJournal();
  auto logger = MakeLogger(config, journal);
  const auto log_fn = MakeLogFn(logger, config.log_format == "json", journal);
  Shutdown shutdown;
  std::thread signal_thread(
      [&] { HandleSignals(shutdown, log_fn, logger, signals, config.relay.shutdown_timeout); });
  signal_thread.detach();  // it either exits the process or waits forever
  if (config.many_databases()) return RunManyDatabases(config, shutdown, log_fn, logger);
  return ExitCodeOf(log_fn, [&] {
    // The relay and the operations side write into one registry; only it renders.
    outbox::observe::Registry registry;
    // The table relay, WAL mode's relay when the database delivers by WAL, one dispatcher.
    outbox::RelayGroup relays(RelaySettingsOf(config), *config.database,
                              OpenSinks(config, {.log = log_fn, .lease = config.relay.lease}),
                              registry, log_fn);
    // The operations side (stats thread, HTTP listener), on connections of its own to the same
    // database, PostgreSQL or SQLite.
    std::optional<outbox::outboxd::Operations> operations;
    operations.emplace(config, registry, outbox::outboxd::Operations::TotalsOf(relays.counters()),
                       log_fn, [&relays] { return relays.paused_targets(); });
    if (relays.wal_mode()) operations->SetWalCheck([&relays] { return relays.SlotProblem(); });
    operations->Start();
    const std::string sinks = std::to_string(config.sinks.size()) + " sink(s)";
    const std::string relaying = "relaying " + config.database->Description() + " as " +
                                 config.relay.instance + " to " + sinks;
    log_fn(outbox::LogLevel::kInfo, "outboxd " + std::string{outbox::kVersion} + " " + relaying);
    // From here until the relays are destroyed, a signal drains them (Shutdown).
    const ArmedShutdown armed(
        shutdown, [&relays] { relays.Stop(); }, &*operations);
    // Started: configuration read, database reached and its schema checked, sinks built.
    outbox::outboxd::NotifyReady(relaying);
    // A WAL relay that fails for good (not an outage, not a missing slot, which it reports and
    // waits out) stops outboxd: nothing may be skipped silently.
    const bool wal_failed = !relays.Run();
    shutdown.exit_code = wal_failed ? kExitFailure : 0;
    if (operations) operations->Stop();
    const auto& counters = relays.counters();
    LogBye(log_fn, counters.published.load(), counters.failed.load(), counters.unconfirmed.load());
    if (const auto* wal_counters = relays.wal_counters()) {
      const auto& wal = *wal_counters;
      log_fn(outbox::LogLevel::kInfo, "WAL mode: published " +
                                          std::to_string(wal.published.load()) +
                                          " messages, parked " + std::to_string(wal.parked.load()) +
                                          ", position " + outbox::FormatLsn(wal.position.load()));
    }
    logger->flush();
    return wal_failed ? kExitFailure : 0;
  });
}
