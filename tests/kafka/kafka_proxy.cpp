#include "kafka_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace outbox::testing {
namespace {

constexpr std::int16_t kMetadataApi = 3;
// Metadata responses are "flexible" (compact strings and arrays, tagged fields) from version 9.
constexpr std::int16_t kFirstFlexibleMetadata = 9;

sockaddr_in Loopback(int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  return address;
}

void NoDelay(int fd) {
  const int on = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

// Big-endian integers of the Kafka protocol, read and written in place.
std::int64_t ReadInt(const std::string& bytes, std::size_t at, std::size_t width) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < width; ++i) {
    value = (value << 8U) | static_cast<unsigned char>(bytes[at + i]);
  }
  const std::uint64_t sign = std::uint64_t{1} << (8 * width - 1);
  return static_cast<std::int64_t>((value ^ sign) - sign);  // sign-extended
}

void WriteInt32(std::string& bytes, std::size_t at, std::int32_t value) {
  const auto bits = static_cast<std::uint32_t>(value);
  for (std::size_t i = 0; i < 4; ++i) {
    bytes[at + i] = static_cast<char>((bits >> (8 * (3 - i))) & 0xFFU);
  }
}

// Reads a Kafka message from a position; every read says whether the bytes were there.
class Cursor {
 public:
  Cursor(const std::string& bytes, std::size_t at) : bytes_(bytes), at_(at) {}
  [[nodiscard]] std::size_t at() const { return at_; }
  bool Skip(std::uint64_t count) {
    if (count > bytes_.size() - at_) return false;
    at_ += static_cast<std::size_t>(count);
    return true;
  }
  std::optional<std::int64_t> Int(std::size_t width) {
    if (width > bytes_.size() - at_) return std::nullopt;
    const std::int64_t value = ReadInt(bytes_, at_, width);
    at_ += width;
    return value;
  }
  std::optional<std::uint64_t> Varint() {  // unsigned LEB128
    std::uint64_t value = 0;
    for (unsigned shift = 0; shift < 64 && at_ < bytes_.size(); shift += 7) {
      const auto byte = static_cast<unsigned char>(bytes_[at_++]);
      value |= std::uint64_t{byte & 0x7FU} << shift;
      if ((byte & 0x80U) == 0) return value;
    }
    return std::nullopt;
  }

 private:
  const std::string& bytes_;
  std::size_t at_;
};

// Appends what is readable on `fd` to `pending`; false when the peer is gone.
bool Receive(int fd, std::string& pending) {
  std::array<char, 65536> buffer{};
  const ssize_t got = recv(fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
  if (got < 0) return errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK;
  pending.append(buffer.data(), static_cast<std::size_t>(got));
  return got > 0;
}

bool SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t sent = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(sent));
  }
  return true;
}

// Takes the first whole frame (a 4-byte size, then that many bytes) off `pending`.
bool TakeFrame(std::string& pending, std::string& frame) {
  if (pending.size() < 4) return false;
  const auto size = static_cast<std::uint32_t>(ReadInt(pending, 0, 4));
  if (pending.size() - 4 < size) return false;
  frame.assign(pending, 0, 4 + std::size_t{size});
  pending.erase(0, 4 + std::size_t{size});
  return true;
}

}  // namespace

struct KafkaProxy::Link {
  int client = -1;
  int broker = -1;
  std::string from_client;                        // bytes of a request not yet whole
  std::string from_broker;                        // bytes of a response not yet whole
  std::map<std::int64_t, std::int16_t> metadata;  // correlation id -> Metadata request version
  bool frozen = false;                            // nothing moves either way (Freeze)

  Link() = default;
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;
  ~Link() {
    if (client >= 0) close(client);
    if (broker >= 0) close(broker);
  }
};

KafkaProxy::KafkaProxy(const std::string& bootstraps) {
  std::istringstream list(bootstraps);
  for (std::string entry; std::getline(list, entry, ',');) {
    const std::size_t colon = entry.rfind(':');
    if (colon == std::string::npos || entry.substr(0, colon) != "127.0.0.1") {
      throw std::invalid_argument("kafka proxy: expected 127.0.0.1:port, got '" + entry + "'");
    }
    brokers_.push_back(Broker{.upstream_port = std::stoi(entry.substr(colon + 1))});
  }
  for (Broker& broker : brokers_) {
    Listen(broker);
    if (broker.listen_fd < 0) throw std::runtime_error("kafka proxy: " + problem_);
    port_of_upstream_[broker.upstream_port] = broker.port;
  }
  if (pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) throw std::runtime_error("kafka proxy: pipe");
  thread_ = std::thread([this] { Run(); });
}

