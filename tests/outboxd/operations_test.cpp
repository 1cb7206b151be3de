// outboxd's operations side without servers: the listener, its token, garbage requests and
// readiness with a database and a broker that are not there, as HTTP answers (the status
// service's own logic: tests/observe/status_test.cpp).

#include "operations.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "outbox/sink/rabbitmq_type.h"
#include "outbox/store/postgres_type.h"
#include "support/free_port.h"

namespace outbox::outboxd {
namespace {

using std::chrono::milliseconds;

using outbox::testing::FreePort;

// The address the readiness check probes for a RabbitMQ sink.
TEST(OperationsTest, AmqpEndpointReadsTheBrokerAddress) {
  using Address = std::optional<std::pair<std::string, int>>;
  const auto AmqpEndpoint = [](std::string_view url) -> Address {
    const auto endpoint = rabbitmq::AmqpEndpoint(url);
    if (!endpoint) return std::nullopt;
    return std::pair{endpoint->host, endpoint->port};
  };
  EXPECT_EQ(AmqpEndpoint("amqp://guest:guest@127.0.0.1:5672/"), Address({"127.0.0.1", 5672}));
  EXPECT_EQ(AmqpEndpoint("amqp://u:p@ss@mq/vh"), Address({"mq", 5672}));
  EXPECT_EQ(AmqpEndpoint("amqp://[::1]:5673"), Address({"::1", 5673}));
  EXPECT_EQ(AmqpEndpoint("amqp://"), Address({"localhost", 5672}));
  EXPECT_EQ(AmqpEndpoint("amqp://mq:99999/"), std::nullopt);
  EXPECT_EQ(AmqpEndpoint("nats://mq"), std::nullopt);
}

TEST(OperationsTest, BearerTokenMatchesExactlyTheToken) {
  EXPECT_TRUE(BearerTokenMatches("", ""));
  EXPECT_TRUE(BearerTokenMatches("Bearer s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer s3cret2", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("bearer s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("", "s3cret"));
}

class OperationsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = FreePort();
    config_.database = std::make_shared<const postgres::StoreSettings>(
        "postgresql://outbox:pw-canary-db@127.0.0.1:1/none", "outbox");
    config_.relay.instance = "unit";
    config_.http.listen = "127.0.0.1:" + std::to_string(port_);
    config_.http.token = "tok-canary-1";
    config_.http.stats_interval = milliseconds{100};
    config_.http.ready_max_age = milliseconds{1000};
    config_.sinks.push_back(
        {.name = "default",
         .type = "rabbitmq",
         .settings = std::make_shared<const rabbitmq::SinkSettings>(rabbitmq::SinkOptions{
             .url = "amqp://u:pw-canary-mq@127.0.0.1:" + std::to_string(FreePort()) + "/"})});
    operations_ =
        std::make_unique<Operations>(config_, registry_, Operations::TotalsOf(counters_), LogFn{});
    operations_->Start();
  }

  httplib::Result Get(const std::string& path, const std::string& token = "tok-canary-1") {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(5, 0);
    httplib::Headers headers;
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
    return client.Get(path.c_str(), headers);
  }

  Config config_;
  observe::Registry registry_;
  RelayCounters counters_;
  int port_ = 0;
  std::unique_ptr<Operations> operations_;
};

TEST_F(OperationsServerTest, EndpointsAnswerAndTheTokenGuardsAllButHealthz) {
  auto healthz = Get("/healthz", "");
  ASSERT_TRUE(healthz);
  EXPECT_EQ(healthz->status, 200);
  EXPECT_EQ(healthz->body, "ok\n");
  for (const std::string path : {"/metrics", "/api/outbox", "/readyz", "/nope"}) {
    for (const std::string token : {"", "tok-canary-", "tok-canary-12", "wrong"}) {
      auto response = Get(path, token);
      ASSERT_TRUE(response) << path;
      EXPECT_EQ(response->status, 401) << path << " with '" << token << "'";
      EXPECT_EQ(response->get_header_value("WWW-Authenticate"), "Bearer");
      EXPECT_EQ(response->body.find("tok-canary"), std::string::npos);
    }
  }
  auto metrics = Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(metrics->body.find("# TYPE outbox_messages gauge\n"), std::string::npos);
  EXPECT_NE(metrics->body.find("outbox_info{version=\""), std::string::npos);
  auto json = Get("/api/outbox");
  ASSERT_TRUE(json);
  EXPECT_EQ(json->status, 200);
  EXPECT_EQ(json->body.substr(0, 12), "{\"metrics\":{");
  EXPECT_EQ(Get("/nope")->status, 404);
  // Secrets appear nowhere.
  for (const std::string& body : {metrics->body, json->body, Get("/readyz")->body}) {
    EXPECT_EQ(body.find("pw-canary"), std::string::npos) << body;
    EXPECT_EQ(body.find("tok-canary"), std::string::npos) << body;
  }
}

TEST_F(OperationsServerTest, NotReadyWithoutDatabaseAndBroker) {
  std::this_thread::sleep_for(milliseconds{300});
  auto readyz = Get("/readyz");
  ASSERT_TRUE(readyz);
  EXPECT_EQ(readyz->status, 503);
  EXPECT_NE(readyz->body.find("database: "), std::string::npos) << readyz->body;
  EXPECT_NE(readyz->body.find("sink default: broker"), std::string::npos) << readyz->body;
  EXPECT_NE(Get("/metrics")->body.find("\noutbox_ready 0\n"), std::string::npos);
  EXPECT_NE(Get("/api/outbox")->body.find("\"kind\":\"database\""), std::string::npos);
}

// A broker never reached is reported once, not at every interval: the status service's
// (tests/observe/status_test.cpp, through the registry /api/outbox renders).

TEST_F(OperationsServerTest, TheDashboardIsServedWithoutATokenAndItsDataIsNot) {
  for (const std::string path : {"/ui", "/ui/", "/ui/app.js", "/ui/style.css"}) {
    auto response = Get(path, "");
    ASSERT_TRUE(response) << path;
    EXPECT_EQ(response->status, 200) << path;
    EXPECT_NE(response->get_header_value("Content-Security-Policy").find("default-src 'self'"),
              std::string::npos)
        << path;
    EXPECT_EQ(response->get_header_value("X-Content-Type-Options"), "nosniff");
    const std::string etag = response->get_header_value("ETag");
    EXPECT_FALSE(etag.empty()) << path;
    httplib::Client client("127.0.0.1", port_);
    auto again = client.Get(path.c_str(), httplib::Headers{{"If-None-Match", etag}});
    ASSERT_TRUE(again);
    EXPECT_EQ(again->status, 304) << path;
  }
  EXPECT_NE(Get("/ui", "")->get_header_value("Content-Type").find("text/html"), std::string::npos);
  EXPECT_NE(Get("/ui/app.js", "")->get_header_value("Content-Type").find("javascript"),
            std::string::npos);
  EXPECT_EQ(Get("/ui/nope.js", "")->status, 404);
  EXPECT_EQ(Get("/ui/../metrics", "")->status, 404);
  for (const std::string path : {"/api/outbox/rates", "/api/outbox/relay"}) {
    EXPECT_EQ(Get(path, "")->status, 401) << path;
    auto response = Get(path);
    ASSERT_TRUE(response);
    EXPECT_EQ(response->status, 200) << path;
  }
  EXPECT_NE(Get("/api/outbox/relay")->body.find("\"instance\":\"unit\""), std::string::npos);
  EXPECT_NE(Get("/api/outbox/rates")->body.find("\"published\":["), std::string::npos);
}

TEST_F(OperationsServerTest, GarbageGetsA4xxAndTheServerKeepsServing) {
  const auto raw = [&](const std::string& bytes) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<std::uint16_t>(port_));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    std::string reply;
    std::array<char, 4096> buffer{};
    timeval timeout{.tv_sec = 5, .tv_usec = 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    for (ssize_t got = 0; (got = ::recv(fd, buffer.data(), buffer.size(), 0)) > 0;) {
      reply.append(buffer.data(), static_cast<std::size_t>(got));
    }
    ::close(fd);
    return reply;
  };
  std::mt19937 random(7);
  std::string noise(4096, '\0');
  for (char& c : noise) c = static_cast<char>(random());
  EXPECT_EQ(raw(noise).substr(0, 12), "HTTP/1.1 400");
  EXPECT_EQ(raw("GET /metrics HTTP/1.1\r\nX-Big: " + std::string(100 * 1024, 'a') + "\r\n\r\n")
                .substr(0, 10),
            "HTTP/1.1 4");
  EXPECT_EQ(raw("GET /" + std::string(20000, 'p') + " HTTP/1.1\r\n\r\n").substr(0, 10),
            "HTTP/1.1 4");
  EXPECT_EQ(raw("POST /metrics HTTP/1.1\r\nAuthorization: Bearer tok-canary-1\r\n"
                "Content-Length: 100000\r\n\r\n" +
                std::string(100000, 'x'))
                .substr(0, 10),
            "HTTP/1.1 4");
  EXPECT_EQ(raw("GET /../../etc/passwd HTTP/1.1\r\nAuthorization: Bearer tok-canary-1\r\n\r\n")
                .substr(0, 12),
            "HTTP/1.1 404");
  auto healthz = Get("/healthz", "");
  ASSERT_TRUE(healthz);
  EXPECT_EQ(healthz->status, 200);
}

// Slowloris: 100 connections that trickle a request header, one line now and then, never
// finishing it. /healthz, /readyz and /metrics must still answer, each within a second.
TEST_F(OperationsServerTest, SlowClientsDoNotStarveTheProbes) {
  std::vector<int> slow;
  const auto connect_one = [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<std::uint16_t>(port_));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    constexpr std::string_view kStart = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
    (void)::send(fd, kStart.data(), kStart.size(), MSG_NOSIGNAL);
    return fd;
  };
  for (int i = 0; i < 100; ++i) slow.push_back(connect_one());
  // For 3 s: every 300 ms each slow client sends one more header line (and one that the server
  // has cut off is replaced), while a probe is timed in between.
  for (int round = 0; round < 10; ++round) {
    for (int& fd : slow) {
      constexpr std::string_view kLine = "X-Slow: 1\r\n";
      if (::send(fd, kLine.data(), kLine.size(), MSG_NOSIGNAL) <= 0) {
        ::close(fd);
        fd = connect_one();
      }
    }
    for (const std::string path : {"/healthz", "/readyz", "/metrics"}) {
      const auto started = std::chrono::steady_clock::now();
      httplib::Client client("127.0.0.1", port_);
      client.set_connection_timeout(1, 0);
      client.set_read_timeout(1, 0);
      auto response = client.Get(path.c_str(), {{"Authorization", "Bearer tok-canary-1"}});
      const auto took = std::chrono::steady_clock::now() - started;
      ASSERT_TRUE(response) << path << " in round " << round << ": "
                            << httplib::to_string(response.error());
      EXPECT_NE(response->status, 0);
      EXPECT_LT(took, milliseconds{1000}) << path;
    }
    std::this_thread::sleep_for(milliseconds{300});
  }
  for (const int fd : slow) ::close(fd);
}

// Bad values of every parameter and field of the admin API get 400 with our own words, before
// the database is asked (it is not there: anything that reached it would get 503). PostgreSQL
// answered a topic of invalid UTF-8 ("%ff") with SQLSTATE 22021, relayed as 500.
TEST_F(OperationsServerTest, BadParameterValuesAnswer400InOurOwnWords) {
  const std::string long_text(300, 'a');
  const std::string long_key(1000, 'k');
  const std::vector<std::pair<std::string, std::string>> gets{
      {"/api/messages?topic=%ff", "topic is not valid UTF-8"},
      {"/api/messages?topic=a%c3%28", "topic is not valid UTF-8"},
      {"/api/messages?topic=%ed%a0%80", "topic is not valid UTF-8"},  // a surrogate
      {"/api/messages?stream=a%00b", "stream contains a control character (0x00)"},
      {"/api/messages?target=a%0Ab", "target contains a control character (0x0a)"},
      {"/api/messages?topic=", "topic must not be empty"},
      {"/api/messages?topic=" + long_text, "topic is 300 bytes, over the limit of 255"},
      {"/api/messages?status=%ff", "status is not valid UTF-8"},
      {"/api/messages?status=%00", "status contains a control character (0x00)"},
      {"/api/messages?event=%ff", "event is not valid UTF-8"},
      {"/api/messages?event=%00", "event contains a control character (0x00)"},
      {"/api/messages?event=" + long_text, "event is 300 bytes, over the limit of 255"},
      {"/api/messages?older_than=%ff", "older_than is not valid UTF-8"},
      {"/api/messages?older_than=99999999999999999999d", "is too large"},
      {"/api/messages?older_than=1e3s", "bad duration"},
      {"/api/messages?limit=%ff", "limit is not valid UTF-8"},
      {"/api/messages?limit=1e3", "limit must be a number from 1 to 10000"},
      {"/api/messages?limit=-1", "limit must be a number from 1 to 10000"},
      {"/api/messages?limit=%2B5", "limit must be a number from 1 to 10000"},
      {"/api/messages?limit=5%00", "limit contains a control character (0x00)"},
      {"/api/messages?limit=99999999999999999999", "limit must be a number from 1 to 10000"},
      {"/api/messages?limit=10001", "limit must be a number from 1 to 10000"},
      {"/api/messages?after=%ff", "after is not valid UTF-8"},
      {"/api/messages?held=1", "held must be true or false, got '1'"},
      {"/api/messages?after=0190f5c2", "is not a message id"},
      {"/api/messages?%ff=1", "unknown parameter '\\xff'"},
      {"/api/messages?a%00b=1", "unknown parameter 'a\\x00b'"},
      {"/api/messages?" + long_key + "=1", "unknown parameter 'kkkk"},
      {"/api/messages?topic=a&topic=b", "parameter 'topic' is given more than once"},
      {"/api/messages/%ff", "the message id is not valid UTF-8"},
      {"/api/messages/" + long_text, "the message id is 300 bytes, over the limit of 255"},
      {"/api/messages/a%00b", "the message id contains a control character (0x00)"},
  };
  const auto expect_ours = [](const httplib::Result& reply, const std::string& request,
                              const std::string& words) {
    ASSERT_TRUE(reply) << request;
    EXPECT_EQ(reply->status, 400) << request << ": " << reply->body;
    EXPECT_EQ(reply->get_header_value("Content-Type"), "application/json") << request;
    EXPECT_NE(reply->body.find("{\"error\":\""), std::string::npos)
        << request << ": " << reply->body;
    const auto json = nlohmann::json::parse(reply->body, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(json.is_object() && json["error"].is_string()) << request << ": " << reply->body;
    EXPECT_NE(json["error"].get<std::string>().find(words), std::string::npos)
        << request << ": " << reply->body;
    // Our words, short: no database text, a long value quoted only in part.
    EXPECT_EQ(reply->body.find("SQLSTATE"), std::string::npos) << reply->body;
    EXPECT_EQ(reply->body.find("invalid byte sequence"), std::string::npos) << reply->body;
    EXPECT_LT(reply->body.size(), 400U) << request << ": " << reply->body;
  };
  for (const auto& [path, words] : gets) expect_ours(Get(path), path, words);

  httplib::Client client("127.0.0.1", port_);
  client.set_read_timeout(5, 0);
  const httplib::Headers auth{{"Authorization", "Bearer tok-canary-1"}};
  const std::vector<std::tuple<std::string, std::string, std::string>> posts{
      {"replay", R"({"topic": "a\u0000b"})", "topic contains a control character (0x00)"},
      {"replay", R"({"stream": ""})", "stream must not be empty"},
      {"replay", R"({"target": ")" + long_text + R"("})", "target is 300 bytes"},
      {"replay", R"({"ids": [")" + long_text + R"("]})", "an id is 300 bytes"},
      {"replay", R"({"ids": ["a\u0000"]})", "an id contains a control character (0x00)"},
      {"replay", R"({"status": "failed", ")" + long_key + R"(": 1})", "field 'kkkk"},
      {"replay", R"({"older_than": -5})", "field 'older_than' must be a string"},
      {"replay", R"({"older_than": 99999999999999})", "is too large"},
      {"skip", R"({"held": "yes"})", "held must be true or false"},
      {"skip", R"({"topic": "t", "dry_run": 1})", "dry_run must be true or false"},
      {"skip", R"({"id": "x"})",
       "unknown field 'id' (known: ids, status, topic, stream, target, event, older_than, held, "
       "dry_run, reason)"},
      {"abandon", R"({"status": "failed", "reason": "a\u0000b"})", "reason contains a NUL byte"},
      {"abandon", R"({"status": "failed", "reason": ")" + std::string(5000, 'r') + R"("})",
       "reason is 5000 bytes, over the limit of 4096"},
  };
  for (const auto& [verb, body, words] : posts) {
    expect_ours(client.Post("/api/messages/" + verb, auth, body, "application/json"), body, words);
  }
  // Invalid UTF-8 in a JSON body is not JSON.
  expect_ours(
      client.Post("/api/messages/replay", auth, "{\"topic\": \"\xff\"}", "application/json"),
      "\\xff", "the body is not valid JSON");
  // A good request gets as far as the database (which is not there).
  EXPECT_EQ(Get("/api/messages?topic=caf%C3%A9&limit=5")->status, 503);
}

// A port in use is named as such ("Address already in use"); it read "… Success (in use …)".
TEST_F(OperationsServerTest, ABusyPortIsNamedAsSuch) {
  Operations second(config_, registry_, Operations::TotalsOf(counters_), LogFn{});
  try {
    second.Start();
    ADD_FAILURE() << "a second listener on " << config_.http.listen;
  } catch (const std::runtime_error& error) {
    const std::string message = error.what();
    EXPECT_EQ(message, "[http] listen: cannot listen on " + config_.http.listen +
                           ": Address already in use (bind)");
  }
  EXPECT_EQ(Get("/healthz", "")->status, 200);  // the first one still serves
}

// The admin lock is not waited for: a second request while one runs gets 503 at once (tested
// with the database in tests/e2e); without a database every admin request fails fast.
TEST_F(OperationsServerTest, AdminRequestsWithoutADatabaseFailFast) {
  const auto started = std::chrono::steady_clock::now();
  auto response = Get("/api/messages?status=failed");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 503) << response->body;
  EXPECT_EQ(response->body.find("pw-canary"), std::string::npos) << response->body;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds{5});
}

