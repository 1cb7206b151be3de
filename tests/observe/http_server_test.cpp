// observe::http::Server against raw sockets (bytes as a slow or hostile client sends them) and
// cpp-httplib's client (an HTTP implementation that is not the server's own).
#include "outbox/observe/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

namespace outbox::observe::http {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// A client socket on 127.0.0.1:port, closed when it goes.
class RawClient {
 public:
  explicit RawClient(int port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  }
  ~RawClient() { ::close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  [[nodiscard]] bool connected() const { return connected_; }

  // False once the server has closed or reset the connection.
  bool Send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t sent = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (sent <= 0) return false;
      bytes.remove_prefix(static_cast<std::size_t>(sent));
    }
    return true;
  }

  // Everything the server sends until it closes the connection or `timeout` passes.
  std::string ReadUntilClosed(milliseconds timeout = milliseconds{5000}) {
    std::string reply;
    const auto deadline = SteadyClock::now() + timeout;
    while (SteadyClock::now() < deadline) {
      if (!WaitReadable(deadline)) break;
      std::array<char, 4096> buffer{};
      const ssize_t got = ::recv(fd_, buffer.data(), buffer.size(), 0);
      if (got <= 0) {
        closed_ = true;
        break;
      }
      reply.append(buffer.data(), static_cast<std::size_t>(got));
    }
    return reply;
  }

  // Reads what is there within `timeout`; `closed()` tells whether the server closed.
  std::string ReadSome(milliseconds timeout) {
    std::string reply;
    if (!WaitReadable(SteadyClock::now() + timeout)) return reply;
    std::array<char, 4096> buffer{};
    const ssize_t got = ::recv(fd_, buffer.data(), buffer.size(), 0);
    if (got <= 0) {
      closed_ = true;
    } else {
      reply.append(buffer.data(), static_cast<std::size_t>(got));
    }
    return reply;
  }

  [[nodiscard]] bool closed() const { return closed_; }

 private:
  bool WaitReadable(SteadyClock::time_point deadline) const {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - SteadyClock::now());
    pollfd waiting{.fd = fd_, .events = POLLIN, .revents = 0};
    return ::poll(&waiting, 1, static_cast<int>(std::max<long>(left.count(), 0))) == 1;
  }

  int fd_;
  bool connected_ = false;
  bool closed_ = false;
};

Route Get(std::string path, Handler handler, Lane lane = Lane::kInline, bool prefix = false) {
  return Route{.method = "GET",
               .path = std::move(path),
               .prefix = prefix,
               .lane = lane,
               .handler = std::move(handler)};
}

Handler Text(std::string text) {
  return [text](const Request&) { return Response::Text(200, text); };
}

// Echoes what the server made of the request: path, query, body size.
Response Echo(const Request& request) {
  std::string text = request.method + " " + request.path + "\n";
  for (const auto& [key, value] : request.query) text += key + "=" + value + "\n";
  text += "body " + std::to_string(request.body.size()) + "\n";
  return Response::Text(200, text);
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options, std::vector<Route> routes) {
    options.host = "127.0.0.1";
    options.port = 0;
    server_ = std::make_unique<Server>(std::move(options), std::move(routes), LogFn{});
    server_->Start();
    ASSERT_GT(server_->port(), 0);
  }

  httplib::Result HttpGet(const std::string& path) {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_read_timeout(5, 0);
    return client.Get(path.c_str());
  }

  std::unique_ptr<Server> server_;
};

