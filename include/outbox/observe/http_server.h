#pragma once
// A small HTTP/1.1 server for outboxd's operations surface (health, metrics, admin API) that
// stays responsive under slow and many clients:
// - one I/O thread multiplexes every connection (a slow client holds a socket, not a thread);
// - deadlines are per request, not per read: the whole header must arrive within
//   `header_timeout` of the connection becoming ready for a request, the whole body within
//   `body_timeout`, the whole response be taken within `write_timeout`; a client that trickles
//   one byte at a time is cut off all the same;
// - at `max_connections`, the connection that has waited longest for its request header is
//   closed to admit the new one, so that a flood of idle sockets cannot lock out a probe;
// - routes say where they run: Lane::kInline on the I/O thread (must not block: in-memory work
//   such as /healthz and /metrics), Lane::kWorker on a small pool (database work), so a probe is
//   never queued behind admin work.
//
// Built on Boost.Beast (asio): cpp-httplib, which outboxd used before, gives each connection a
// pool thread for its whole life and has only per-read timeouts, so 8 slow clients starved it.
// Boost stays out of this header.
//
// Errors: Start() throws std::runtime_error when the address cannot be bound. Malformed requests
// get 400, over-long headers 431, bodies over `max_body_bytes` 413, unknown paths 404, a known
// path with another method 405; a handler that throws gets 500 (and the log says why).

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox/core/log.h"

namespace outbox::observe::http {

struct Request {
  std::string method;  // "GET", "POST", ... ("GET" also for a HEAD request)
  std::string path;    // percent-decoded, without the query
  // The query's parameters in order, percent-decoded ('+' is a space); repeated ones repeated.
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::pair<std::string, std::string>> headers;  // names as sent
  std::string body;
  std::string remote_address;  // the client's address, "127.0.0.1"

  // The first header called `name` (compared without case), or "" when there is none.
  [[nodiscard]] std::string_view Header(std::string_view name) const;
  // How often the query names `key`.
  [[nodiscard]] std::size_t QueryCount(std::string_view key) const;
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // further headers

  static Response Text(int status, std::string body);
};

using Handler = std::function<Response(const Request&)>;

enum class Lane : std::uint8_t {
  kInline,  // on the I/O thread: cheap, never blocks
  kWorker,  // on the worker pool: may block (database)
};

struct Route {
  std::string method;  // "GET" or "POST"
  // Exact path ("/healthz"), or a prefix ending in '/' when `prefix` is set ("/api/messages/"
  // matches "/api/messages/42", not "/api/messages/42/x").
  std::string path;
  bool prefix = false;
  Lane lane = Lane::kInline;
  Handler handler;
};

struct ServerOptions {
  std::string host = "127.0.0.1";  // "" or "0.0.0.0": every IPv4 address; "::": every address
  int port = 0;                    // 0: any free port (see Server::port())
  std::chrono::milliseconds header_timeout{5000};
  std::chrono::milliseconds body_timeout{10000};
  std::chrono::milliseconds write_timeout{10000};
  std::size_t max_header_bytes = 16 * 1024;
  std::size_t max_body_bytes = 64 * 1024;
  std::size_t max_connections = 512;
  std::size_t worker_threads = 2;
  int listen_backlog = 1024;
  // Runs before routing, on the I/O thread, for every request: a response here answers the
  // request (e.g. 401 for a missing token, also for a path that does not exist); nullopt lets it
  // through. May be empty.
  std::function<std::optional<Response>(const Request&)> guard;
  // Body of the 404 answer, e.g. the list of paths.
  std::string not_found_text = "404 not found\n";
};

// Parses one complete HTTP/1.1 request from `bytes` with the server's own parser and limits,
// then answers it through `routes` as the server would (guard, routing, 4xx for bad input), on
// the calling thread. nullopt when `bytes` hold no complete request. For tests and fuzzing.
std::optional<Response> AnswerRawRequest(std::string_view bytes, const ServerOptions& options,
                                         const std::vector<Route>& routes);

class Server {
 public:
  Server(ServerOptions options, std::vector<Route> routes, LogFn log);
  ~Server();  // Stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts serving; throws std::runtime_error when the address cannot be bound.
  void Start();
  // Closes the listener and every connection, and joins the threads; idempotent.
  void Stop();
  // The bound port (useful with port 0); 0 before Start().
  [[nodiscard]] int port() const;
  // Connections open right now (for tests and metrics).
  [[nodiscard]] std::size_t connections() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::observe::http
