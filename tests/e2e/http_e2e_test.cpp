// outboxd's HTTP listener end to end: real PostgreSQL, real RabbitMQ, the real binary. /metrics,
// /api/outbox and `outboxctl status --json` agree with the database, /readyz follows the broker
// and the database, the admin API replays an abandoned message with its original id and refuses
// unauthenticated or token-less mutations, garbage requests get 4xx while the relay keeps
// publishing, and no password or token ever shows.

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
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/amqp_test_client.h"
#include "support/child_process.h"
#include "support/free_port.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

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

// Runs `command` through the shell; its standard output.
std::string Output(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return output;
  std::array<char, 4096> buffer{};
  for (std::size_t got = 0; (got = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) {
    output.append(buffer.data(), got);
  }
  ::pclose(pipe);
  return output;
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

  // The test's database URL with an application_name of this test's own, so that the test can
  // find (and terminate) exactly this outboxd's connections on the shared server.
  std::string OwnUrl() const {
    const std::string url = PgUrl();
    return url + (url.find('?') == std::string::npos ? "?" : "&") + "application_name=" + AppName();
  }
  std::string AppName() const { return "outboxd_" + schema_.name(); }

  httplib::Result Post(const std::string& path, const std::string& token, const std::string& body) {
    httplib::Client client("127.0.0.1", port_);
    client.set_connection_timeout(2, 0);
    client.set_read_timeout(10, 0);
    httplib::Headers headers;
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
    return client.Post(path.c_str(), headers, body, "application/json");
  }

  int PostStatus(const std::string& path, const std::string& token, const std::string& body) {
    auto result = Post(path, token, body);
    return result ? result->status : -1;
  }

  // Counts by status on the database, as the gauges name them.
  std::map<std::string, std::int64_t> DatabaseCounts() {
    std::map<std::string, std::int64_t> counts;
    for (const std::string status : {"pending", "processing", "failed", "abandoned", "published"}) {
      counts[status] = Count("status = '" + status + "'");
    }
    return counts;
  }

  httplib::Result Get(const std::string& path, const std::string& token) {
    httplib::Client client("127.0.0.1", port_);
    client.set_connection_timeout(2, 0);
    client.set_read_timeout(5, 0);
    httplib::Headers headers;
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
    return client.Get(path.c_str(), headers);
  }

  // The reply's body, or "<no reply: ...>" when there was none (never a null dereference).
  std::string Body(const std::string& path, const std::string& token) {
    auto result = Get(path, token);
    return result ? result->body : "<no reply: " + httplib::to_string(result.error()) + ">";
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
  Outboxd outboxd(config_path_);
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
  // Every claim and every batch's publish is timed; each published batch was claimed, and the
  // idle claims found nothing, so the claims outnumber the publishes.
  const double claims = Sample(text, "outbox_relay_claim_seconds_count");
  const double publishes = Sample(text, "outbox_relay_publish_seconds_count");
  EXPECT_GE(publishes, 1) << text;
  EXPECT_GT(claims, publishes) << text;
  EXPECT_GT(Sample(text, "outbox_relay_publish_seconds_sum"), 0) << text;
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
  EXPECT_EQ(Status("/readyz", token), 200) << Body("/readyz", token);

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
  const std::string report = Body("/readyz", token);
  ASSERT_EQ(std::system((ServicesScript() + " rabbitmqctl start_app >/dev/null").c_str()), 0);
  EXPECT_TRUE(went_unready) << Log();
  EXPECT_NE(report.find("sink default: broker refuses TCP connections"), std::string::npos)
      << report;
  EXPECT_TRUE(WaitForStatus("/readyz", token, 200, seconds{30})) << Body("/readyz", token);
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
    Outboxd outboxd(config_path_);
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

TEST_F(HttpE2eTest, StatusAgreesEverywhereAndAnAbandonedMessageIsReplayedWithItsOriginalId) {
  using Json = nlohmann::json;
  const std::string token = "tok-admin-" + std::to_string(std::random_device{}());
  WriteConfig(OwnUrl(), token);
  Consumer consumer(queue_);
  Enqueue(queue_, 120);
  Sql(schema_.conn(), "SELECT " + schema_.name() + ".enqueue('" + full_ +
                          "', '{\"n\": 1}', correlation_id => 'corr-e2e-42')");
  Enqueue(queue_ + "_nobody", 3);  // no such queue: unroutable, rejected twice, abandoned
  Enqueue(queue_ + "_later", 3);   // not due for an hour: stays pending
  Sql(schema_.conn(), "UPDATE " + schema_.name() +
                          ".messages SET available_at = now() + interval '1 hour' WHERE topic = '" +
                          queue_ + "_later'");
  Outboxd outboxd(config_path_);
  for (int i = 0; i < 600 && (consumer.count() < 120 || Count("status = 'abandoned'") < 4); ++i) {
    std::this_thread::sleep_for(milliseconds{50});
  }
  ASSERT_EQ(consumer.count(), 120U) << Log();
  ASSERT_EQ(Count("status = 'abandoned'"), 4) << Log();
  // The failure lines carry the correlation id.
  EXPECT_NE(Log().find("attempt 1, correlation_id corr-e2e-42) failed"), std::string::npos)
      << Log();

  // /metrics, /api/outbox and outboxctl agree with the database (read before and after them).
  std::map<std::string, std::int64_t> database;
  std::string text;
  Json api;
  Json cli;
  bool agree = false;
  for (int round = 0; round < 20 && !agree; ++round) {
    std::this_thread::sleep_for(milliseconds{400});  // a stats refresh after the last change
    database = DatabaseCounts();
    auto metrics = Get("/metrics", token);
    auto json = Get("/api/outbox", token);
    ASSERT_TRUE(metrics && json);
    text = metrics->body;
    api = Json::parse(json->body);
    cli = Json::parse(Output(std::string{OUTBOXCTL_PATH} + " status --json --db '" + PgUrl() +
                             "' --schema " + schema_.name()));
    agree = database == DatabaseCounts();
    for (const auto& [status, count] : database) {
      double from_api = -1;
      for (const Json& series : api["metrics"]["outbox_messages"]["series"]) {
        if (series["labels"]["status"] == status) from_api = series["value"].get<double>();
      }
      agree = agree &&
              Sample(text, "outbox_messages{status=\"" + status + "\"}") ==
                  static_cast<double>(count) &&
              from_api == static_cast<double>(count) && cli[status].get<std::int64_t>() == count;
    }
  }
  EXPECT_TRUE(agree) << "database " << Json(database).dump() << "\n/api/outbox "
                     << api["metrics"]["outbox_messages"].dump() << "\noutboxctl " << cli.dump()
                     << "\n"
                     << text;
  EXPECT_EQ(database["abandoned"], 4);
  EXPECT_EQ(database["pending"], 3);
  const auto by_topic = [&](const std::string& status, const std::string& topic) {
    return Sample(text, "outbox_messages_by_topic{status=\"" + status +
                            "\",target=\"default\",topic=\"" + topic + "\"}");
  };
  EXPECT_EQ(by_topic("abandoned", full_), 1) << text;
  EXPECT_EQ(by_topic("abandoned", queue_ + "_nobody"), 3) << text;
  EXPECT_EQ(by_topic("pending", queue_ + "_later"), 3) << text;
  EXPECT_EQ(Sample(text, "outbox_messages_by_topic_skipped"), 0) << text;
  EXPECT_EQ(cli["counts_estimated"], false);

  // Authentication and garbage: nothing changes, the relay keeps publishing.
  const std::string abandoned_id =
      Scalar(schema_.conn(),
             "SELECT id FROM " + schema_.name() + ".messages WHERE topic = '" + full_ + "'");
  const std::string by_id = R"({"ids": [")" + abandoned_id + R"("]})";
  Enqueue(queue_, 80);
  EXPECT_EQ(PostStatus("/api/messages/replay", "", by_id), 401);
  EXPECT_EQ(PostStatus("/api/messages/replay", token + "x", by_id), 401);
  EXPECT_EQ(PostStatus("/api/messages/abandon", "", R"({"status": "failed", "reason": "x"})"), 401);
  EXPECT_EQ(Status("/api/messages", ""), 401);
  EXPECT_EQ(Status("/api/messages/" + abandoned_id, "wrong"), 401);
  const std::vector<std::pair<std::string, std::string>> garbage{
      {"/api/messages/replay", "not json"},
      {"/api/messages/replay", "[1, 2]"},
      {"/api/messages/replay", "{}"},  // would select everything
      {"/api/messages/replay", R"({"ids": "x"})"},
      {"/api/messages/replay", R"({"ids": ["not-a-uuid"]})"},
      {"/api/messages/replay", R"({"status": "published"})"},
      {"/api/messages/replay", R"({"status": "bogus"})"},
      {"/api/messages/replay", R"({"topic": 5})"},
      {"/api/messages/replay", R"({"older_than": "soon"})"},
      {"/api/messages/replay", R"({"ids": [], "surprise": "x"})"},
      {"/api/messages/abandon", R"({"status": "failed"})"},  // no reason
      {"/api/messages/abandon", R"({"status": "abandoned", "reason": "x"})"},
      {"/api/messages/abandon", std::string(5000, '{')},
  };
  for (const auto& [path, body] : garbage) {
    auto reply = Post(path, token, body);
    ASSERT_TRUE(reply) << body;
    EXPECT_EQ(reply->status, 400) << path << " " << body.substr(0, 100) << ": " << reply->body;
    EXPECT_NE(reply->body.find("\"error\":"), std::string::npos) << reply->body;
  }
  EXPECT_EQ(PostStatus("/api/messages/replay", token, std::string(100 * 1024, ' ')), 413);
  for (const std::string query :
       {"?status=bogus", "?limit=0", "?limit=x", "?after=nope", "?older_than=-1s", "?colour=red"}) {
    EXPECT_EQ(Status("/api/messages" + query, token), 400) << query;
  }
  EXPECT_EQ(Status("/api/messages/not-a-uuid", token), 400);
  EXPECT_EQ(Status("/api/messages/0190f5c2-0000-7000-8000-000000000000", token), 404);
  for (int i = 0; i < 300 && consumer.count() < 200; ++i) {
    std::this_thread::sleep_for(milliseconds{50});
  }
  EXPECT_EQ(consumer.count(), 200U) << "the relay kept publishing";
  EXPECT_EQ(Count("status = 'abandoned'"), 4);

  // List and show.
  auto listed = Get("/api/messages?status=abandoned&limit=10&topic=" + full_, token);
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->status, 200) << listed->body;
  const Json page = Json::parse(listed->body);
  ASSERT_EQ(page["messages"].size(), 1U) << listed->body;
  EXPECT_EQ(page["messages"][0]["id"], abandoned_id);
  EXPECT_EQ(page["messages"][0]["attempts"], 2);
  EXPECT_EQ(page["more"], false);
  auto paged = Get("/api/messages?topic=" + queue_ + "_later&limit=2", token);
  ASSERT_TRUE(paged);
  const Json first = Json::parse(paged->body);
  ASSERT_EQ(first["messages"].size(), 2U) << paged->body;
  EXPECT_EQ(first["more"], true);
  const Json second = Json::parse(Body("/api/messages?topic=" + queue_ + "_later&limit=2&after=" +
                                           first["next_after"].get<std::string>(),
                                       token));
  EXPECT_EQ(second["messages"].size(), 1U);
  EXPECT_EQ(second["more"], false);
  auto shown = Get("/api/messages/" + abandoned_id, token);
  ASSERT_TRUE(shown);
  ASSERT_EQ(shown->status, 200) << shown->body;
  const Json detail = Json::parse(shown->body);
  EXPECT_EQ(detail["status"], "abandoned");
  EXPECT_EQ(detail["payload"], "{\"n\": 1}");
  EXPECT_EQ(detail["headers"]["correlation_id"], "corr-e2e-42");

  // A dry run changes nothing.
  auto dry = Post("/api/messages/replay", token,
                  R"({"dry_run": true, "ids": [")" + abandoned_id + R"("]})");
  ASSERT_TRUE(dry);
  EXPECT_EQ(dry->status, 200) << dry->body;
  EXPECT_EQ(Json::parse(dry->body)["count"], 1);
  std::this_thread::sleep_for(milliseconds{500});
  EXPECT_EQ(Count("status = 'abandoned'"), 4);

  // Make its queue routable, replay it: the consumer gets it with its original id.
  DeleteQueue(full_);
  DeclareQueue(full_);
  Consumer replayed(full_);
  auto replay = Post("/api/messages/replay", token,
                     R"({"reason": "queue fixed", "ids": [")" + abandoned_id + R"("]})");
  ASSERT_TRUE(replay);
  ASSERT_EQ(replay->status, 200) << replay->body;
  const Json result = Json::parse(replay->body);
  EXPECT_EQ(result["count"], 1);
  EXPECT_EQ(result["ids"], Json::array({abandoned_id}));
  EXPECT_EQ(result["dry_run"], false);
  for (int i = 0; i < 200 && replayed.count() < 1; ++i) {
    std::this_thread::sleep_for(milliseconds{50});
  }
  ASSERT_EQ(replayed.count(), 1U) << Log();
  EXPECT_EQ(replayed.deliveries()[0].message_id, abandoned_id);
  EXPECT_EQ(Count("status = 'abandoned'"), 3);
  EXPECT_NE(Log().find("admin API (127.0.0.1): replayed 1 messages; reason: queue fixed"),
            std::string::npos)
      << Log();

  // Abandon the delayed ones through the API.
  auto abandon = Post("/api/messages/abandon", token,
                      R"({"topic": ")" + queue_ + R"(_later", "reason": "not wanted"})");
  ASSERT_TRUE(abandon);
  EXPECT_EQ(abandon->status, 200) << abandon->body;
  EXPECT_EQ(Json::parse(abandon->body)["count"], 3);
  EXPECT_EQ(Count("status = 'abandoned' AND last_error LIKE '%not wanted%'"), 3);

  replayed.Stop();
  consumer.Stop();
  EXPECT_EQ(outboxd.Stop(), 0) << Log();
}

TEST_F(HttpE2eTest, WithoutATokenTheAdminRoutesAnswer403) {
  ::unsetenv("OUTBOX_HTTP_TOKEN");
  WriteConfig(OwnUrl(), "");
  Enqueue(full_, 1);
  Outboxd outboxd(config_path_);
  ASSERT_TRUE(WaitForStatus("/readyz", "", 200, seconds{20})) << Log();
  for (int i = 0; i < 200 && Count("status = 'abandoned'") < 1; ++i) {
    std::this_thread::sleep_for(milliseconds{50});
  }
  ASSERT_EQ(Count("status = 'abandoned'"), 1) << Log();
  EXPECT_EQ(PostStatus("/api/messages/replay", "", R"({"status": "abandoned"})"), 403);
  EXPECT_EQ(PostStatus("/api/messages/replay", "anything", R"({"status": "abandoned"})"), 403);
  EXPECT_EQ(PostStatus("/api/messages/abandon", "", R"({"status": "pending", "reason": "x"})"),
            403);
  EXPECT_EQ(Status("/api/messages", ""), 403);
  EXPECT_EQ(Status("/api/messages/0190f5c2-0000-7000-8000-000000000000", ""), 403);
  EXPECT_EQ(Status("/metrics", ""), 200);
  std::this_thread::sleep_for(milliseconds{500});
  EXPECT_EQ(Count("status = 'abandoned'"), 1);
  EXPECT_EQ(outboxd.Stop(), 0) << Log();
}

// Bad values of the admin API's parameters get 400 in our own words on real PostgreSQL, which
// answers a comparison with invalid UTF-8 or a NUL byte with SQLSTATE 22021 (relayed as 500 with
// the database's text before); good values, non-ASCII ones included, still reach it.
TEST_F(HttpE2eTest, BadParameterValuesAnswer400InOurOwnWords) {
  using Json = nlohmann::json;
  const std::string token = "tok-values-" + std::to_string(std::random_device{}());
  WriteConfig(OwnUrl(), token);
  Enqueue(queue_ + "_later", 2);  // due in an hour: they stay to be listed
  Sql(schema_.conn(),
      "UPDATE " + schema_.name() + ".messages SET available_at = now() + interval '1 hour'");
  Outboxd outboxd(config_path_);
  ASSERT_TRUE(WaitForStatus("/readyz", token, 200, seconds{20})) << Log();
  const auto expect_400 = [&](const httplib::Result& reply, const std::string& request,
                              const std::string& words) {
    ASSERT_TRUE(reply) << request;
    EXPECT_EQ(reply->status, 400) << request << ": " << reply->body;
    const Json json = Json::parse(reply->body, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(json.is_object() && json["error"].is_string()) << request << ": " << reply->body;
    EXPECT_EQ(json["error"], words) << request;
  };
  for (const auto& [query, words] : std::vector<std::pair<std::string, std::string>>{
           {"topic=%ff", "topic is not valid UTF-8"},
           {"topic=%c3", "topic is not valid UTF-8"},
           {"stream=a%00b", "stream contains a control character (0x00)"},
           {"target=" + std::string(256, 't'), "target is 256 bytes, over the limit of 255"},
           {"event=%ff", "event is not valid UTF-8"},
           {"limit=12abc", "limit must be a number from 1 to 10000"}}) {
    expect_400(Get("/api/messages?" + query, token), query, words);
  }
  expect_400(Post("/api/messages/replay", token, R"({"topic": "a\u0000b"})"), "topic NUL",
             "topic contains a control character (0x00)");
  expect_400(Post("/api/messages/abandon", token, R"({"status": "pending", "reason": "a\u0000"})"),
             "reason NUL", "reason contains a NUL byte");
  // Good values still reach the database: a non-ASCII topic matches nothing, ours matches.
  auto cafe = Get("/api/messages?topic=caf%C3%A9", token);
  ASSERT_TRUE(cafe);
  ASSERT_EQ(cafe->status, 200) << cafe->body;
  EXPECT_EQ(Json::parse(cafe->body)["messages"].size(), 0U);
  auto ours = Get("/api/messages?topic=" + queue_ + "_later", token);
  ASSERT_TRUE(ours);
  ASSERT_EQ(ours->status, 200) << ours->body;
  EXPECT_EQ(Json::parse(ours->body)["messages"].size(), 2U) << ours->body;
  EXPECT_EQ(Log().find("SQLSTATE"), std::string::npos) << Log();
  EXPECT_EQ(outboxd.Stop(), 0) << Log();
}

// What `curl -d` sends: the README's 1,000-id request (well over 8 KiB) labelled as a form; a
// reason that tries to forge a log line; a second admin request while one waits on a lock.
TEST_F(HttpE2eTest, FormLabelledBodiesForgedLogLinesAndABusyAdminConnection) {
  using Json = nlohmann::json;
  const std::string token = "tok-hostile-" + std::to_string(std::random_device{}());
  WriteConfig(OwnUrl(), token);
  Enqueue(queue_ + "_later", 3);
  Sql(schema_.conn(),
      "UPDATE " + schema_.name() + ".messages SET available_at = now() + interval '1 hour'");
  Outboxd outboxd(config_path_);
  ASSERT_TRUE(WaitForStatus("/readyz", token, 200, seconds{20})) << Log();
  httplib::Client client("127.0.0.1", port_);
  client.set_read_timeout(20, 0);
  const httplib::Headers auth{{"Authorization", "Bearer " + token}};

  std::string ids;
  for (int i = 0; i < 1000; ++i) {
    std::array<char, 40> id{};
    std::snprintf(id.data(), id.size(), "0190f5c2-0000-7000-8000-%012d", i);
    ids += std::string{i == 0 ? "" : ", "} + "\"" + id.data() + "\"";
  }
  const std::string thousand = R"({"dry_run": true, "ids": [)" + ids + "]}";
  ASSERT_GT(thousand.size(), 8192U);
  auto form =
      client.Post("/api/messages/replay", auth, thousand, "application/x-www-form-urlencoded");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 200) << form->body;
  EXPECT_EQ(Json::parse(form->body)["count"], 0);
  auto too_big = client.Post("/api/messages/replay", auth, std::string(65 * 1024, ' ') + "{}",
                             "application/json");
  ASSERT_TRUE(too_big);
  EXPECT_EQ(too_big->status, 413);

  const std::string forged = "line one\n[2026-11-25 00:00:00.000] [outboxd] [info] forged\x1b[31m";
  auto abandon = client.Post("/api/messages/abandon", auth,
                             Json{{"topic", queue_ + "_later"}, {"reason", forged}}.dump(),
                             "application/json");
  ASSERT_TRUE(abandon);
  EXPECT_EQ(abandon->status, 200) << abandon->body;
  EXPECT_EQ(Json::parse(abandon->body)["count"], 3);
  for (int i = 0; i < 50 && Log().find("forged") == std::string::npos; ++i) {
    std::this_thread::sleep_for(milliseconds{100});
  }
  const std::string log = Log();
  EXPECT_EQ(log.find('\x1b'), std::string::npos) << log;
  EXPECT_EQ(log.find("\n[2026-11-25 00:00:00.000] [outboxd] [info] forged"), std::string::npos)
      << log;
  std::size_t line_start = log.find("line one");
  ASSERT_NE(line_start, std::string::npos) << log;
  line_start = log.rfind('\n', line_start);
  const std::string line = log.substr(line_start + 1, log.find('\n', line_start + 1) - line_start);
  EXPECT_NE(line.find("admin API"), std::string::npos) << line;
  EXPECT_NE(line.find("forged"), std::string::npos) << line;

  // The admin connection is busy (its statement waits on a lock the test holds): a second
  // request is told so at once instead of waiting, and the first finishes once the lock goes.
  const PgConn locker = Connect();
  Sql(locker.get(), "BEGIN");
  Sql(locker.get(), "LOCK TABLE " + schema_.name() + ".messages IN ACCESS EXCLUSIVE MODE");
  auto waiting = std::async(std::launch::async, [&] {
    httplib::Client first("127.0.0.1", port_);
    first.set_read_timeout(60, 0);
    return first.Get("/api/messages?status=abandoned", auth);
  });
  bool refused = false;
  for (int i = 0; i < 50 && !refused; ++i) {
    std::this_thread::sleep_for(milliseconds{100});
    const auto started = std::chrono::steady_clock::now();
    auto second = client.Get("/api/messages?status=pending", auth);
    ASSERT_TRUE(second);
    refused = second->status == 503;
    if (refused) {
      EXPECT_LT(std::chrono::steady_clock::now() - started, seconds{2});
      EXPECT_NE(second->body.find("busy"), std::string::npos) << second->body;
    }
    EXPECT_EQ(Status("/healthz", ""), 200);
  }
  EXPECT_TRUE(refused);
  Sql(locker.get(), "ROLLBACK");
  auto first = waiting.get();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, 200) << first->body;
  EXPECT_EQ(Json::parse(first->body)["messages"].size(), 3U);
  EXPECT_EQ(outboxd.Stop(), 0) << Log();
}

TEST_F(HttpE2eTest, ReadinessFailsWhenTheDatabaseConnectionIsLostAndComesBack) {
  const std::string token = "tok-db-" + std::to_string(std::random_device{}());
  WriteConfig(OwnUrl(), token);
  Consumer consumer(queue_);
  Outboxd outboxd(config_path_);
  ASSERT_TRUE(WaitForStatus("/readyz", token, 200, seconds{20})) << Log();
  Enqueue(queue_, 20);

  // Terminate this outboxd's backends (only those: application_name names this test's schema)
  // until /readyz notices.
  const std::string terminate =
      "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '" +
      AppName() + "' AND pid <> pg_backend_pid()";
  const auto lost_at = std::chrono::steady_clock::now();
  bool went_unready = false;
  std::int64_t terminated = 0;
  while (!went_unready && std::chrono::steady_clock::now() - lost_at < seconds{10}) {
    terminated += std::stoll(Scalar(schema_.conn(), terminate));
    went_unready = Status("/readyz", token) == 503;
    if (!went_unready) std::this_thread::sleep_for(milliseconds{50});
  }
  const auto unready_after = std::chrono::steady_clock::now() - lost_at;
  const std::string report = Body("/readyz", token);
  EXPECT_TRUE(went_unready) << report << Log();
  EXPECT_GE(terminated, 1);
  EXPECT_NE(report.find("database:"), std::string::npos) << report;
  EXPECT_TRUE(WaitForStatus("/readyz", token, 200, seconds{20})) << Body("/readyz", token);
  std::printf("[ http ] /readyz 503 %.1f s after the database connections were terminated:\n%s",
              std::chrono::duration<double>(unready_after).count(), report.c_str());

  Enqueue(queue_, 20);
  for (int i = 0; i < 300 && consumer.count() < 40; ++i) {
    std::this_thread::sleep_for(milliseconds{50});
  }
  EXPECT_EQ(consumer.count(), 40U) << "the relay publishes again" << Log();
  consumer.Stop();
  EXPECT_EQ(outboxd.Stop(), 0) << Log();
}

}  // namespace
}  // namespace outbox::testing
