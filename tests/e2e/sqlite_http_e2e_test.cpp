// outboxd on the embedded store, end to end: the real binary with [database] type = "sqlite" and a
// file sink serves /metrics (counts and the backlog by topic from the SQLite file) and the admin
// API (list, replay, bad input) over HTTP. No server needed.

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "outbox/store/admin.h"
#include "outbox/store/sqlite.h"
#include "support/child_process.h"
#include "support/free_port.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
namespace fs = std::filesystem;

constexpr const char* kToken = "sqlite-e2e-token";

// The value of the sample `series` (e.g. outbox_messages{status="pending"}); -1 when absent.
double Sample(const std::string& metrics, const std::string& series) {
  const std::size_t at = metrics.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(metrics.substr(at + series.size() + 2));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class SqliteHttpE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("outboxd-sqlite-http-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    db_ = (dir_ / "app.db").string();
    events_ = (dir_ / "events.jsonl").string();
    config_ = (dir_ / "outboxd.toml").string();
    port_ = FreePort();
    std::ofstream(config_) << "[database]\ntype = \"sqlite\"\npath = \"" << db_ << "\"\n"
                           << "[relay]\ninstance = \"sqlite-http-e2e\"\nsweep_interval = \"50ms\"\n"
                           << "[http]\nlisten = \"127.0.0.1:" << port_ << "\"\ntoken = \"" << kToken
                           << "\"\nstats_interval = \"100ms\"\n"
                           << "[sinks.default]\ntype = \"file\"\npath = \"" << events_ << "\"\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  httplib::Result Get(const std::string& path, const std::string& token = kToken) {
    httplib::Client client("127.0.0.1", port_);
    client.set_connection_timeout(2, 0);
    client.set_read_timeout(10, 0);
    httplib::Headers headers;
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
    return client.Get(path.c_str(), headers);
  }
  httplib::Result Post(const std::string& path, const std::string& body) {
    httplib::Client client("127.0.0.1", port_);
    client.set_connection_timeout(2, 0);
    client.set_read_timeout(10, 0);
    return client.Post(path.c_str(), {{"Authorization", std::string{"Bearer "} + kToken}}, body,
                       "application/json");
  }
  std::string Metrics() {
    auto result = Get("/metrics");
    return result && result->status == 200 ? result->body : std::string{};
  }
  // Waits (bounded) until `done` holds; false on time-out.
  template <typename Done>
  static bool WaitFor(Done&& done, seconds limit = seconds{20}) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (done()) return true;
      std::this_thread::sleep_for(milliseconds{50});
    }
    return false;
  }

  fs::path dir_;
  std::string db_;
  std::string events_;
  std::string config_;
  int port_ = 0;
};

