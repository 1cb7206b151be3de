// outboxd's HTTP listener end to end: real PostgreSQL, real RabbitMQ, the real binary. /metrics
// and /api/outbox agree with the database, /readyz follows the broker, garbage requests get 4xx
// while the relay keeps publishing, and no password or token ever shows.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "../postgres/pg_test_support.h"
#include "amqp_test_client.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class Daemon {
 public:
  explicit Daemon(const std::string& config_path) {
    pid_ = fork();
    if (pid_ == 0) {
      const std::string log = config_path + ".log";
      std::freopen(log.c_str(), "a", stderr);
      execl(OUTBOXD_PATH, "outboxd", "--config", config_path.c_str(), nullptr);
      _exit(127);
    }
  }
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int Stop() {
    kill(pid_, SIGTERM);
    for (int i = 0; i < 1500; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(milliseconds{20});
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
};

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t size = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  ::close(fd);
  return ntohs(address.sin_port);
}

// Sends `bytes` on a raw connection; the reply's first line ("" when the server just closed).
std::string RawRequest(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return "<connect failed>";
  }
  (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  timeval timeout{.tv_sec = 5, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  std::string reply;
  std::array<char, 4096> buffer{};
  for (ssize_t got = 0; (got = ::recv(fd, buffer.data(), buffer.size(), 0)) > 0;) {
    reply.append(buffer.data(), static_cast<std::size_t>(got));
    if (reply.find("\r\n") != std::string::npos) break;
  }
  ::close(fd);
  return reply.substr(0, reply.find("\r\n"));
}

// The value of the sample `series` (e.g. outbox_messages{status="pending"}); -1 when absent.
double Sample(const std::string& metrics, const std::string& series) {
  const std::size_t at = metrics.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(metrics.substr(at + series.size() + 2));
}

std::string ServicesScript() { return std::string{PROJECT_SOURCE_DIR} + "/scripts/services"; }

class HttpE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    queue_ = "http_" + schema_.name();
    full_ = queue_ + "_full";
    DeclareQueue(queue_);
    DeclareQueue(full_, {{"x-overflow", "reject-publish"}}, {{"x-max-length", 0}});
    config_path_ = "/tmp/outboxd-" + schema_.name() + ".toml";
    port_ = FreePort();
  }
  void TearDown() override {
    DeleteQueue(queue_);
    DeleteQueue(full_);
    std::remove(config_path_.c_str());
    std::remove((config_path_ + ".log").c_str());
  }

  void WriteConfig(const std::string& database_url, const std::string& token) {
    std::ofstream out(config_path_);
    out << "[database]\nurl = \"" << database_url << "\"\nschema = \"" << schema_.name() << "\"\n"
        << "[relay]\ninstance = \"http-e2e\"\nlease = \"10s\"\npublish_timeout = \"5s\"\n"
        << "sweep_interval = \"200ms\"\nmax_backoff = \"500ms\"\n"
        << "[retry]\ninitial_delay = \"100ms\"\nmax_delay = \"200ms\"\nmax_attempts = 2\n"
        << "[http]\nlisten = \"127.0.0.1:" << port_ << "\"\ntoken = \"" << token << "\"\n"
        << "stats_interval = \"200ms\"\nready_max_age = \"1s\"\n"
        << "[sinks.default]\ntype = \"rabbitmq\"\nurl = \"" << AmqpUrl() << "\"\n";
  }

  void Enqueue(const std::string& queue, int count) {
    Sql(schema_.conn(), "SELECT " + schema_.name() + ".enqueue('" + queue +
                            "', '{}') FROM generate_series(1, " + std::to_string(count) + ")");
  }

  std::int64_t Count(const std::string& where) {
    return std::stoll(Scalar(
        schema_.conn(), "SELECT count(*) FROM " + schema_.name() + ".messages WHERE " + where));
  }

  httplib::Result Get(const std::string& path, const std::string& token) {
    httplib::Client client("127.0.0.1", port_);
    client.set_connection_timeout(2, 0);
    client.set_read_timeout(5, 0);
    httplib::Headers headers;
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
    return client.Get(path.c_str(), headers);
  }

  int Status(const std::string& path, const std::string& token) {
    auto result = Get(path, token);
    return result ? result->status : -1;
  }

  // Polls until `path` answers `status`, at most `limit`.
  bool WaitForStatus(const std::string& path, const std::string& token, int status,
                     milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (Status(path, token) == status) return true;
      std::this_thread::sleep_for(milliseconds{100});
    }
    return false;
  }

  std::string Log() {
    std::ifstream in(config_path_ + ".log");
    return {std::istreambuf_iterator<char>(in), {}};
  }

  TestSchema schema_;
  std::string queue_;
  std::string full_;
  std::string config_path_;
  int port_ = 0;
};