KafkaProxy::~KafkaProxy() {
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  [[maybe_unused]] const ssize_t woken = write(wake_[1], "q", 1);
  thread_.join();
  CloseAll();
  close(wake_[0]);
  close(wake_[1]);
}

std::string KafkaProxy::bootstraps() const {
  std::string list;
  for (const Broker& broker : brokers_) {
    list += (list.empty() ? "" : ",") + std::string{"127.0.0.1:"} + std::to_string(broker.port);
  }
  return list;
}

void KafkaProxy::Stop() {
  Do([this] { CloseAll(); });
}

void KafkaProxy::Start() {
  Do([this] {
    for (Broker& broker : brokers_) {
      if (broker.listen_fd < 0) Listen(broker);
    }
  });
  for (const Broker& broker : brokers_) {
    if (broker.listen_fd < 0) throw std::runtime_error("kafka proxy: " + problem());
  }
}

void KafkaProxy::Hold(bool hold) {
  Do([this, hold] { held_ = hold; });
}

void KafkaProxy::Freeze(bool freeze) {
  Do([this, freeze] {
    for (const auto& link : links_) link->frozen = freeze;
  });
}

std::string KafkaProxy::problem() const {
  std::lock_guard lock(mutex_);
  return problem_;
}

void KafkaProxy::Do(std::function<void()> command) {
  std::unique_lock lock(mutex_);
  commands_.push_back(std::move(command));
  const std::uint64_t ticket = ++commands_queued_;
  lock.unlock();
  [[maybe_unused]] const ssize_t woken = write(wake_[1], "c", 1);
  lock.lock();
  done_.wait(lock, [&] { return commands_run_ >= ticket; });
}

void KafkaProxy::Listen(Broker& broker) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int on = 1;
  sockaddr_in address = Loopback(broker.port);
  socklen_t length = sizeof address;
  auto* generic = reinterpret_cast<sockaddr*>(&address);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
      bind(fd, generic, sizeof address) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, generic, &length) != 0) {
    std::lock_guard lock(mutex_);
    problem_ =
        "cannot listen on 127.0.0.1:" + std::to_string(broker.port) + ": " + std::strerror(errno);
    if (fd >= 0) close(fd);
    return;
  }
  broker.listen_fd = fd;
  broker.port = ntohs(address.sin_port);
}