TEST_F(SqliteHttpE2eTest, MetricsAndTheAdminApiWorkOnTheEmbeddedStore) {
  // Before outboxd starts: 5 orders, of which the operator has abandoned one (as a relay would
  // after a rejection), so that the relay publishes 4 and the admin API has one to replay.
  sqlite::Migrate(db_);
  std::vector<MessageId> ids;
  {
    auto store = sqlite::OpenStore({.path = db_});
    std::vector<NewMessage> messages(5);
    for (std::size_t i = 0; i < messages.size(); ++i) {
      messages[i].topic = "orders";
      messages[i].stream_key = "order-" + std::to_string(i);
      messages[i].payload = R"({"order":)" + std::to_string(i) + "}";
    }
    ids = store->Enqueue(messages);
    MessageFilter parked;
    parked.ids = std::vector<MessageId>{ids[2]};
    ASSERT_EQ(sqlite::OpenAdmin(db_)->Abandon(parked, "parked by the test", false).count, 1);
  }
  ChildProcess outboxd({OUTBOXD_PATH, "--config", config_}, (dir_ / "outboxd.log").string(),
                       Ready::Notify());

  // /metrics reads the counts and the backlog by topic from the SQLite file.
  std::string metrics;
  const bool settled = WaitFor([&] {
    metrics = Metrics();
    return Sample(metrics, R"(outbox_messages{status="pending"})") == 0 &&
           Sample(metrics, R"(outbox_messages{status="abandoned"})") == 1;
  });
  ASSERT_TRUE(settled) << "metrics:\n"
                       << metrics << "\nlog:\n"
                       << ReadFile((dir_ / "outboxd.log").string());
  EXPECT_EQ(
      Sample(metrics,
             R"(outbox_messages_by_topic{status="abandoned",target="default",topic="orders"})"),
      1);
  EXPECT_EQ(Sample(metrics, "outbox_messages_by_topic_skipped"), 0);
  EXPECT_EQ(Sample(metrics, "outbox_published_total"), 4);
  auto ready = Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200) << ready->body;
  EXPECT_NE(ready->body.find("database: ok"), std::string::npos) << ready->body;

  // The admin API lists the abandoned message...
  auto listed = Get("/api/messages?status=abandoned");
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->status, 200) << listed->body;
  const auto page = nlohmann::json::parse(listed->body);
  ASSERT_EQ(page["messages"].size(), 1U) << listed->body;
  EXPECT_EQ(page["messages"][0]["id"], ids[2].ToString());
  EXPECT_EQ(page["messages"][0]["last_error"], "abandoned by operator: parked by the test");
  EXPECT_EQ(page["more"], false);

  // ...finds a message by its event id (a single-target message is its own event)...
  auto by_event = Get("/api/messages?event=" + ids[2].ToString());
  ASSERT_TRUE(by_event);
  ASSERT_EQ(by_event->status, 200) << by_event->body;
  const auto event_page = nlohmann::json::parse(by_event->body);
  ASSERT_EQ(event_page["messages"].size(), 1U) << by_event->body;
  EXPECT_EQ(event_page["messages"][0]["event_id"], ids[2].ToString());

  // ...refuses bad input and a missing token...
  auto bad = Get("/api/messages?status=done");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("unknown status 'done'"), std::string::npos) << bad->body;
  auto bad_event = Get("/api/messages?event=order-42");
  ASSERT_TRUE(bad_event);
  EXPECT_EQ(bad_event->status, 400);
  EXPECT_NE(bad_event->body.find("'order-42' is not a message id"), std::string::npos)
      << bad_event->body;
  auto bad_event_body =
      Post("/api/messages/abandon", R"({"event": "nope", "reason": "r", "dry_run": true})");
  ASSERT_TRUE(bad_event_body);
  EXPECT_EQ(bad_event_body->status, 400) << bad_event_body->body;
  auto everything = Post("/api/messages/replay", "{}");
  ASSERT_TRUE(everything);
  EXPECT_EQ(everything->status, 400);
  EXPECT_NE(everything->body.find("refusing to act on every message"), std::string::npos);
  auto anonymous = Get("/api/messages", "");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401);

  // ...and replays it: the relay publishes it with its original id.
  auto replayed = Post("/api/messages/replay", R"({"ids": [")" + ids[2].ToString() + R"("]})");
  ASSERT_TRUE(replayed);
  ASSERT_EQ(replayed->status, 200) << replayed->body;
  const auto change = nlohmann::json::parse(replayed->body);
  EXPECT_EQ(change["count"], 1);
  EXPECT_EQ(change["ids"][0], ids[2].ToString());
  EXPECT_TRUE(WaitFor([&] {
    return ReadFile(events_).find(ids[2].ToString()) != std::string::npos;
  })) << ReadFile(events_);
  EXPECT_TRUE(WaitFor([&] {
    metrics = Metrics();
    return Sample(metrics, R"(outbox_messages{status="abandoned"})") == 0 &&
           Sample(metrics, "outbox_published_total") == 5;
  })) << metrics;
  for (const auto& id : ids) {
    EXPECT_NE(ReadFile(events_).find(id.ToString()), std::string::npos) << id.ToString();
  }

  EXPECT_EQ(outboxd.Stop(SIGTERM, seconds{20}), 0);
}

