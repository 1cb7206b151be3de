#pragma once
// Catching an outboxd with work in hand, for the tests that kill, freeze or stop a relay and then
// check what became of its claim (issue #23: such a check passes vacuously when the relay had
// nothing claimed). SIGSTOP only asks the kernel to stop the process, and what the relay sent to
// PostgreSQL just before still runs there: so the database is read only once every thread of the
// process is stopped (/proc/<pid>/task/*/stat state 'T') and its backends, told apart by
// application_name (PGAPPNAME), have been quiet for a while (none running a statement, none
// changed). From then on only other relays can change what it holds.

#include <libpq-fe.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>

#include "support/child_process.h"
#include "support/pg_test_support.h"

namespace outbox::testing {

// True when process `pid` exists and every one of its threads is stopped by a signal.
inline bool AllThreadsStopped(pid_t pid) {
  std::error_code error;
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  int threads = 0;
  for (const auto& task : std::filesystem::directory_iterator(tasks, error)) {
    std::ifstream in(task.path() / "stat");
    const std::string stat{std::istreambuf_iterator<char>(in), {}};
    const std::size_t paren = stat.rfind(')');  // the name in (...) may contain anything
    if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'T') {
      return false;
    }
    ++threads;
  }
  return !error && threads > 0;
}

// Polls (every millisecond) until AllThreadsStopped(pid); false after `limit`.
inline bool WaitUntilStopped(pid_t pid, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!AllThreadsStopped(pid)) {
    if (pid <= 0 || std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds{1});
  }
  return true;
}

// The backends whose application_name is `app`: how many, how many run a statement, and a
// fingerprint that changes with any statement they start or finish.
struct Backends {
  int count = 0;
  int active = 0;
  std::string fingerprint;
};

inline Backends ReadBackends(PGconn* conn, const std::string& app) {
  auto result = Sql(
      conn,
      "SELECT count(*), count(*) FILTER (WHERE state = 'active'), coalesce(string_agg(pid || ' ' "
      "|| coalesce(state, '-') || ' ' || coalesce(query_start::text, '-') || ' ' || "
      "coalesce(state_change::text, '-') || ' ' || left(query, 60), '; ' ORDER BY pid), '') "
      "FROM pg_stat_activity WHERE application_name = '" +
          app + "'");
  return {std::atoi(PQgetvalue(result.get(), 0, 0)), std::atoi(PQgetvalue(result.get(), 0, 1)),
          PQgetvalue(result.get(), 0, 2)};
}

// What FreezeHoldingAClaim caught.
struct Freeze {
  std::int64_t claimed = 0;  // > 0: the process is stopped holding this many claimed messages
  int attempts = 0;
  std::chrono::steady_clock::time_point stopped_at;  // when SIGSTOP was sent (the last attempt)
  std::string problem;                               // why it gave up, when it did
};

// Stops `process` (SIGSTOP) while it holds claimed messages, as counted by `claimed` (a query of
// the test's own): polls until claimed() > 0, stops it, waits until the stop has taken effect and
// its backends (application_name `app`, at least one) have been quiet with claimed() unchanged
// for two reads 50 ms apart, and reads claimed() then. When the relay had completed its claim
// meanwhile, SIGCONT and again, up to `max_attempts` times. Leaves the process stopped when
// Freeze::claimed > 0, running otherwise.
inline Freeze FreezeHoldingAClaim(ChildProcess& process, PGconn* conn, const std::string& app,
                                  const std::function<std::int64_t()>& claimed,
                                  int max_attempts = 100) {
  using std::chrono::milliseconds;
  using Clock = std::chrono::steady_clock;
  Freeze freeze;
  int unquiet = 0;  // attempts whose backends did not become quiet
  while (freeze.attempts < max_attempts) {
    ++freeze.attempts;
    bool holding = false;
    for (const auto until = Clock::now() + std::chrono::seconds{10};
         !(holding = claimed() > 0) && Clock::now() < until;) {
      std::this_thread::sleep_for(milliseconds{2});
    }
    if (!holding) {
      freeze.problem = "it held no claimed message for 10 s";
      return freeze;
    }
    process.Signal(SIGSTOP);
    freeze.stopped_at = Clock::now();
    if (!WaitUntilStopped(process.pid(), milliseconds{5000})) {
      process.Signal(SIGCONT);
      freeze.problem = "SIGSTOP did not take effect within 5 s";
      return freeze;
    }
    // Quiet: two reads 50 ms apart, no statement running, nothing changed in between.
    Backends before = ReadBackends(conn, app);
    std::int64_t claimed_before = claimed();
    bool quiet = false;
    for (const auto until = Clock::now() + std::chrono::seconds{10};
         !quiet && Clock::now() < until;) {
      std::this_thread::sleep_for(milliseconds{50});
      const Backends now = ReadBackends(conn, app);
      const std::int64_t claimed_now = claimed();
      quiet = now.count > 0 && now.active == 0 && now.fingerprint == before.fingerprint &&
              claimed_now == claimed_before;
      before = now;
      claimed_before = claimed_now;
    }
    if (!quiet) {
      // A backend stays active while it sends a result larger than the socket's buffers to the
      // stopped relay (a claim of many messages): not a moment to read; try again, a few times.
      // The relay first reads that result (the backends change): stopped again at once, it was
      // caught with the same result unread three times running (the CI run of 2026-11-29).
      process.Signal(SIGCONT);
      freeze.problem = "the stopped relay's backends (application_name " + app +
                       ") were not quiet within 10 s: " + before.fingerprint;
      if (++unquiet >= 3) return freeze;
      for (const auto until = Clock::now() + std::chrono::seconds{5};
           ReadBackends(conn, app).fingerprint == before.fingerprint && Clock::now() < until;) {
        std::this_thread::sleep_for(milliseconds{2});
      }
      continue;
    }
    freeze.claimed = claimed_before;
    if (freeze.claimed > 0) return freeze;
    process.Signal(SIGCONT);  // it had completed what it claimed: try again
  }
  freeze.problem = "never caught holding a claim";
  return freeze;
}

}  // namespace outbox::testing
