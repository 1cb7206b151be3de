#pragma once
// A loopback proxy in front of every broker of a Kafka cluster, for faults that must reach one
// client's connections and nobody else's (the tests' independent Consumer goes to the brokers
// directly): cut them and refuse new ones (a cluster that is down, as the client sees it), or
// hold what the brokers send back (lost confirmations, a silent cluster), or freeze the
// connections open now (a silent peer: nothing moves either way) while new ones go through.
//
// A Kafka client connects to the addresses the cluster advertises in its Metadata responses, not
// to its bootstrap list, so a plain TCP proxy would be left after the first request. This one
// listens once per broker and rewrites each broker's port in Metadata responses to its own
// listener for that broker (what advertised.listeners does for a real cluster behind a proxy), so
// that every connection of the client goes through it. Every other byte passes unchanged.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace outbox::testing {

class KafkaProxy {
 public:
  // `bootstraps`: the cluster's brokers, "127.0.0.1:P1,127.0.0.1:P2,..." (every broker of it).
  explicit KafkaProxy(const std::string& bootstraps);
  ~KafkaProxy();
  KafkaProxy(const KafkaProxy&) = delete;
  KafkaProxy& operator=(const KafkaProxy&) = delete;

  // The proxy's listeners, one per broker, in the same form.
  [[nodiscard]] std::string bootstraps() const;

  // Cuts every connection and closes the listeners (new connections are refused); returns once
  // that is done. Start listens again on the same ports.
  void Stop();
  void Start();
  // Hold: what the brokers send is no longer read (it waits in the kernel), on every connection
  // and on new ones, while what the client sends still goes through. Returns once no broker byte
  // will be forwarded any more; release forwards what was held, in order.
  void Hold(bool hold);
  // Freeze: the connections open now stop forwarding in both directions and are kept open
  // (nothing read, nothing closed: a failed-over broker behind a virtual IP, a dropped route, a
  // frozen VM); new connections are forwarded as usual. Returns once they are frozen. Thaw
  // (false) lets those still open forward again, in order.
  void Freeze(bool freeze);

  // Why a Metadata response could not be rewritten (then the client bypasses the proxy), if ever.
  [[nodiscard]] std::string problem() const;

 private:
  struct Broker {
    int upstream_port = 0;
    int port = 0;        // the listener's, fixed once chosen
    int listen_fd = -1;  // -1 while stopped
  };
  struct Link;

  void Run();
  // Runs `command` on the proxy's thread and waits until it has.
  void Do(std::function<void()> command);
  void Listen(Broker& broker);
  void Accept(const Broker& broker);
  void CloseAll();
  // Moves whole frames from `from` to `to`; false when a side is gone.
  bool FromClient(Link& link);
  bool FromBroker(Link& link);
  void RewriteMetadata(std::string& frame, std::int16_t version);

  std::vector<Broker> brokers_;
  std::map<int, int> port_of_upstream_;  // a broker's port -> the proxy's port for it
  std::vector<std::unique_ptr<Link>> links_;
  bool held_ = false;  // the proxy thread's only
  std::string problem_;

  mutable std::mutex mutex_;
  std::condition_variable done_;
  std::vector<std::function<void()>> commands_;
  std::uint64_t commands_run_ = 0;
  std::uint64_t commands_queued_ = 0;
  bool quit_ = false;
  int wake_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace outbox::testing
