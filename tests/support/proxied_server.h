#pragma once
// A test server behind a loopback TcpProxy, and the sink contract suite's faults made with it
// (tests/sink/sink_contract.h): the server down (the proxy stopped: connections cut, new ones
// refused) and up again on the same port, its replies held (lost confirmations, a silent
// server), its open connections frozen both ways while new ones go through.

#include <memory>
#include <string>
#include <utility>

#include "support/tcp_proxy.h"

namespace outbox::testing {

class ProxiedServer {
 public:
  ProxiedServer(std::string host, int port) : host_(std::move(host)), upstream_port_(port) {
    Start();
  }

  // Where clients connect (the same port before and after Down/Up).
  [[nodiscard]] int port() const { return port_; }

  void Down() { proxy_.reset(); }
  void Up() { Start(); }
  // Replies held until released; a proxy started while held holds too.
  void Hold(bool held) {
    held_ = held;
    if (proxy_) proxy_->SetMode(held ? TcpProxy::Mode::kHoldReplies : TcpProxy::Mode::kForward);
  }
  void Freeze() { proxy_->SetMode(TcpProxy::Mode::kFreeze); }
  void Thaw() { Hold(held_); }

 private:
  void Start() {
    proxy_ = std::make_unique<TcpProxy>(host_, upstream_port_, port_);
    port_ = proxy_->port();
    if (held_) proxy_->SetMode(TcpProxy::Mode::kHoldReplies);
  }

  std::string host_;
  int upstream_port_;
  std::unique_ptr<TcpProxy> proxy_;  // null while the server is down
  int port_ = 0;
  bool held_ = false;
};

}  // namespace outbox::testing
