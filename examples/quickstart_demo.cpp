// The quickstart (scripts/quickstart runs it): an application writes orders and their events in
// SQLite transactions, rolling some back on purpose, while outboxd -- the real relay binary, in a
// process of its own -- publishes every committed event to a JSON-lines file. At the end the file
// is checked against what the application committed: nothing lost, nothing rolled back
// published, no event that was never written, each stream in order. Exit code 0 only when every
// check passes.
//
//   quickstart_demo [--orders 10000] [--streams 100] [--rollback-percent 10] [--dir DIR]
//                   [--outboxd PATH] [--timeout 60] [--seed 1]
//
// Everything lives in DIR (default: a new /tmp/outbox-quickstart-XXXXXX, kept afterwards):
// app.db (the application's database, which also holds the outbox), outboxd.toml, outboxd.log and
// events.jsonl (what outboxd published).
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "outbox/store/sqlite.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct Options {
  int orders = 10000;
  int streams = 100;
  int rollback_percent = 10;
  std::string dir;
  std::string outboxd;
  int timeout_seconds = 60;
  std::uint64_t seed = 1;
};

// 12345678 -> "12,345,678"
std::string Grouped(std::int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  for (std::size_t at = digits.size(); at > 3; at -= 3) digits.insert(at - 3, ",");
  return value < 0 ? "-" + digits : digits;
}

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

std::string Fixed(double value, int decimals) {
  std::array<char, 64> text{};
  std::snprintf(text.data(), text.size(), "%.*f", decimals, value);
  return text.data();
}