TEST_F(HttpServerTest, RoutesMethodsAndTheirErrors) {
  Route post{.method = "POST", .path = "/echo", .lane = Lane::kInline, .handler = Echo};
  ServerOptions options;
  options.guard = [](const Request& request) -> std::optional<Response> {
    if (request.path != "/secret") return std::nullopt;
    return Response::Text(401, "no\n");
  };
  Start(options, {Get("/echo", Echo), post, Get("/item/", Echo, Lane::kWorker, /*prefix=*/true),
                  Get("/secret", Text("leaked\n"))});

  // Raw: httplib's client would escape the '+'.
  RawClient echo(server_->port());
  echo.Send("GET /echo?k=a+b&k=%41%2f&empty=&flag HTTP/1.1\r\nConnection: close\r\n\r\n");
  const std::string echoed = echo.ReadUntilClosed();
  EXPECT_EQ(echoed.substr(0, 15), "HTTP/1.1 200 OK");
  EXPECT_NE(echoed.find("\r\n\r\nGET /echo\nk=a b\nk=A/\nempty=\nflag=\nbody 0\n"),
            std::string::npos)
      << echoed;
  auto item = HttpGet("/item/x%20y");
  ASSERT_TRUE(item);
  EXPECT_EQ(item->body, "GET /item/x y\nbody 0\n");
  EXPECT_EQ(HttpGet("/item/")->status, 404);
  EXPECT_EQ(HttpGet("/item/a/b")->status, 404);
  EXPECT_EQ(HttpGet("/nope")->status, 404);
  EXPECT_EQ(HttpGet("/secret")->status, 401);
  EXPECT_EQ(HttpGet("/secret")->body, "no\n");

  httplib::Client client("127.0.0.1", server_->port());
  auto wrong_method = client.Put("/echo", "x", "text/plain");
  ASSERT_TRUE(wrong_method);
  EXPECT_EQ(wrong_method->status, 405);
  EXPECT_EQ(wrong_method->get_header_value("Allow"), "GET, POST");

  auto head = client.Head("/echo");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->body, "");
  EXPECT_EQ(head->get_header_value("Content-Length"), "17");  // of "GET /echo\nbody 0\n"

  RawClient bad_escape(server_->port());
  bad_escape.Send("GET /echo?k=%4 HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(bad_escape.ReadUntilClosed().substr(0, 12), "HTTP/1.1 400");
  RawClient absolute_form(server_->port());
  absolute_form.Send("GET http://elsewhere/echo HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(absolute_form.ReadUntilClosed().substr(0, 12), "HTTP/1.1 400");
}

TEST_F(HttpServerTest, TheBodyLimitHoldsAndExpectContinueIsAnswered) {
  Route post{.method = "POST", .path = "/echo", .lane = Lane::kWorker, .handler = Echo};
  ServerOptions options;
  options.max_body_bytes = 64 * 1024;
  Start(options, {post});

  httplib::Client client("127.0.0.1", server_->port());
  const std::string full(64 * 1024, 'x');
  // A form content type (what `curl -d` sends) does not matter: the body arrives as sent.
  auto fits = client.Post("/echo", full, "application/x-www-form-urlencoded");
  ASSERT_TRUE(fits);
  EXPECT_EQ(fits->status, 200);
  EXPECT_EQ(fits->body, "POST /echo\nbody 65536\n");

  // One byte more: 413, and the client reads it although it is still sending.
  RawClient over(server_->port());
  over.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 65537\r\n\r\n");
  over.Send(full + "x");
  EXPECT_EQ(over.ReadUntilClosed().substr(0, 12), "HTTP/1.1 413");

  RawClient chunked(server_->port());
  chunked.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
  for (int i = 0; i < 70 && chunked.Send("400\r\n" + std::string(1024, 'y') + "\r\n"); ++i) {
  }
  EXPECT_EQ(chunked.ReadUntilClosed().substr(0, 12), "HTTP/1.1 413");

  RawClient expect(server_->port());
  expect.Send(
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_EQ(expect.ReadSome(milliseconds{5000}), "HTTP/1.1 100 Continue\r\n\r\n");
  expect.Send("abc");
  const std::string reply = expect.ReadSome(milliseconds{5000});
  EXPECT_EQ(reply.substr(0, 15), "HTTP/1.1 200 OK") << reply;
  EXPECT_NE(reply.find("POST /echo\nbody 3\n"), std::string::npos) << reply;
}

TEST_F(HttpServerTest, PipelinedRequestsOnOneConnectionAreAnsweredInOrder) {
  Start({}, {Get("/a", Text("first\n")), Get("/b", Text("second\n"), Lane::kWorker)});
  RawClient client(server_->port());
  client.Send(
      "GET /b HTTP/1.1\r\nHost: x\r\n\r\nGET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string replies = client.ReadUntilClosed();
  const auto second = replies.find("second\n");
  const auto first = replies.find("first\n");
  ASSERT_NE(second, std::string::npos) << replies;
  ASSERT_NE(first, std::string::npos) << replies;
  EXPECT_LT(second, first);
}

// The deadlines hold for the whole header and the whole body, however the bytes trickle in.
TEST_F(HttpServerTest, DeadlinesArePerRequestNotPerRead) {
  ServerOptions options;
  options.header_timeout = milliseconds{500};
  options.body_timeout = milliseconds{500};
  Route post{.method = "POST", .path = "/echo", .lane = Lane::kInline, .handler = Echo};
  Start(options, {Get("/echo", Echo), post});

  const auto cut_off_after = [](RawClient& client, std::string_view piece) {
    const auto started = SteadyClock::now();
    // One piece every 100 ms for up to 10 s: far longer than either deadline.
    for (int i = 0; i < 100; ++i) {
      if (!client.Send(piece)) break;
      client.ReadSome(milliseconds{100});
      if (client.closed()) break;
    }
    return std::chrono::duration_cast<milliseconds>(SteadyClock::now() - started);
  };
  RawClient slow_header(server_->port());
  ASSERT_TRUE(slow_header.Send("GET /echo HTTP/1.1\r\n"));
  const milliseconds header_took = cut_off_after(slow_header, "X-Slow: 1\r\n");
  EXPECT_TRUE(slow_header.closed());
  EXPECT_LT(header_took, milliseconds{5000});

  RawClient slow_body(server_->port());
  ASSERT_TRUE(slow_body.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"));
  const milliseconds body_took = cut_off_after(slow_body, "z");
  EXPECT_TRUE(slow_body.closed());
  EXPECT_LT(body_took, milliseconds{5000});

  auto fine = HttpGet("/echo");
  ASSERT_TRUE(fine);
  EXPECT_EQ(fine->status, 200);
}

// A worker route that blocks does not hold up the inline routes; a second blocked request is
// queued, not refused, and both finish when released.
TEST_F(HttpServerTest, InlineRoutesAnswerWhileWorkersAreBusy) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  ServerOptions options;
  options.worker_threads = 1;
  Start(options, {Get("/healthz", Text("ok\n")), Get(
                                                     "/block",
                                                     [released](const Request&) {
                                                       released.wait();
                                                       return Response::Text(200, "done\n");
                                                     },
                                                     Lane::kWorker)});
  auto blocked = std::async(std::launch::async, [this] { return HttpGet("/block"); });
  std::this_thread::sleep_for(milliseconds{100});
  for (int i = 0; i < 5; ++i) {
    auto health = HttpGet("/healthz");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->body, "ok\n");
  }
  release.set_value();
  auto done = blocked.get();
  ASSERT_TRUE(done);
  EXPECT_EQ(done->body, "done\n");
}

// At the connection limit, the connection that has waited longest for a request header makes
// room for the new one.
TEST_F(HttpServerTest, AtTheLimitTheLongestIdleConnectionMakesRoom) {
  ServerOptions options;
  options.max_connections = 10;
  Start(options, {Get("/healthz", Text("ok\n"))});
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 10; ++i) {
    idle.push_back(std::make_unique<RawClient>(server_->port()));
    ASSERT_TRUE(idle.back()->connected());
    std::this_thread::sleep_for(milliseconds{5});
  }
  for (int i = 0; i < 50 && server_->connections() < 10; ++i) {
    std::this_thread::sleep_for(milliseconds{10});
  }
  ASSERT_EQ(server_->connections(), 10U);
  auto health = HttpGet("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->body, "ok\n");
  idle.front()->ReadSome(milliseconds{2000});
  EXPECT_TRUE(idle.front()->closed());
  idle.back()->ReadSome(milliseconds{100});
  EXPECT_FALSE(idle.back()->closed());
}

// A port in use is reported with the OS's reason for it (it read "Success": the error code was
// overwritten by closing the socket before the message was made).
TEST_F(HttpServerTest, APortInUseIsReportedAsSuch) {
  Start({}, {Get("/x", Text("x"))});
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = server_->port();
  Server second(options, {Get("/x", Text("x"))}, LogFn{});
  try {
    second.Start();
    ADD_FAILURE() << "a second server listens on the same port";
  } catch (const std::runtime_error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("cannot listen on 127.0.0.1:" + std::to_string(options.port) +
                           ": Address already in use (bind)"),
              std::string::npos)
        << message;
    EXPECT_EQ(message.find("Success"), std::string::npos) << message;
  }
  EXPECT_EQ(HttpGet("/x")->status, 200);  // the first one still serves
}

TEST(HttpAnswerRawRequestTest, ParsesAndRoutesLikeTheServer) {
  const std::vector<Route> routes{Get("/echo", Echo)};
  ServerOptions options;
  options.max_header_bytes = 1024;
  const auto answer =
      AnswerRawRequest("GET /echo?a=1 HTTP/1.1\r\nHost: x\r\n\r\n", options, routes);
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->status, 200);
  EXPECT_EQ(answer->body, "GET /echo\na=1\nbody 0\n");
  EXPECT_FALSE(AnswerRawRequest("GET /echo HTTP/1.1\r\nHost:", options, routes));
  EXPECT_EQ(AnswerRawRequest("GET /echo HTTP/1.1\r\nX: " + std::string(2000, 'a') + "\r\n\r\n",
                             options, routes)
                ->status,
            431);
  EXPECT_EQ(AnswerRawRequest("\x01\x02 nonsense\r\n\r\n", options, routes)->status, 400);
}

}  // namespace
}  // namespace outbox::observe::http
