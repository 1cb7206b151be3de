#pragma once
// A loopback TCP proxy in front of a test server (broker or database), to break connections on
// purpose: forward, hold the server's replies (so no confirm or result arrives), swallow new
// connections, freeze the open ones (a silent peer), drop everything.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace outbox::testing {

class TcpProxy {
 public:
  enum class Mode : std::uint8_t {
    kForward,      // both directions
    kHoldReplies,  // client to broker only; the broker's bytes wait in the kernel
    kBlackhole,    // new connections are accepted and never answered
    // The connections open when it is set stop forwarding in both directions and are kept open
    // (nothing is read, nothing closed: a failed-over primary, a dropped route, a frozen VM);
    // new connections are forwarded normally. Another mode thaws them. SetMode(kFreeze) returns
    // once they are frozen.
    kFreeze,
  };

  // Listens on 127.0.0.1 on `listen_port` (0: a free port) and forwards to
  // upstream_host:upstream_port.
  TcpProxy(std::string upstream_host, int upstream_port, int listen_port = 0);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  [[nodiscard]] int port() const { return port_; }
  void SetMode(Mode mode);
  // Closes every connection it proxies; returns once they are closed.
  void DropAll();
  // Waits (at most `limit`) until nothing has been passed on from the server for `quiet`; false if
  // that never happened. A server may report a statement done (pg_stat_activity's state 'idle') a
  // moment before it sends the reply's last bytes: a test that means to hold only later replies
  // (kHoldReplies) waits for this first, or it holds the one it meant to let through.
  bool AwaitQuietReplies(std::chrono::milliseconds quiet, std::chrono::milliseconds limit) const;

 private:
  struct Link {
    int client = -1;
    int upstream = -1;  // -1 for a blackholed connection
    bool frozen = false;
  };

  void Run();
  void Wake();
  static void CloseLink(Link& link);

  std::string upstream_host_;
  int upstream_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};

  std::mutex mutex_;
  std::condition_variable done_;
  Mode mode_ = Mode::kForward;
  bool stop_ = false;
  std::uint64_t drop_requested_ = 0;
  std::uint64_t drop_done_ = 0;
  std::uint64_t freeze_requested_ = 0;
  std::uint64_t freeze_done_ = 0;  // guarded by mutex_, like the others

  std::atomic<std::uint64_t> replied_bytes_{0};  // passed on from the server to the clients
  std::vector<Link> links_;                      // proxy thread only
  std::thread thread_;
};

}  // namespace outbox::testing
