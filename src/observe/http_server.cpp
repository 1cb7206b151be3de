#include "outbox/observe/http_server.h"

#include <array>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <list>
#include <stdexcept>
#include <thread>

#include "outbox/core/percent_decode.h"

namespace outbox::observe::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using SteadyClock = std::chrono::steady_clock;
using Parser = bhttp::request_parser<bhttp::string_body>;

// Admin work waiting for a worker beyond this answers 503 at once instead of queueing.
constexpr std::size_t kMaxQueuedWork = 64;

// Whether `error` is the HTTP parser's (a malformed request, which gets an answer) rather than
// the connection's.
bool IsParseError(const beast::error_code& error) {
  return error.category() == bhttp::make_error_code(bhttp::error::bad_target).category();
}

// The request `message` as a Request; nullopt when its target is not well-formed.
std::optional<Request> ToRequest(bhttp::request<bhttp::string_body>&& message,
                                 std::string remote_address) {
  Request request;
  request.method = std::string{message.method_string()};
  if (request.method == "HEAD") request.method = "GET";
  const std::string_view target{message.target().data(), message.target().size()};
  if (!target.starts_with('/')) return std::nullopt;  // absolute-form and '*' are not served
  const std::size_t question = target.find('?');
  auto path = PercentDecode(target.substr(0, question), /*plus_is_space=*/false);
  if (!path) return std::nullopt;
  request.path = std::move(*path);
  if (question != std::string_view::npos) {
    std::string_view query = target.substr(question + 1);
    while (!query.empty()) {
      const std::size_t amp = query.find('&');
      const std::string_view pair = query.substr(0, amp);
      query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
      if (pair.empty()) continue;
      const std::size_t equals = pair.find('=');
      auto key = PercentDecode(pair.substr(0, equals), true);
      auto value = PercentDecode(
          equals == std::string_view::npos ? std::string_view{} : pair.substr(equals + 1), true);
      if (!key || !value) return std::nullopt;
      request.query.emplace_back(std::move(*key), std::move(*value));
    }
  }
  for (const auto& field : message) {
    request.headers.emplace_back(std::string{field.name_string()}, std::string{field.value()});
  }
  request.body = std::move(message.body());
  request.remote_address = std::move(remote_address);
  return request;
}

bool PathMatches(const Route& route, std::string_view path) {
  if (!route.prefix) return path == route.path;
  if (!path.starts_with(route.path) || path.size() == route.path.size()) return false;
  return path.find('/', route.path.size()) == std::string_view::npos;
}

// The route for `request`, or the answer when there is none (404, 405) or the guard refuses.
std::pair<const Route*, std::optional<Response>> Select(const Request& request,
                                                        const std::vector<Route>& routes,
                                                        const ServerOptions& options) {
  if (options.guard) {
    if (auto refused = options.guard(request)) return {nullptr, std::move(refused)};
  }
  std::string allowed;
  for (const Route& route : routes) {
    if (!PathMatches(route, request.path)) continue;
    if (route.method == request.method) return {&route, std::nullopt};
    allowed += (allowed.empty() ? "" : ", ") + route.method;
  }
  if (allowed.empty()) return {nullptr, Response::Text(404, options.not_found_text)};
  Response refused = Response::Text(405, "405 method not allowed (allowed: " + allowed + ")\n");
  refused.headers.emplace_back("Allow", allowed);
  return {nullptr, std::move(refused)};
}

Response Run(const Route& route, const Request& request, const LogFn& log) {
  try {
    return route.handler(request);
  } catch (const std::exception& failure) {
    if (log)
      log(LogLevel::kError, "HTTP " + request.method + " " + route.path + ": " + failure.what());
  } catch (...) {
    if (log) log(LogLevel::kError, "HTTP " + request.method + " " + route.path + ": unknown error");
  }
  return Response::Text(500, "500 internal error\n");
}

