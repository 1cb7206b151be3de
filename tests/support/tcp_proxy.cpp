#include "support/tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace outbox::testing {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  throw std::runtime_error("tcp proxy: " + what + ": " + std::strerror(errno));
}

// Writes all of `data` to a blocking socket; false when the peer is gone.
bool WriteAll(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t written = send(fd, data, size, MSG_NOSIGNAL);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return false;
    data += written;
    size -= static_cast<std::size_t>(written);
  }
  return true;
}

// Moves what is readable on `from` to `to`, adding the bytes to `counted` when given; false when
// either side is closed.
bool Pump(int from, int to, std::atomic<std::uint64_t>* counted = nullptr) {
  std::array<char, 65536> buffer{};
  const ssize_t got = recv(from, buffer.data(), buffer.size(), 0);
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (got <= 0) return false;
  const bool written = WriteAll(to, buffer.data(), static_cast<std::size_t>(got));
  if (counted != nullptr) *counted += static_cast<std::uint64_t>(got);
  return written;
}

int ConnectUpstream(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
  int fd = socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd >= 0) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

}  // namespace

TcpProxy::TcpProxy(std::string upstream_host, int upstream_port, int listen_port)
    : upstream_host_(std::move(upstream_host)), upstream_port_(upstream_port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  if (listen_fd_ < 0) Fail("socket");
  const int yes = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<std::uint16_t>(listen_port));
  sockaddr* generic = reinterpret_cast<sockaddr*>(&address);
  if (bind(listen_fd_, generic, sizeof address) != 0) Fail("bind");
  // A sink may open many connections at once (the HTTP sink: one per request in flight): a short
  // accept queue would drop their SYNs, and a dropped SYN is retried only after a second.
  if (listen(listen_fd_, SOMAXCONN) != 0) Fail("listen");
  socklen_t length = sizeof address;
  if (getsockname(listen_fd_, generic, &length) != 0) Fail("getsockname");
  port_ = ntohs(address.sin_port);
  if (pipe(wake_) != 0) Fail("pipe");
  fcntl(wake_[0], F_SETFL, O_NONBLOCK);
  thread_ = std::thread([this] { Run(); });
}

TcpProxy::~TcpProxy() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  Wake();
  thread_.join();
  for (Link& link : links_) CloseLink(link);
  close(listen_fd_);
  close(wake_[0]);
  close(wake_[1]);
}

void TcpProxy::SetMode(Mode mode) {
  std::unique_lock lock(mutex_);
  const bool freeze = mode == Mode::kFreeze && mode_ != Mode::kFreeze;
  const std::uint64_t ticket = freeze ? ++freeze_requested_ : 0;
  mode_ = mode;
  lock.unlock();
  Wake();
  if (!freeze) return;
  // Frozen before it returns: nothing the caller does next (a write that notifies the relay)
  // may still pass through a connection that was open.
  lock.lock();
  done_.wait(lock, [&] { return freeze_done_ >= ticket || stop_; });
}

bool TcpProxy::AwaitQuietReplies(std::chrono::milliseconds quiet,
                                 std::chrono::milliseconds limit) const {
  using Clock = std::chrono::steady_clock;
  const auto until = Clock::now() + limit;
  std::uint64_t seen = replied_bytes_.load();
  auto still_since = Clock::now();
  while (Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds{10});
    if (const std::uint64_t now_seen = replied_bytes_.load(); now_seen != seen) {
      seen = now_seen;
      still_since = Clock::now();
    } else if (Clock::now() - still_since >= quiet) {
      return true;
    }
  }
  return false;
}

void TcpProxy::DropAll() {
  std::unique_lock lock(mutex_);
  const std::uint64_t ticket = ++drop_requested_;
  lock.unlock();
  Wake();
  lock.lock();
  done_.wait(lock, [&] { return drop_done_ >= ticket; });
}

void TcpProxy::Wake() {
  const char byte = 1;
  [[maybe_unused]] const ssize_t ignored = write(wake_[1], &byte, 1);
}

void TcpProxy::CloseLink(Link& link) {
  if (link.client >= 0) close(link.client);
  if (link.upstream >= 0) close(link.upstream);
  link.client = link.upstream = -1;
}