// The relay's paused targets and the WAL check, handed to Operations, reach its readiness (the
// status service's rules for them: tests/observe/status_test.cpp).
TEST(OperationsTest, TheRelaysPausedTargetsAndTheWalCheckReachReadiness) {
  Config config;
  config.database = std::make_shared<const postgres::StoreSettings>("postgresql://127.0.0.1:1/none",
                                                                    "outbox", /*wal=*/true);
  observe::Registry registry;
  RelayCounters counters;
  Operations operations(config, registry, Operations::TotalsOf(counters), LogFn{}, [] {
    return std::vector<Relay::PausedTarget>{{"other", "HTTP 401"}};
  });
  operations.SetWalCheck([] { return std::optional<std::string>{"no relay reads it"}; });
  EXPECT_EQ(operations.CheckReadiness().report.find("paused"), std::string::npos);
  counters.broker_unavailable = true;
  const Operations::Readiness readiness = operations.CheckReadiness();
  EXPECT_FALSE(readiness.ready);
  EXPECT_NE(
      readiness.report.find("target other: paused, its last batch found no broker (HTTP 401)"),
      std::string::npos)
      << readiness.report;
  EXPECT_NE(readiness.report.find("WAL slot: no relay reads it"), std::string::npos)
      << readiness.report;
}