// The answer to a request the parser refused (the connection is closed after it).
Response ParseErrorResponse(const beast::error_code& error) {
  if (error == bhttp::error::header_limit) {
    return Response::Text(431, "431 the request's header is too large\n");
  }
  if (error == bhttp::error::body_limit) {
    return Response::Text(413, "413 the request's body is too large\n");
  }
  return Response::Text(400, "400 bad request: " + error.message() + "\n");
}

void Limit(Parser& parser, const ServerOptions& options) {
  parser.header_limit(static_cast<std::uint32_t>(options.max_header_bytes));
  parser.body_limit(options.max_body_bytes);
}

bhttp::response<bhttp::string_body> ToMessage(Response&& response, bool head, bool keep_alive) {
  bhttp::response<bhttp::string_body> message{static_cast<bhttp::status>(response.status), 11};
  message.set(bhttp::field::server, "outboxd");
  message.set(bhttp::field::content_type, response.content_type);
  message.set(bhttp::field::cache_control, "no-store");
  for (auto& [name, value] : response.headers) message.set(name, value);
  message.keep_alive(keep_alive);
  const std::size_t size = response.body.size();
  message.body() = head ? std::string{} : std::move(response.body);
  message.content_length(size);
  return message;
}

}  // namespace

std::string_view Request::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (beast::iequals(key, beast::string_view{name.data(), name.size()})) return value;
  }
  return {};
}

std::size_t Request::QueryCount(std::string_view key) const {
  std::size_t count = 0;
  for (const auto& [name, value] : query) {
    if (name == key) ++count;
  }
  return count;
}

Response Response::Text(int status, std::string body) {
  Response response;
  response.status = status;
  response.body = std::move(body);
  return response;
}

std::optional<Response> AnswerRawRequest(std::string_view bytes, const ServerOptions& options,
                                         const std::vector<Route>& routes) {
  Parser parser;
  Limit(parser, options);
  parser.eager(true);
  beast::error_code error;
  while (!parser.is_done() && !bytes.empty()) {
    const std::size_t used = parser.put(asio::buffer(bytes.data(), bytes.size()), error);
    if (error == bhttp::error::need_more) return std::nullopt;
    if (error) return ParseErrorResponse(error);
    bytes.remove_prefix(used);
  }
  if (!parser.is_done()) return std::nullopt;
  auto request = ToRequest(parser.release(), "fuzz");
  if (!request) return Response::Text(400, "400 bad request: malformed target\n");
  auto [route, answer] = Select(*request, routes, options);
  if (answer) return answer;
  return Run(*route, *request, nullptr);
}

class Server::Impl {
 public:
  Impl(ServerOptions options, std::vector<Route> routes, LogFn log)
      : options_(std::move(options)),
        routes_(std::move(routes)),
        log_(std::move(log)),
        workers_(std::max<std::size_t>(options_.worker_threads, 1)) {}

  ~Impl() { Stop(); }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void Start() {
    const std::string host = options_.host.empty() ? "0.0.0.0" : options_.host;
    const std::string where = host + ":" + std::to_string(options_.port);
    beast::error_code error;
    tcp::resolver resolver{io_};
    const auto found =
        resolver.resolve(host, std::to_string(options_.port),
                         tcp::resolver::passive | tcp::resolver::numeric_service, error);
    if (error || found.empty()) {
      throw std::runtime_error("cannot listen on " + where + ": " +
                               (error ? error.message() : "no such address"));
    }
    const tcp::endpoint endpoint = found.begin()->endpoint();
    // SO_REUSEADDR only: SO_REUSEPORT would let a second outboxd share the port (and answer
    // half the scrapes) instead of failing to start.
    // On failure, the step's own error code goes into the message: closing the acceptor must
    // not overwrite it (a busy port read "Success").
    const auto fail = [&](std::string_view step) {
      beast::error_code ignored;
      acceptor_.close(ignored);
      throw std::runtime_error("cannot listen on " + where + ": " + error.message() + " (" +
                               std::string{step} + ")");
    };
    if (acceptor_.open(endpoint.protocol(), error)) fail("socket");
    if (acceptor_.set_option(asio::socket_base::reuse_address(true), error)) fail("setsockopt");
    if (acceptor_.bind(endpoint, error)) fail("bind");
    if (acceptor_.listen(options_.listen_backlog, error)) fail("listen");
    port_ = acceptor_.local_endpoint().port();
    Accept();
    io_thread_ = std::thread([this] { io_.run(); });
  }