TEST_F(HttpE2eTest, EndpointsAgreeWithTheDatabaseFollowTheBrokerAndShrugOffGarbage) {
  const std::string token = "tok-e2e-" + std::to_string(std::random_device{}());
  WriteConfig(PgUrl(), token);
  Consumer consumer(queue_);
  Enqueue(queue_, 300);
  Enqueue(full_, 1);  // nacked twice, then abandoned
  Daemon outboxd(config_path_);
  for (int i = 0; i < 600 && (consumer.count() < 300 || Count("status = 'abandoned'") < 1); ++i) {
    std::this_thread::sleep_for(milliseconds{50});
  }
  ASSERT_EQ(consumer.count(), 300U) << Log();
  ASSERT_EQ(Count("status = 'abandoned'"), 1) << Log();
  ASSERT_EQ(Count("true"), 1);
  std::this_thread::sleep_for(milliseconds{600});  // a stats refresh after the last change

  auto metrics = Get("/metrics", token);
  ASSERT_TRUE(metrics);
  ASSERT_EQ(metrics->status, 200);
  const std::string& text = metrics->body;
  EXPECT_EQ(Sample(text, "outbox_messages{status=\"abandoned\"}"), 1) << text;
  EXPECT_EQ(Sample(text, "outbox_messages{status=\"pending\"}"), 0) << text;
  EXPECT_EQ(Sample(text, "outbox_messages{status=\"processing\"}"), 0) << text;
  EXPECT_EQ(Sample(text, "outbox_messages{status=\"failed\"}"), 0) << text;
  EXPECT_EQ(Sample(text, "outbox_published_total"), 300) << text;
  EXPECT_EQ(Sample(text, "outbox_abandoned_total{reason=\"rejected\"}"), 1) << text;
  EXPECT_EQ(Sample(text, "outbox_publish_failures_total{reason=\"rejected\"}"), 2) << text;
  EXPECT_EQ(Sample(text, "outbox_retries_total"), 1) << text;
  EXPECT_EQ(Sample(text, "outbox_publish_latency_seconds_count"), 300) << text;
  EXPECT_EQ(Sample(text, "outbox_relay_leases_held"), 0) << text;
  EXPECT_EQ(Sample(text, "outbox_sink_reachable{sink=\"default\"}"), 1) << text;
  EXPECT_EQ(Sample(text, "outbox_ready"), 1) << text;
  EXPECT_GE(Sample(text, "outbox_relay_claim_batch_size_count"), 1) << text;
  std::printf("[ http ] /metrics:\n%s\n", text.c_str());

  auto json = Get("/api/outbox", token);
  ASSERT_TRUE(json);
  EXPECT_EQ(json->status, 200);
  EXPECT_EQ(json->get_header_value("Content-Type"), "application/json");
  EXPECT_NE(json->body.find("\"outbox_messages\":{\"type\":\"gauge\""), std::string::npos);
  EXPECT_NE(json->body.find("{\"labels\":{\"status\":\"abandoned\"},\"value\":1}"),
            std::string::npos)
      << json->body;
  EXPECT_NE(json->body.find("\"kind\":\"rejected\",\"message\":\"message "), std::string::npos)
      << json->body;

  EXPECT_EQ(Status("/healthz", ""), 200);
  EXPECT_EQ(Status("/readyz", token), 200) << Get("/readyz", token)->body;

  // Garbage, while messages keep flowing.
  Enqueue(queue_, 200);
  std::mt19937 random(42);
  std::string noise(8192, '\0');
  for (char& c : noise) c = static_cast<char>(random());
  EXPECT_EQ(RawRequest(port_, noise), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(RawRequest(port_, "GET /metrics HTTP/1.1\r\nAuthorization: Bearer " + token +
                                  "\r\nX-Big: " + std::string(100 * 1024, 'h') + "\r\n\r\n")
                .substr(0, 10),
            "HTTP/1.1 4");
  EXPECT_EQ(Status("/no/such/path", token), 404);
  EXPECT_EQ(Status("/metrics", ""), 401);
  EXPECT_EQ(Status("/api/outbox", token + "x"), 401);
  EXPECT_EQ(Status("/readyz", "wrong"), 401);
  for (int i = 0; i < 300 && consumer.count() < 500; ++i) {
    std::this_thread::sleep_for(milliseconds{50});
  }
  EXPECT_EQ(consumer.count(), 500U) << "the relay kept publishing";
  EXPECT_EQ(Status("/healthz", ""), 200);

  // The broker goes away: not ready within a few seconds; back: ready again.
  const auto stopped_at = std::chrono::steady_clock::now();
  ASSERT_EQ(std::system((ServicesScript() + " rabbitmqctl stop_app >/dev/null").c_str()), 0);
  const bool went_unready = WaitForStatus("/readyz", token, 503, seconds{10});
  const auto unready_after = std::chrono::steady_clock::now() - stopped_at;
  const std::string report = Get("/readyz", token)->body;
  ASSERT_EQ(std::system((ServicesScript() + " rabbitmqctl start_app >/dev/null").c_str()), 0);
  EXPECT_TRUE(went_unready) << Log();
  EXPECT_NE(report.find("sink default: broker refuses TCP connections"), std::string::npos)
      << report;
  EXPECT_TRUE(WaitForStatus("/readyz", token, 200, seconds{30})) << Get("/readyz", token)->body;
  std::printf("[ http ] /readyz 503 %.1f s after stop_app:\n%s",
              std::chrono::duration<double>(unready_after).count(), report.c_str());

  consumer.Stop();
  EXPECT_EQ(outboxd.Stop(), 0) << Log();
}

TEST_F(HttpE2eTest, NeitherThePasswordNorTheTokenEverShows) {
  // The test server trusts loopback connections, so any password connects; what matters is that
  // this one travels through the configuration, libpq and the logs.
  const std::string password = "pw-canary-" + std::to_string(std::random_device{}());
  const std::string token = "tok-canary-" + std::to_string(std::random_device{}());
  std::string url = PgUrl();
  const std::size_t at = url.find('@');
  const std::size_t colon = url.find(':', url.find("://") + 3);
  ASSERT_TRUE(at != std::string::npos && colon < at) << url;
  url = url.substr(0, colon + 1) + password + url.substr(at);
  WriteConfig(url, "");
  ::setenv("OUTBOX_HTTP_TOKEN", token.c_str(), 1);

  std::string check_output;
  {
    FILE* pipe = ::popen((std::string{OUTBOXD_PATH} + " --config " + config_path_ +
                          " --check-config --log-level debug 2>&1")
                             .c_str(),
                         "r");
    ASSERT_NE(pipe, nullptr);
    std::array<char, 4096> buffer{};
    for (std::size_t got = 0; (got = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) {
      check_output.append(buffer.data(), got);
    }
    EXPECT_EQ(::pclose(pipe), 0) << check_output;
  }
  EXPECT_NE(check_output.find("token = \"***\""), std::string::npos) << check_output;

  Consumer consumer(queue_);
  Enqueue(queue_, 50);
  Enqueue(full_, 1);
  std::string replies;
  {
    Daemon outboxd(config_path_);
    for (int i = 0; i < 600 && (consumer.count() < 50 || Count("status = 'abandoned'") < 1); ++i) {
      std::this_thread::sleep_for(milliseconds{50});
    }
    for (const std::string path : {"/metrics", "/api/outbox", "/readyz", "/healthz", "/nope"}) {
      for (const std::string& with : {token, std::string{}, std::string{"wrong"}}) {
        if (auto reply = Get(path, with)) {
          replies += reply->body;
          for (const auto& [name, value] : reply->headers) replies += name + ": " + value + "\n";
        }
      }
    }
    EXPECT_NE(replies.find("outbox_published_total 50"), std::string::npos) << replies;
    EXPECT_EQ(outboxd.Stop(), 0) << Log();
  }
  ::unsetenv("OUTBOX_HTTP_TOKEN");
  consumer.Stop();
  const std::string log = Log();
  EXPECT_NE(log.find("serving /metrics"), std::string::npos) << log;
  for (const std::string& secret : {password, token}) {
    EXPECT_EQ(check_output.find(secret), std::string::npos) << check_output;
    EXPECT_EQ(log.find(secret), std::string::npos) << log;
    EXPECT_EQ(replies.find(secret), std::string::npos) << replies;
  }
}

}  // namespace
}  // namespace outbox::testing
