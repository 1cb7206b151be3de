#pragma once
// Helpers for tests against a real Redis: the shared server from scripts/services (or the one
// named by OUTBOX_TEST_REDIS_URL), used only through keys of each test's own, which it deletes;
// and servers of a test's own (RedisServer: redis-server as a child process on a free loopback
// port, in a temporary directory) for what the shared one must not be put through: restarts,
// kills, AUTH, maxmemory, replicas, SCRIPT FLUSH.
//
// The client here is plain hiredis with blocking calls, not the sink's code: the tests read back
// what the sink wrote with it (XRANGE) and set up server states with it. It shares only the
// RAII aliases of the sink's handles.h.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "handles.h"
#include "outbox/core/clock.h"
#include "outbox/core/message.h"
#include "outbox/sink/redis.h"
#include "support/child_process.h"

namespace outbox::testing {

// redis://host:port of the shared test server.
std::string RedisUrl();
// host and port of the shared test server.
std::pair<std::string, int> RedisAddress();

// A key no other test (or run) uses: "outbox-test:<pid>:<n>:<stem>".
std::string UniqueKey(const std::string& stem);

Deadline In(std::chrono::milliseconds duration);
Envelope MakeEnvelope(const std::string& topic, std::string payload = R"({"n":1})");
std::vector<Envelope> MakeEnvelopes(const std::string& topic, std::size_t count);

// One stream entry as XRANGE returns it.
struct StreamEntry {
  std::string entry_id;                                     // "<ms>-<n>"
  std::vector<std::pair<std::string, std::string>> fields;  // in the entry's order

  // The value of field `name`, when the entry has it.
  [[nodiscard]] std::optional<std::string> Field(const std::string& name) const;
};

// A blocking hiredis connection of the test's own.
class RedisClient {
 public:
  // Connects to host:port (AUTH with `password`, and `user` when not empty); throws
  // std::runtime_error.
  RedisClient(const std::string& host, int port, const std::string& user = "",
              const std::string& password = "");
  RedisClient() : RedisClient(RedisAddress().first, RedisAddress().second) {}

  // Runs one command; error replies are returned as replies. Throws on a connection error.
  redis::ReplyPtr Command(const std::vector<std::string>& args);
  // Runs one command that must not fail; throws with the server's error text otherwise.
  redis::ReplyPtr Ok(const std::vector<std::string>& args);
  // Sends a command without waiting for its reply (a script that keeps the server busy).
  void Send(const std::vector<std::string>& args);

  // The whole stream, oldest first (XRANGE, in pages); empty when the key does not exist.
  std::vector<StreamEntry> ReadStream(const std::string& key);
  std::int64_t Length(const std::string& key);
  std::optional<std::string> Get(const std::string& key);
  bool Exists(const std::string& key);
  // Deletes every key that starts with `prefix` (SCAN MATCH, then UNLINK).
  void DeletePrefix(const std::string& prefix);
  void Delete(const std::string& key);

 private:
  redis::ContextPtr context_;
};

// redis-server of the test's own, as a child process: 127.0.0.1 on a free port, its files in a
// temporary directory (removed at the end), no RDB snapshots; `extra` are more command-line
// options ("--appendonly", "yes", ...). Started by the constructor; Stop/Kill and Start again keep
// the port and the directory.
class RedisServer {
 public:
  explicit RedisServer(std::vector<std::string> extra = {});
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts it and waits (bounded) until it answers PING (PONG or NOAUTH; LOADING is not yet).
  void Start();
  // SIGTERM (Redis saves the AOF on shutdown) and waits for the exit.
  void Stop();
  // SIGKILL, at once.
  void Kill();
  [[nodiscard]] bool running() const { return process_ != nullptr; }

  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] const std::string& dir() const { return dir_; }
  [[nodiscard]] std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  [[nodiscard]] std::string log_tail() const;
  // A client of it (with `user`/`password` when it needs AUTH).
  [[nodiscard]] RedisClient Client(const std::string& user = "",
                                   const std::string& password = "") const {
    return RedisClient("127.0.0.1", port_, user, password);
  }

 private:
  std::vector<std::string> extra_;
  std::string dir_;
  int port_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace outbox::testing