  void Stop() {
    if (stopped_.exchange(true)) return;
    io_.stop();
    if (io_thread_.joinable()) io_thread_.join();
    workers_.join();  // finishes the admin work under way (bounded by its statement timeout)
  }

  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] std::size_t connections() const { return open_.load(); }

 private:
  class Session;

  void Log(LogLevel level, const std::string& message) const {
    if (log_) log_(level, message);
  }

  void Accept();
  // At max_connections: closes the connection that has waited longest for its request header.
  // False when every connection is busy with a request.
  bool MakeRoom();

  ServerOptions options_;
  std::vector<Route> routes_;
  LogFn log_;
  // Declared before io_: sessions that io_ still holds in handlers touch them when destroyed.
  std::atomic<bool> stopped_{false};
  std::atomic<int> port_{0};
  std::atomic<std::size_t> open_{0};
  std::atomic<std::size_t> queued_work_{0};
  std::list<std::weak_ptr<Session>> sessions_;  // I/O thread only
  asio::io_context io_;
  tcp::acceptor acceptor_{io_};
  asio::steady_timer accept_retry_{io_};
  asio::thread_pool workers_;
  std::thread io_thread_;
};

class Server::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl& server, tcp::socket socket) : server_(server), stream_(std::move(socket)) {
    beast::error_code error;
    const auto peer = stream_.socket().remote_endpoint(error);
    if (!error) remote_ = peer.address().to_string();
    ++server_.open_;
  }
  ~Session() { --server_.open_; }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void ReadHeader() {
    parser_.emplace();
    Limit(*parser_, server_.options_);
    waiting_since_ = SteadyClock::now();
    waiting_for_header_ = true;
    stream_.expires_after(server_.options_.header_timeout);
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = shared_from_this()](beast::error_code error, std::size_t) {
                               self->OnHeader(error);
                             });
  }

  [[nodiscard]] bool waiting_for_header() const { return waiting_for_header_ && !closed_; }
  [[nodiscard]] SteadyClock::time_point waiting_since() const { return waiting_since_; }

  void Close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

 private:
  void OnHeader(beast::error_code error) {
    waiting_for_header_ = false;
    if (Broken(error)) return;
    if (error) {
      Send(ParseErrorResponse(error), /*keep_alive=*/false);
      return;
    }
    head_ = parser_->get().method() == bhttp::verb::head;
    if (parser_->is_done()) {
      Dispatch();
      return;
    }
    stream_.expires_after(server_.options_.body_timeout);
    if (beast::iequals(parser_->get()[bhttp::field::expect], "100-continue")) {
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(stream_, asio::buffer(kContinue.data(), kContinue.size()),
                        [self = shared_from_this()](beast::error_code failed, std::size_t) {
                          if (self->Broken(failed)) return;
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code error, std::size_t) {
                        if (self->Broken(error)) return;
                        if (error) {
                          self->Send(ParseErrorResponse(error), /*keep_alive=*/false);
                          return;
                        }
                        self->Dispatch();
                      });
  }

  // Closes the connection when `error` leaves nothing to answer (the peer left, the deadline
  // passed, the server stops); true then.
  bool Broken(const beast::error_code& error) {
    // end_of_stream (the client closed between requests) is the parser's; every other error of
    // the connection's (timeout, reset, aborted) is not.
    if (closed_ || error == bhttp::error::end_of_stream || (error && !IsParseError(error))) {
      Close();
      return true;
    }
    return false;
  }

  void Dispatch() {
    const bool keep_alive = parser_->get().keep_alive();
    auto request = ToRequest(parser_->release(), remote_);
    if (!request) {
      Send(Response::Text(400, "400 bad request: malformed target\n"), false);
      return;
    }
    auto [route, answer] = Select(*request, server_.routes_, server_.options_);
    if (answer) {
      Send(std::move(*answer), keep_alive);
      return;
    }
    if (route->lane == Lane::kInline) {
      Send(Run(*route, *request, server_.log_), keep_alive);
      return;
    }
    if (server_.queued_work_.load() >= kMaxQueuedWork) {
      Send(Response::Text(503, "503 busy: too many requests are waiting; try again\n"), keep_alive);
      return;
    }
    ++server_.queued_work_;
    asio::post(server_.workers_, [self = shared_from_this(), route = route,
                                  request = std::move(*request), keep_alive]() mutable {
      --self->server_.queued_work_;
      Response response = Run(*route, request, self->server_.log_);
      asio::post(self->stream_.get_executor(),
                 [self, response = std::move(response), keep_alive]() mutable {
                   self->Send(std::move(response), keep_alive);
                 });
    });
  }

  void Send(Response&& response, bool keep_alive) {
    if (closed_) return;
    response_ = ToMessage(std::move(response), head_, keep_alive);
    stream_.expires_after(server_.options_.write_timeout);
    bhttp::async_write(
        stream_, response_,
        [self = shared_from_this(), keep_alive](beast::error_code error, std::size_t) {
          if (error) {
            self->Close();
          } else if (!keep_alive) {
            self->Linger();
          } else {
            self->ReadHeader();
          }
        });
  }

  // After a last answer: stops sending, then reads and drops what the client still sends, for a
  // short while, before closing. Closing with unread bytes would make the kernel reset the
  // connection, and the client could lose the answer (a 413 for a body it is still sending).
  void Linger() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(kLinger);
    Drain();
  }

  void Drain() {
    stream_.async_read_some(asio::buffer(drain_),
                            [self = shared_from_this()](beast::error_code error, std::size_t) {
                              if (error) {
                                self->Close();
                                return;
                              }
                              self->Drain();
                            });
  }

  static constexpr std::chrono::milliseconds kLinger{2000};

  Impl& server_;
  beast::tcp_stream stream_;
  std::array<char, 4096> drain_{};
  beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
  bhttp::response<bhttp::string_body> response_;  // alive while it is written
  std::string remote_;
  SteadyClock::time_point waiting_since_{};
  bool waiting_for_header_ = false;
  bool head_ = false;
  bool closed_ = false;
};