void KafkaProxy::Accept(const Broker& broker) {
  auto link = std::make_unique<Link>();
  link->client = accept4(broker.listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (link->client < 0) return;
  link->broker = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const sockaddr_in upstream = Loopback(broker.upstream_port);
  if (link->broker < 0 ||
      connect(link->broker, reinterpret_cast<const sockaddr*>(&upstream), sizeof upstream) != 0) {
    return;  // the broker itself is down: the client's connection closes at once
  }
  NoDelay(link->client);
  NoDelay(link->broker);
  links_.push_back(std::move(link));
}

void KafkaProxy::CloseAll() {
  links_.clear();
  for (Broker& broker : brokers_) {
    if (broker.listen_fd >= 0) close(broker.listen_fd);
    broker.listen_fd = -1;
  }
}

bool KafkaProxy::FromClient(Link& link) {
  if (!Receive(link.client, link.from_client)) return false;
  for (std::string frame; TakeFrame(link.from_client, frame);) {
    // Request header: api key, api version, correlation id.
    if (frame.size() >= 12 && ReadInt(frame, 4, 2) == kMetadataApi) {
      link.metadata[ReadInt(frame, 8, 4)] = static_cast<std::int16_t>(ReadInt(frame, 6, 2));
    }
    if (!SendAll(link.broker, frame)) return false;
  }
  return true;
}

bool KafkaProxy::FromBroker(Link& link) {
  if (!Receive(link.broker, link.from_broker)) return false;
  for (std::string frame; TakeFrame(link.from_broker, frame);) {
    // Response header: correlation id.
    if (const auto request =
            frame.size() >= 8 ? link.metadata.find(ReadInt(frame, 4, 4)) : link.metadata.end();
        request != link.metadata.end()) {
      RewriteMetadata(frame, request->second);
      link.metadata.erase(request);
    }
    if (!SendAll(link.client, frame)) return false;
  }
  return true;
}

void KafkaProxy::RewriteMetadata(std::string& frame, std::int16_t version) {
  const bool flexible = version >= kFirstFlexibleMetadata;
  Cursor in(frame, 8);  // after the size and the correlation id
  const auto skip_tags = [&] {
    const auto count = in.Varint();
    if (!count) return false;
    for (std::uint64_t i = 0; i < *count; ++i) {
      const auto tag = in.Varint();
      const auto size = tag ? in.Varint() : std::nullopt;
      if (!size || !in.Skip(*size)) return false;
    }
    return true;
  };
  const auto skip_string = [&](bool nullable) {
    if (flexible) {
      const auto length = in.Varint();  // length + 1, 0 for null
      return length && (*length == 0 ? nullable : in.Skip(*length - 1));
    }
    const auto length = in.Int(2);  // -1 for null
    return length && (*length < 0 ? nullable : in.Skip(static_cast<std::uint64_t>(*length)));
  };
  bool ok = (!flexible || skip_tags()) && (version < 3 || in.Skip(4));  // header tags, throttle
  std::optional<std::int64_t> count;
  if (ok) {
    if (flexible) {
      const auto plus_one = in.Varint();
      if (plus_one && *plus_one > 0) count = static_cast<std::int64_t>(*plus_one - 1);
    } else {
      count = in.Int(4);
    }
    ok = count.has_value();
  }
  for (std::int64_t i = 0; ok && i < *count; ++i) {
    ok = in.Skip(4) && skip_string(false);  // node id, host
    const std::size_t port_at = in.at();
    const auto port = ok ? in.Int(4) : std::nullopt;
    ok = port && (version < 1 || skip_string(true)) && (!flexible || skip_tags());  // rack
    if (const auto mapped =
            ok ? port_of_upstream_.find(static_cast<int>(*port)) : port_of_upstream_.end();
        mapped != port_of_upstream_.end()) {
      WriteInt32(frame, port_at, mapped->second);
    }
  }
  if (!ok) {
    std::lock_guard lock(mutex_);
    problem_ = "cannot read a Metadata v" + std::to_string(version) + " response";
  }
}

void KafkaProxy::Run() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({.fd = wake_[0], .events = POLLIN, .revents = 0});
    for (const Broker& broker : brokers_) {
      fds.push_back({.fd = broker.listen_fd, .events = POLLIN, .revents = 0});  // -1: ignored
    }
    for (const auto& link : links_) {
      // A frozen link is polled for nothing (only a failed side is still reported).
      const short client_events = link->frozen ? short{0} : short{POLLIN};
      fds.push_back({.fd = link->client, .events = client_events, .revents = 0});
      const short broker_events = held_ || link->frozen ? short{0} : short{POLLIN};
      fds.push_back({.fd = link->broker, .events = broker_events, .revents = 0});
    }
    if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;

    // Commands first, before any byte moves; they may close what was polled, so poll again.
    std::array<char, 64> drain{};
    while (read(wake_[0], drain.data(), drain.size()) > 0) {
    }
    std::unique_lock lock(mutex_);
    if (quit_) return;
    std::vector<std::function<void()>> commands = std::move(commands_);
    commands_.clear();
    lock.unlock();
    if (!commands.empty()) {
      for (const auto& command : commands) command();
      lock.lock();
      commands_run_ += commands.size();
      done_.notify_all();
      continue;
    }

    const std::size_t first_link = 1 + brokers_.size();
    const std::size_t polled = (fds.size() - first_link) / 2;
    constexpr short kReadable = POLLIN | POLLHUP | POLLERR;
    for (std::size_t i = 0; i < polled; ++i) {
      Link& link = *links_[i];
      const short client = fds[first_link + 2 * i].revents;
      const short broker = fds[first_link + 2 * i + 1].revents;
      if (link.frozen) {
        // Nothing moves; a side that failed (reset, closed both ways) ends the link rather than
        // spin on its hang-up.
        if (((client | broker) & (POLLHUP | POLLERR)) != 0) links_[i].reset();
        continue;
      }
      bool alive = (client & kReadable) == 0 || FromClient(link);
      if (alive && (broker & kReadable) != 0) {
        // A held side is not read, but a broker that hung up ends the link (no spinning).
        alive = !held_ && FromBroker(link);
      }
      if (!alive) links_[i].reset();
    }
    std::erase_if(links_, [](const auto& link) { return link == nullptr; });
    for (std::size_t i = 0; i < brokers_.size(); ++i) {
      if ((fds[1 + i].revents & POLLIN) != 0) Accept(brokers_[i]);
    }
  }
}

}  // namespace outbox::testing