// A bad value of a query parameter gets 400 in our own words on SQLite too (the same checks as on
// PostgreSQL, before the store is asked).
TEST_F(SqliteHttpE2eTest, BadQueryValuesAnswer400) {
  ChildProcess outboxd({OUTBOXD_PATH, "--config", config_}, (dir_ / "outboxd.log").string());
  ASSERT_TRUE(WaitFor([&] {
    auto ready = Get("/readyz");
    return ready && ready->status == 200;
  })) << ReadFile((dir_ / "outboxd.log").string());
  for (const auto& [query, words] : std::vector<std::pair<std::string, std::string>>{
           {"topic=%ff", "topic is not valid UTF-8"},
           {"stream=a%00b", "stream contains a control character (0x00)"},
           {"target=" + std::string(256, 't'), "target is 256 bytes, over the limit of 255"},
           {"limit=1e3", "limit must be a number from 1 to 10000"}}) {
    auto reply = Get("/api/messages?" + query);
    ASSERT_TRUE(reply) << query;
    EXPECT_EQ(reply->status, 400) << query << ": " << reply->body;
    EXPECT_EQ(nlohmann::json::parse(reply->body)["error"], words) << query;
  }
  auto good = Get("/api/messages?topic=caf%C3%A9");
  ASSERT_TRUE(good);
  EXPECT_EQ(good->status, 200) << good->body;
  outboxd.Signal(SIGTERM);
  EXPECT_EQ(outboxd.Wait(seconds{20}), 0);
}

// More sinks than a metric family's fixed limit of series (64): --check-config says valid, and
// outboxd starts, publishes to the last of them, answers /metrics with a series per target, and
// stops cleanly. It exited 1 with "metric outbox_relay_target_paused has too many series".
class ManySinksE2eTest : public SqliteHttpE2eTest, public ::testing::WithParamInterface<int> {};

TEST_P(ManySinksE2eTest, CheckConfigSaysValidAndOutboxdRunsWithThemAll) {
  const int sinks = GetParam();
  const auto name = [](int i) {
    std::array<char, 16> text{};
    std::snprintf(text.data(), text.size(), "s%03d", i);
    return std::string{text.data()};
  };
  const auto sink_file = [&](int i) { return (dir_ / (name(i) + ".jsonl")).string(); };
  {
    std::ofstream out(config_);
    out << "[database]\ntype = \"sqlite\"\npath = \"" << db_ << "\"\n"
        << "[relay]\ninstance = \"many-sinks-e2e\"\nsweep_interval = \"50ms\"\n"
        << "[http]\nlisten = \"127.0.0.1:" << port_ << "\"\ntoken = \"" << kToken
        << "\"\nstats_interval = \"100ms\"\n";
    for (int i = 0; i < sinks; ++i) {
      out << "[sinks." << name(i) << "]\ntype = \"file\"\npath = \"" << sink_file(i) << "\"\n";
    }
  }
  const std::string log = (dir_ / "outboxd.log").string();
  ChildProcess check({OUTBOXD_PATH, "--config", config_, "--check-config"}, log);
  ASSERT_EQ(check.Wait(seconds{30}), 0) << ReadFile(log);
  ASSERT_NE(ReadFile(log).find("is valid"), std::string::npos) << ReadFile(log);

  sqlite::Migrate(db_);
  const std::string last = name(sinks - 1);
  MessageId id;
  {
    NewMessage message;
    message.topic = "orders";
    message.payload = R"({"order":1})";
    message.targets = {last};
    const std::vector<NewMessage> messages{message};
    id = sqlite::OpenStore({.path = db_})->Enqueue(messages).front();
  }
  ChildProcess outboxd({OUTBOXD_PATH, "--config", config_}, log);
  EXPECT_TRUE(WaitFor([&] {
    return ReadFile(sink_file(sinks - 1)).find(id.ToString()) != std::string::npos;
  })) << ReadFile(log);
  std::string metrics;
  EXPECT_TRUE(WaitFor([&] {
    metrics = Metrics();
    return Sample(metrics, "outbox_published_total") == 1;
  })) << metrics
      << ReadFile(log);
  EXPECT_EQ(Sample(metrics, R"(outbox_relay_target_paused{target=")" + last + R"("})"), 0)
      << metrics;
  EXPECT_EQ(Sample(metrics, R"(outbox_relay_target_paused{target="s000"})"), 0) << metrics;
  auto ready = Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200) << ready->body;
  EXPECT_EQ(ReadFile(sink_file(0)), "");  // the message went to its own target only

  outboxd.Signal(SIGTERM);
  EXPECT_EQ(outboxd.Wait(seconds{20}), 0) << ReadFile(log);
}

INSTANTIATE_TEST_SUITE_P(Sinks, ManySinksE2eTest, ::testing::Values(65, 500));

}  // namespace
}  // namespace outbox::testing