// Many databases: /readyz names the ones not relayed without failing for one, the admin routes
// need ?database=NAME of a database served, /api/outbox/relay lists them.
TEST(OperationsTest, ManyDatabasesAreNamedInReadinessTheRelayAndTheAdminApi) {
  Config config;
  config.database = nullptr;
  config.databases.push_back({.name = "t1",
                              .type = "postgres",
                              .settings = std::make_shared<const postgres::StoreSettings>(
                                  "postgresql://127.0.0.1:1/t1", "outbox"),
                              .fingerprint = "t1"});
  config.http.token = "tok-many-databases";
  observe::Registry registry;
  RelayCounters counters;
  Operations operations(config, registry, Operations::TotalsOf(counters), LogFn{});
  std::vector<TenantRelays::DatabaseState> states{
      {.name = "t1", .relaying = true, .problem = "", .published = 5, .failed = 0},
      {.name = "t2",
       .relaying = false,
       .problem = "cannot connect to postgresql://u:secret@db/t2",
       .published = 0,
       .failed = 0}};
  operations.SetManyDatabases(
      {.states = [&] { return states; },
       .find = [&](const std::string& name) -> std::shared_ptr<const StoreSettings> {
         return name == "t1" ? config.databases[0].settings : nullptr;
       },
       .discovery_problem = [] { return std::optional<std::string>{"the catalog is down"}; }});
  Operations::Readiness readiness = operations.CheckReadiness();
  EXPECT_TRUE(readiness.ready) << readiness.report;
  EXPECT_NE(readiness.report.find("databases: 1 of 2 relayed"), std::string::npos);
  EXPECT_NE(readiness.report.find("database t2: not relayed: cannot connect"), std::string::npos);
  EXPECT_EQ(readiness.report.find("secret"), std::string::npos) << readiness.report;
  EXPECT_NE(readiness.report.find("discovery: the catalog is down"), std::string::npos);
  states[0].relaying = false;
  EXPECT_FALSE(operations.CheckReadiness().ready);  // none relayed

  const auto answer = [&](const std::string& target) {
    return operations.AnswerRaw("GET " + target +
                                " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                                "tok-many-databases\r\n\r\n");
  };
  const auto relay = answer("/api/outbox/relay");
  ASSERT_TRUE(relay);
  const auto json = nlohmann::json::parse(relay->body);
  ASSERT_EQ(json.at("databases").size(), 2U) << relay->body;
  EXPECT_EQ(json.at("databases")[0].at("name"), "t1");
  EXPECT_EQ(json.at("databases")[0].at("published"), 5);
  EXPECT_EQ(json.at("databases")[1].at("relaying"), false);
  // The counts are not read per database: no series pretends they are 0 (an alert on
  // outbox_messages{status="abandoned"} would never fire).
  const std::string metrics = answer("/metrics")->body;
  for (const char* unread : {"outbox_messages{", "outbox_oldest_pending_age_seconds",
                             "outbox_streams_held", "outbox_relays_live"}) {
    EXPECT_EQ(metrics.find(unread), std::string::npos) << unread << " in\n" << metrics;
  }
  EXPECT_NE(metrics.find("outbox_ready"), std::string::npos);
  EXPECT_EQ(answer("/api/messages")->status, 400);
  EXPECT_NE(answer("/api/messages")->body.find("?database=NAME"), std::string::npos);
  EXPECT_EQ(answer("/api/messages?database=t9")->status, 404);
  EXPECT_EQ(answer("/api/messages?database=t1&database=t1")->status, 400);
  // A database served: the request reaches its store (here: unreachable, 503).
  EXPECT_EQ(answer("/api/messages?database=t1")->status, 503);
  EXPECT_EQ(answer("/api/outbox/relays?database=t1")->status, 503);
}

// The warnings an Operations logs while it starts and stops.
std::vector<std::string> StartWarnings(const Config& config) {
  observe::Registry registry;
  RelayCounters counters;
  std::mutex mutex;
  std::vector<std::string> warnings;
  {
    Operations operations(config, registry, Operations::TotalsOf(counters),
                          [&](LogLevel level, std::string_view text) {
                            const std::lock_guard lock(mutex);
                            if (level == LogLevel::kWarn) warnings.emplace_back(text);
                          });
    operations.Start();
    operations.Stop();
  }
  return warnings;
}

// Listening on every interface without a token (allowed explicitly) is warned about at every
// start; with a token, or on loopback, it is not. Tests never listen beyond loopback, so the
// warning itself is checked apart from Start, and Start on loopback logs no such warning.
TEST(OperationsTest, ListeningBeyondLoopbackWithoutATokenWarnsAtStart) {
  HttpConfig http;
  for (const char* exposed : {"0.0.0.0:9780", "[::]:9780", "10.1.2.3:80"}) {
    http.listen = exposed;
    http.allow_unauthenticated = true;
    const auto warning = ExposureWarning(http);
    ASSERT_TRUE(warning.has_value()) << exposed;
    EXPECT_NE(warning->find("beyond loopback, without a token"), std::string::npos) << *warning;
    EXPECT_NE(warning->find(exposed), std::string::npos) << *warning;
    http.token = "secret";
    EXPECT_FALSE(ExposureWarning(http).has_value()) << exposed;
    http.token.clear();
  }
  for (const char* local : {"127.0.0.1:9780", "[::1]:9780", "localhost:9780", ""}) {
    http.listen = local;
    EXPECT_FALSE(ExposureWarning(http).has_value()) << local;
  }

  Config config;
  config.database =
      std::make_shared<const postgres::StoreSettings>("postgresql://127.0.0.1:1/none", "outbox");
  config.http.listen = "127.0.0.1:" + std::to_string(FreePort());
  config.http.allow_unauthenticated = true;
  for (const std::string& warning : StartWarnings(config)) {
    EXPECT_EQ(warning.find("beyond loopback"), std::string::npos) << warning;
  }
}

TEST(OperationsTest, AnAddressInUseIsAnError) {
  const int port = FreePort();
  Config config;
  config.database =
      std::make_shared<const postgres::StoreSettings>("postgresql://127.0.0.1:1/none", "outbox");
  config.http.listen = "127.0.0.1:" + std::to_string(port);
  observe::Registry registry;
  RelayCounters counters;
  Operations first(config, registry, Operations::TotalsOf(counters), LogFn{});
  first.Start();
  observe::Registry other;
  Operations second(config, other, Operations::TotalsOf(counters), LogFn{});
  EXPECT_THROW(second.Start(), std::runtime_error);
}

}  // namespace
}  // namespace outbox::outboxd