void Server::Impl::Accept() {
  acceptor_.async_accept([this](beast::error_code error, tcp::socket socket) {
    if (error == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (error) {
      // Out of descriptors, most likely: try again shortly rather than spin.
      Log(LogLevel::kWarn, "HTTP: accepting a connection failed: " + error.message());
      accept_retry_.expires_after(std::chrono::milliseconds{100});
      accept_retry_.async_wait([this](beast::error_code waited) {
        if (!waited) Accept();
      });
      return;
    }
    if (open_.load() >= options_.max_connections && !MakeRoom()) {
      beast::error_code ignored;
      socket.close(ignored);  // every connection is busy with a request: refuse this one
    } else {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      auto session = std::make_shared<Session>(*this, std::move(socket));
      if (sessions_.size() > 2 * options_.max_connections) {
        sessions_.remove_if([](const std::weak_ptr<Session>& gone) { return gone.expired(); });
      }
      sessions_.push_back(session);
      session->ReadHeader();
    }
    Accept();
  });
}

bool Server::Impl::MakeRoom() {
  std::shared_ptr<Session> oldest;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    auto session = it->lock();
    if (!session) {
      it = sessions_.erase(it);
      continue;
    }
    if (session->waiting_for_header() &&
        (!oldest || session->waiting_since() < oldest->waiting_since())) {
      oldest = session;
    }
    ++it;
  }
  if (!oldest) return false;
  oldest->Close();
  return true;
}

Server::Server(ServerOptions options, std::vector<Route> routes, LogFn log)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(routes), std::move(log))) {}
Server::~Server() = default;
void Server::Start() { impl_->Start(); }
void Server::Stop() { impl_->Stop(); }
int Server::port() const { return impl_->port(); }
std::size_t Server::connections() const { return impl_->connections(); }

}  // namespace outbox::observe::http