std::string TomlString(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// ---- The application: one SQLite transaction per order, its events written by the outbox ----

struct DbCloser {
  void operator()(sqlite3* db) const noexcept { sqlite3_close_v2(db); }
};
struct StatementFinalizer {
  void operator()(sqlite3_stmt* statement) const noexcept { sqlite3_finalize(statement); }
};

class Shop {
 public:
  explicit Shop(const std::string& path) {
    sqlite3* raw = nullptr;
    const int code = sqlite3_open(path.c_str(), &raw);
    db_.reset(raw);
    if (code != SQLITE_OK) Fail("open " + path);
    // The relay writes the same file (claims, completions): wait for its short transactions.
    sqlite3_busy_timeout(db_.get(), 10000);
    Exec("PRAGMA synchronous = NORMAL");  // WAL (set by Migrate) + NORMAL: durable at checkpoints
    Exec(
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL,"
        " total_cents INTEGER NOT NULL)");
    sqlite3_stmt* statement = nullptr;
    if (sqlite3_prepare_v2(db_.get(), "INSERT INTO orders VALUES (?, ?, ?)", -1, &statement,
                           nullptr) != SQLITE_OK) {
      Fail("prepare");
    }
    insert_order_.reset(statement);
  }

  // Writes order `id` and its events in one transaction; rolls it back instead of committing when
  // `roll_back` (a declined payment, say). `record(event ids)` is called just before the commit
  // or rollback, so that the checks know of an event before the relay can publish it.
  template <typename Record>
  void PlaceOrder(int id, int customer, bool roll_back, Record&& record) {
    // BEGIN IMMEDIATE takes the write lock at the start, waiting (busy_timeout) while the relay
    // holds it. A plain BEGIN would start as a reader; in WAL mode its first write then fails at
    // once with SQLITE_BUSY_SNAPSHOT whenever the relay committed in between, and the whole
    // transaction would have to be retried.
    Exec("BEGIN IMMEDIATE");
    try {
      const std::string stream = "customer-" + std::to_string(customer);
      const std::int64_t total_cents = 500 + (id * 7919) % 20000;
      sqlite3_bind_int64(insert_order_.get(), 1, id);
      sqlite3_bind_text(insert_order_.get(), 2, stream.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(insert_order_.get(), 3, total_cents);
      const int code = sqlite3_step(insert_order_.get());
      sqlite3_reset(insert_order_.get());
      if (code != SQLITE_DONE) Fail("insert order");

      // Every order is placed; every third one is also paid at once: one or two events, in
      // the order's transaction, ordered within the customer's stream.
      std::vector<outbox::NewMessage> events;
      const nlohmann::json placed = {
          {"order_id", id}, {"customer", stream}, {"total_cents", total_cents}};
      events.push_back({.topic = "orders",
                        .payload = placed.dump(),
                        .stream_key = stream,
                        .type = "OrderPlaced"});
      if (id % 3 == 0) {
        const nlohmann::json paid = {{"order_id", id}, {"customer", stream}};
        events.push_back(
            {.topic = "orders", .payload = paid.dump(), .stream_key = stream, .type = "OrderPaid"});
      }
      record(writer_.Enqueue(db_.get(), events));
      Exec(roll_back ? "ROLLBACK" : "COMMIT");
    } catch (...) {
      sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
  }

 private:
  void Exec(const char* sql) {
    if (sqlite3_exec(db_.get(), sql, nullptr, nullptr, nullptr) != SQLITE_OK) Fail(sql);
  }
  [[noreturn]] void Fail(const std::string& what) {
    throw std::runtime_error("application database: " + what + ": " +
                             (db_ ? sqlite3_errmsg(db_.get()) : "out of memory"));
  }

  std::unique_ptr<sqlite3, DbCloser> db_;
  std::unique_ptr<sqlite3_stmt, StatementFinalizer> insert_order_;
  outbox::sqlite::Writer writer_;
};

// ---- What outboxd published: the JSON-lines file, read as it grows ----

struct Delivery {
  std::string id;
  std::string stream_key;       // "" when null
  std::int64_t stream_seq = 0;  // 0 when null
  std::int64_t order_id = -1;   // from the payload; -1 when missing
};

class PublishedFile {
 public:
  explicit PublishedFile(std::string path) : path_(std::move(path)) {}
  ~PublishedFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  PublishedFile(const PublishedFile&) = delete;
  PublishedFile& operator=(const PublishedFile&) = delete;

  // Reads the complete lines appended since the last call (none while the file does not exist).
  void Poll() {
    if (fd_ < 0) fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return;
    std::array<char, 65536> buffer{};
    for (;;) {
      const ssize_t count = ::read(fd_, buffer.data(), buffer.size());
      if (count < 0 && errno == EINTR) continue;
      if (count <= 0) break;
      partial_.append(buffer.data(), static_cast<std::size_t>(count));
    }
    std::size_t start = 0;
    for (std::size_t end = partial_.find('\n'); end != std::string::npos;
         end = partial_.find('\n', start)) {
      Parse(std::string_view{partial_}.substr(start, end - start));
      start = end + 1;
    }
    partial_.erase(0, start);
  }

  [[nodiscard]] const std::vector<Delivery>& deliveries() const { return deliveries_; }
  [[nodiscard]] std::size_t distinct() const { return seen_.size(); }
  [[nodiscard]] bool Contains(const std::string& id) const { return seen_.contains(id); }
  [[nodiscard]] std::size_t malformed() const { return malformed_; }

 private:
  void Parse(std::string_view line) {
    if (line.empty()) return;
    const nlohmann::json json = nlohmann::json::parse(line, nullptr, false);
    if (json.is_discarded() || !json.is_object() || !json.contains("id") ||
        !json["id"].is_string()) {
      ++malformed_;
      return;
    }
    Delivery delivery;
    delivery.id = json["id"].get<std::string>();
    if (json.contains("stream_key") && json["stream_key"].is_string()) {
      delivery.stream_key = json["stream_key"].get<std::string>();
    }
    if (json.contains("stream_seq") && json["stream_seq"].is_number_integer()) {
      delivery.stream_seq = json["stream_seq"].get<std::int64_t>();
    }
    if (json.contains("payload") && json["payload"].is_object() &&
        json["payload"].contains("order_id") && json["payload"]["order_id"].is_number_integer()) {
      delivery.order_id = json["payload"]["order_id"].get<std::int64_t>();
    }
    seen_.insert(delivery.id);
    deliveries_.push_back(std::move(delivery));
  }

  std::string path_;
  int fd_ = -1;
  std::string partial_;
  std::vector<Delivery> deliveries_;  // every line, duplicates included, in file order
  std::unordered_set<std::string> seen_;
  std::size_t malformed_ = 0;
};

// ---- outboxd, as a child process ----

class RelayProcess {
 public:
  // Starts `binary --config config` with stdout and stderr appended to `log`. Call before any
  // thread is started (fork).
  RelayProcess(const std::string& binary, const std::string& config, const std::string& log) {
    const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) throw std::runtime_error("cannot create " + log + ": " + std::strerror(errno));
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) {
      ::close(log_fd);
      throw std::runtime_error(std::string{"fork: "} + std::strerror(errno));
    }
    if (pid_ == 0) {
      // Only async-signal-safe calls from here on. The relay drains when this program dies.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(1);
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
      std::array<char*, 4> argv{const_cast<char*>(binary.c_str()),  // NOLINT: execv's signature
                                const_cast<char*>("--config"),      // NOLINT
                                const_cast<char*>(config.c_str()),  // NOLINT
                                nullptr};
      ::execv(binary.c_str(), argv.data());
      constexpr std::string_view kFailed = "quickstart_demo: cannot execute outboxd\n";
      [[maybe_unused]] const ssize_t ignored =
          ::write(STDERR_FILENO, kFailed.data(), kFailed.size());
      ::_exit(127);
    }
    ::close(log_fd);
  }

  ~RelayProcess() {
    if (!exit_code_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  RelayProcess(const RelayProcess&) = delete;
  RelayProcess& operator=(const RelayProcess&) = delete;

  // The exit code once it has exited (128 + n for signal n), nullopt while it runs.
  std::optional<int> Poll() {
    if (exit_code_) return exit_code_;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return exit_code_;
  }

  // SIGTERM (outboxd drains and exits), then waits up to `timeout`; nullopt when it did not exit.
  std::optional<int> Stop(milliseconds timeout) {
    if (Poll()) return exit_code_;
    ::kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + timeout;
    while (!Poll() && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds{20});
    return exit_code_;
  }

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

std::string Tail(const std::string& path, std::size_t max_lines) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string out = lines.empty() ? "    (empty)\n" : "";
  for (std::size_t i = lines.size() > max_lines ? lines.size() - max_lines : 0; i < lines.size();
       ++i) {
    out += "    " + lines[i] + "\n";
  }
  return out;
}

// ---- The run ----

// What the writer has done so far; the monitor thread reads it.
struct Progress {
  std::atomic<int> orders{0};
  std::atomic<int> rolled_back_orders{0};
  std::atomic<std::int64_t> committed_events{0};
  std::atomic<bool> writer_done{false};
  std::atomic<bool> writer_failed{false};  // stop watching at once
};

// What the application wrote, by event id. Written by the writer; read by others only after
// Progress::writer_done.
struct Ledger {
  std::unordered_map<std::string, std::int64_t> committed;  // event id -> order id
  std::unordered_set<std::string> rolled_back;
};

// How the waiting for outboxd ended.
struct Watch {
  std::optional<Clock::time_point> all_published_at;
  std::optional<int> relay_exit;  // outboxd exited by itself (it should not)
};

bool AllCommittedPublished(const Ledger& ledger, const PublishedFile& file) {
  if (file.distinct() < ledger.committed.size()) return false;
  return std::all_of(ledger.committed.begin(), ledger.committed.end(),
                     [&](const auto& entry) { return file.Contains(entry.first); });
}

// Shows progress until every committed event is in the file, outboxd exits, or the timeout after
// the writer finished passes.
Watch Monitor(const Options& options, const Progress& progress, const Ledger& ledger,
              PublishedFile& file, RelayProcess& relay, Clock::time_point started) {
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  const milliseconds print_every{tty ? 100 : 1000};
  auto next_print = Clock::now() + print_every;
  std::optional<Clock::time_point> writer_done_at;
  std::optional<std::size_t> checked_distinct;
  Watch watch;
  const auto print = [&](bool last) {
    const double elapsed = Seconds(Clock::now() - started);
    const auto published = static_cast<std::int64_t>(file.distinct());
    std::string line =
        "  orders " + Grouped(progress.orders.load()) + "/" + Grouped(options.orders) + " (" +
        Grouped(progress.rolled_back_orders.load()) +
        " rolled back)  events: " + Grouped(progress.committed_events.load()) + " committed, " +
        Grouped(published) + " published  " +
        Grouped(
            static_cast<std::int64_t>(static_cast<double>(published) / std::max(elapsed, 0.001))) +
        " events/s  " + Fixed(elapsed, 1) + " s";
    if (tty) {
      std::cout << "\r" << line << "\x1b[K" << (last ? "\n" : "") << std::flush;
    } else {
      std::cout << line << "\n" << std::flush;
    }
  };
  for (;;) {
    std::this_thread::sleep_for(milliseconds{25});
    file.Poll();
    if (!watch.relay_exit) watch.relay_exit = relay.Poll();
    if (!writer_done_at && progress.writer_done.load(std::memory_order_acquire)) {
      writer_done_at = Clock::now();
    }
    if (progress.writer_failed.load()) break;
    if (writer_done_at) {
      if (file.distinct() != checked_distinct && AllCommittedPublished(ledger, file)) {
        watch.all_published_at = Clock::now();
        break;
      }
      checked_distinct = file.distinct();
      if (watch.relay_exit) break;
      if (Clock::now() - *writer_done_at > std::chrono::seconds{options.timeout_seconds}) break;
    }
    if (Clock::now() >= next_print) {
      print(false);
      next_print += print_every;
    }
  }
  print(true);
  return watch;
}

// A line of the summary: label, value, verdict.
void Row(const std::string& label, const std::string& value, const std::string& note = "") {
  std::string line = "  " + label;
  line.resize(std::max<std::size_t>(line.size() + 1, 42), ' ');
  std::string padded_value = value;
  if (padded_value.size() < 10) padded_value.insert(0, 10 - padded_value.size(), ' ');
  std::cout << line << padded_value << (note.empty() ? "" : "  " + note) << "\n";
}

int Run(const Options& options) {
  // The working directory and its files, fresh each run.
  fs::path dir;
  if (options.dir.empty()) {
    std::string pattern = (fs::temp_directory_path() / "outbox-quickstart-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
    }
    dir = pattern;
  } else {
    dir = fs::absolute(options.dir);
    fs::create_directories(dir);
  }
  const std::string db_path = (dir / "app.db").string();
  const std::string config_path = (dir / "outboxd.toml").string();
  const std::string log_path = (dir / "outboxd.log").string();
  const std::string events_path = (dir / "events.jsonl").string();
  for (const std::string& stale :
       {db_path, db_path + "-wal", db_path + "-shm", config_path, log_path, events_path}) {
    fs::remove(stale);
  }
  std::string outboxd = options.outboxd;
  if (outboxd.empty()) {
    outboxd = (fs::read_symlink("/proc/self/exe").parent_path() / "outboxd").string();
  }
  if (::access(outboxd.c_str(), X_OK) != 0) {
    std::cerr << "quickstart_demo: outboxd not found at " << outboxd << " (use --outboxd PATH)\n";
    return 2;
  }

  std::ofstream(config_path) << "# Written by quickstart_demo: outboxd on the embedded store.\n"
                             << "[database]\ntype = \"sqlite\"\npath = " << TomlString(db_path)
                             << "\n\n[relay]\ninstance = \"quickstart\"\n"
                             << "# SQLite cannot notify: the sweep finds what other processes "
                                "commit.\nsweep_interval = \"20ms\"\n\n"
                             << "[sinks.default]\ntype = \"file\"\npath = "
                             << TomlString(events_path) << "\n";

  std::cout << "outbox quickstart: " << Grouped(options.orders)
            << " orders, each with its events in"
            << " one SQLite transaction (" << options.rollback_percent
            << " % rolled back on purpose),\nwhile outboxd relays the events to a JSON-lines file\n"
            << "  database  " << db_path << "\n"
            << "  relay     " << outboxd << " --config " << config_path << "\n"
            << "  output    " << events_path << "\n\n";

  outbox::sqlite::Migrate(db_path);  // outboxd does the same at its start; both are idempotent
  Shop shop(db_path);
  RelayProcess relay(outboxd, config_path, log_path);

  Progress progress;
  Ledger ledger;
  PublishedFile file(events_path);
  const auto started = Clock::now();
  Watch watch;
  std::thread monitor([&] { watch = Monitor(options, progress, ledger, file, relay, started); });

  std::mt19937_64 random(options.seed);
  std::int64_t rolled_back_events = 0;
  std::exception_ptr failure;
  try {
    for (int order = 1; order <= options.orders; ++order) {
      const int customer = static_cast<int>(random() % static_cast<std::uint64_t>(options.streams));
      const bool roll_back = random() % 100 < static_cast<std::uint64_t>(options.rollback_percent);
      shop.PlaceOrder(order, customer + 1, roll_back,
                      [&](const std::vector<outbox::MessageId>& ids) {
                        for (const outbox::MessageId& id : ids) {
                          if (roll_back) {
                            ledger.rolled_back.insert(id.ToString());
                          } else {
                            ledger.committed.emplace(id.ToString(), order);
                          }
                        }
                        const auto count = static_cast<std::int64_t>(ids.size());
                        if (roll_back) {
                          rolled_back_events += count;
                          progress.rolled_back_orders.fetch_add(1, std::memory_order_relaxed);
                        } else {
                          progress.committed_events.fetch_add(count, std::memory_order_relaxed);
                        }
                      });
      progress.orders.fetch_add(1, std::memory_order_relaxed);
    }
  } catch (...) {
    failure = std::current_exception();
    progress.writer_failed.store(true);
  }
  const auto written_at = Clock::now();
  progress.writer_done.store(true, std::memory_order_release);
  monitor.join();
  if (failure) std::rethrow_exception(failure);

  const std::optional<int> relay_exit =
      watch.relay_exit ? watch.relay_exit : relay.Stop(std::chrono::seconds{30});
  file.Poll();  // what the drain wrote

  // The checks, from the file alone against what the application committed.
  const auto committed = static_cast<std::int64_t>(ledger.committed.size());
  std::int64_t lost = 0;
  for (const auto& entry : ledger.committed) lost += file.Contains(entry.first) ? 0 : 1;
  std::int64_t phantom = 0;
  std::int64_t rolled_back_published = 0;
  std::int64_t payload_mismatch = 0;
  std::set<std::string> streams_out_of_order;
  std::unordered_set<std::string> first_seen;
  std::map<std::string, std::vector<std::int64_t>> stream_seqs;  // first deliveries, file order
  for (const Delivery& delivery : file.deliveries()) {
    if (!first_seen.insert(delivery.id).second) continue;  // a duplicate
    const auto found = ledger.committed.find(delivery.id);
    if (found == ledger.committed.end()) {
      ++phantom;
      if (ledger.rolled_back.contains(delivery.id)) ++rolled_back_published;
      continue;
    }
    if (delivery.order_id != found->second) ++payload_mismatch;
    auto& seqs = stream_seqs[delivery.stream_key];
    if (!seqs.empty() && delivery.stream_seq <= seqs.back()) {
      streams_out_of_order.insert(delivery.stream_key);
    }
    seqs.push_back(delivery.stream_seq);
  }
  // A stream is also broken when its published stream_seq are not exactly 1..n (the rolled back
  // transactions took no number).
  for (auto& [stream, seqs] : stream_seqs) {
    std::sort(seqs.begin(), seqs.end());
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i] != static_cast<std::int64_t>(i) + 1) {
        streams_out_of_order.insert(stream);
        break;
      }
    }
  }
  const auto broken_streams = static_cast<std::int64_t>(streams_out_of_order.size());
  const auto lines = static_cast<std::int64_t>(file.deliveries().size());
  const auto distinct = static_cast<std::int64_t>(file.distinct());
  const bool relay_ok = !watch.relay_exit && relay_exit == 0;
  const bool ok = lost == 0 && phantom == 0 && rolled_back_published == 0 &&
                  payload_mismatch == 0 && broken_streams == 0 && file.malformed() == 0 && relay_ok;

  const auto verdict = [](bool passed) { return std::string{passed ? "ok" : "FAILED"}; };
  const int committed_orders = options.orders - progress.rolled_back_orders.load();
  std::cout << "\nsummary\n";
  Row("orders written", Grouped(options.orders),
      Grouped(committed_orders) + " committed, " + Grouped(progress.rolled_back_orders.load()) +
          " rolled back on purpose");
  Row("events committed", Grouped(committed));
  Row("events published (distinct ids)", Grouped(distinct));
  Row("duplicates", Grouped(lines - distinct), "(at-least-once allows them; ids dedupe)");
  Row("rolled back, never published", Grouped(rolled_back_events - rolled_back_published),
      "of " + Grouped(rolled_back_events) + "  " + verdict(rolled_back_published == 0));
  Row("lost (committed, not published)", Grouped(lost), verdict(lost == 0));
  Row("phantom (published, not committed)", Grouped(phantom), verdict(phantom == 0));
  Row("streams out of order", Grouped(broken_streams),
      "of " + Grouped(static_cast<std::int64_t>(stream_seqs.size())) +
          " (stream_seq 1..n, first deliveries in order)  " + verdict(broken_streams == 0));
  Row("payloads intact", Grouped(distinct - phantom - payload_mismatch),
      verdict(payload_mismatch == 0 && file.malformed() == 0));
  if (watch.relay_exit) {
    Row("outboxd", "exited",
        "by itself with code " + std::to_string(*watch.relay_exit) + "  " + verdict(false));
  } else {
    Row("outboxd stopped by SIGTERM", relay_exit ? "exit " + std::to_string(*relay_exit) : "hung",
        verdict(relay_ok) + (relay_exit ? "" : " (killed after 30 s)"));
  }
  const double write_seconds = std::max(Seconds(written_at - started), 1e-3);
  std::cout << "  application: " << Grouped(options.orders) << " transactions in "
            << Fixed(write_seconds, 2) << " s ("
            << Grouped(static_cast<std::int64_t>(options.orders / write_seconds)) << " orders/s)\n";
  if (watch.all_published_at) {
    const double relay_seconds = std::max(Seconds(*watch.all_published_at - started), 1e-3);
    std::cout << "  outboxd: every committed event published " << Fixed(relay_seconds, 2)
              << " s after the start ("
              << Grouped(static_cast<std::int64_t>(static_cast<double>(committed) / relay_seconds))
              << " events/s), the last one "
              << Fixed(std::max(0.0, Seconds(*watch.all_published_at - written_at)), 2)
              << " s after the last commit\n";
  } else if (watch.relay_exit) {
    std::cout << "  outboxd: exited before it published every committed event\n";
  } else {
    std::cout << "  outboxd: did not publish every committed event within "
              << options.timeout_seconds << " s after the last commit\n";
  }
  if (!ok) {
    std::cout << "FAILED. outboxd's log (" << log_path << "), last lines:\n" << Tail(log_path, 15);
    return 1;
  }
  std::cout << "PASS: " << Grouped(committed) << " committed events published, 0 lost, 0 phantom, "
            << "nothing rolled back published. Files: " << dir.string() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "The outbox quickstart: orders and their events in SQLite transactions, relayed by outboxd "
      "to a JSON-lines file, then checked: nothing lost, nothing rolled back published",
      "quickstart_demo"};
  Options options;
  app.add_option("--orders", options.orders, "Orders to write")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000000));
  app.add_option("--streams", options.streams, "Customers (ordered streams) the orders spread over")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--rollback-percent", options.rollback_percent,
                 "Share of the order transactions rolled back on purpose")
      ->capture_default_str()
      ->check(CLI::Range(0, 90));
  app.add_option("--dir", options.dir,
                 "Working directory (default: a new /tmp/outbox-quickstart-XXXXXX); its app.db, "
                 "events.jsonl, outboxd.toml and outboxd.log are replaced");
  app.add_option("--outboxd", options.outboxd, "The outboxd binary (default: next to this one)");
  app.add_option("--timeout", options.timeout_seconds,
                 "Seconds to wait, after the last commit, for every event to be published")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.add_option("--seed", options.seed, "Seed choosing customers and rollbacks")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;  // --help exits 0, a bad option 2
  }
  try {
    return Run(options);
  } catch (const std::exception& error) {
    std::cerr << "quickstart_demo: " << error.what() << "\n";
    return 1;
  }
}