void TcpProxy::Run() {
  for (;;) {
    Mode mode = Mode::kForward;
    std::uint64_t drops = 0;
    std::uint64_t freezes = 0;
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
      mode = mode_;
      drops = drop_requested_;
      freezes = freeze_requested_;
    }
    if (freezes > freeze_done_) {
      for (Link& link : links_) link.frozen = true;  // those open now; new ones are forwarded
      std::lock_guard lock(mutex_);
      freeze_done_ = freezes;
      done_.notify_all();
    }
    if (mode != Mode::kFreeze) {
      for (Link& link : links_) link.frozen = false;
    }
    if (drops > drop_done_) {
      for (Link& link : links_) CloseLink(link);
      links_.clear();
      std::lock_guard lock(mutex_);
      drop_done_ = drops;
      done_.notify_all();
    }

    // pollfds: wake pipe, listener, then per link its client and (when read) its upstream.
    std::vector<pollfd> fds;
    fds.push_back({.fd = wake_[0], .events = POLLIN, .revents = 0});
    fds.push_back({.fd = listen_fd_, .events = POLLIN, .revents = 0});
    for (const Link& link : links_) {
      const bool forward = link.upstream >= 0 && !link.frozen;
      const short client_events = forward ? short{POLLIN} : short{0};
      fds.push_back({.fd = link.client, .events = client_events, .revents = 0});
      const bool read_upstream = forward && mode != Mode::kHoldReplies;
      const short upstream_events = read_upstream ? short{POLLIN} : short{0};
      fds.push_back({.fd = link.upstream, .events = upstream_events, .revents = 0});
    }
    if (poll(fds.data(), fds.size(), 1000) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    {
      std::lock_guard lock(mutex_);
      mode = mode_;  // SetMode may have woken the poll
    }
    if ((fds[0].revents & POLLIN) != 0) {
      std::array<char, 64> drain{};
      while (read(wake_[0], drain.data(), drain.size()) > 0) {
      }
    }
    if ((fds[1].revents & POLLIN) != 0) {
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client >= 0) {
        const int one = 1;
        setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        Link link{.client = client, .upstream = -1};
        if (mode != Mode::kBlackhole) {
          link.upstream = ConnectUpstream(upstream_host_, upstream_port_);
          if (link.upstream < 0) CloseLink(link);
        }
        if (link.client >= 0) links_.push_back(link);
      }
    }
    // fds[2 + 2i] and fds[3 + 2i] belong to links_[i] as they were before the accept above.
    const std::size_t polled_links = (fds.size() - 2) / 2;
    for (std::size_t i = 0; i < polled_links; ++i) {
      Link& link = links_[i];
      const short client_events = fds[2 + 2 * i].revents;
      const short upstream_events = fds[3 + 2 * i].revents;
      bool alive = true;
      if (link.frozen) {
        // Nothing moves; only a side that failed (reset, both ways closed) ends it, rather than
        // spin on its hang-up.
        if (((client_events | upstream_events) & (POLLHUP | POLLERR)) != 0) CloseLink(link);
        continue;
      }
      // A side that is not read still reports a hang-up: close the link rather than spin.
      if (link.upstream < 0 && (client_events & (POLLHUP | POLLERR)) != 0) alive = false;
      if (link.upstream >= 0 && mode == Mode::kHoldReplies &&
          (upstream_events & (POLLHUP | POLLERR)) != 0) {
        alive = false;
      }
      if (alive && link.upstream >= 0 && (client_events & (POLLIN | POLLHUP | POLLERR)) != 0) {
        alive = Pump(link.client, link.upstream);
      }
      if (alive && link.upstream >= 0 && mode != Mode::kHoldReplies &&
          (upstream_events & (POLLIN | POLLHUP | POLLERR)) != 0) {
        alive = Pump(link.upstream, link.client, &replied_bytes_);
      }
      if (!alive) CloseLink(link);
    }
    std::erase_if(links_, [](const Link& link) { return link.client < 0; });
  }
}

}  // namespace outbox::testing
