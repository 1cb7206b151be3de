#pragma once
// What the NATS tests share: plain libnats clients of the test servers (stream management with
// the JetStream API, and a reader that is not the sink's code: an ordered consumer that reads a
// stream back from its first message), and nats-server processes of the tests' own (JetStream with
// file storage under a directory of their own, a port of their own) for restarts and kills.
// The shared server (scripts/services) is OUTBOX_TEST_NATS_URL; it is never stopped here.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "handles.h"
#include "support/child_process.h"

namespace outbox::testing {

// The shared server: OUTBOX_TEST_NATS_URL, or nats://127.0.0.1:4222.
std::string NatsUrl();

// `prefix` and a random suffix, usable as a stream name and as a subject token.
std::string UniqueName(std::string_view prefix);

// A message as a stream holds it.
struct StoredMessage {
  std::uint64_t seq = 0;  // the stream sequence
  std::string subject;
  std::map<std::string, std::string> headers;  // the first value of each
  std::string payload;

  [[nodiscard]] std::optional<std::string> Header(const std::string& name) const {
    const auto found = headers.find(name);
    if (found == headers.end()) return std::nullopt;
    return found->second;
  }
};

struct StreamSpec {
  std::string name;
  std::vector<std::string> subjects;
  // JetStream's default is 2 minutes; 0 leaves it to the server.
  std::chrono::milliseconds duplicate_window{std::chrono::minutes{2}};
  bool file_storage = false;  // memory storage otherwise
  std::int32_t max_msg_size = -1;
};

// A connection of its own to a NATS server, for stream management and reading streams back.
// Throws std::runtime_error when the server cannot be reached or refuses.
// Client TLS files, for a server that wants TLS (tls:// URLs).
struct ClientTls {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

class JetStreamClient {
 public:
  explicit JetStreamClient(const std::string& url = NatsUrl(), const ClientTls& tls = {});

  void AddStream(const StreamSpec& spec);
  // Deletes the stream; a stream that is not there, or a server that is down, is no error.
  void DeleteStream(const std::string& name) noexcept;
  // Messages stored in the stream now.
  std::uint64_t Count(const std::string& stream);
  // Waits (polling) until the stream holds at least `expected` messages or `limit` has passed;
  // what it holds then.
  std::uint64_t WaitForCount(const std::string& stream, std::uint64_t expected,
                             std::chrono::milliseconds limit);
  // Every message of the stream, in stream order: an ordered consumer on the stream's only
  // subject (or, for a stream of several subjects, a direct get per sequence). Throws when it
  // cannot read all that the stream held when it began within `limit`.
  std::vector<StoredMessage> ReadAll(const std::string& stream,
                                     std::chrono::milliseconds limit = std::chrono::seconds{60});

  [[nodiscard]] jsCtx* js() const { return js_.get(); }

 private:
  nats::ConnectionPtr connection_;
  nats::JetStreamPtr js_;
};

// A nats-server of the test's own: JetStream with its store under a new temporary directory,
// listening on 127.0.0.1 on a free port; `extra_config` is added to its configuration file (e.g.
// "max_payload: 4096" or an authorization block). Started by the constructor; killed (SIGKILL)
// and its directory removed by the destructor.
class NatsServer {
 public:
  explicit NatsServer(std::string extra_config = "");
  ~NatsServer();
  NatsServer(const NatsServer&) = delete;
  NatsServer& operator=(const NatsServer&) = delete;

  // Starts it (again: same port, same store) and waits until it answers (bounded: throws after
  // 20 s).
  void Start();
  // Stops it with `signal` (SIGTERM: a clean shutdown; SIGKILL) and waits until it is gone.
  void Stop(int signal);

  [[nodiscard]] int port() const { return port_; }
  // nats://127.0.0.1:<port>, without credentials.
  [[nodiscard]] std::string url() const;
  [[nodiscard]] const std::string& dir() const { return dir_; }
  // What it logged (its log file).
  [[nodiscard]] std::string Log() const;

 private:
  std::string dir_;
  std::string extra_config_;
  int port_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace outbox::testing
