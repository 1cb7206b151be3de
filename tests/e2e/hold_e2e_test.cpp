// on_abandon = "hold" end to end (issue #43): the real outboxd and outboxctl, real PostgreSQL and
// RabbitMQ, an independent consumer. A poison message abandoned under the policy holds its stream:
// the stream's later messages are not published (0 attempts) while 5,000 other streams flow; the
// operator's skip, or a replay once the fault is fixed, lets the stream go on, in order.

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "support/amqp_test_client.h"
#include "support/child_process.h"
#include "support/free_port.h"
#include "support/pg_test_support.h"
#include "support/wait.h"

namespace outbox::testing {
namespace {

using std::chrono::seconds;

constexpr int kOtherStreams = 5000;

// The command's standard output (its exit code in `code`).
std::string RunCommand(const std::string& command, int* code = nullptr) {
  std::string out;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return out;
  std::array<char, 4096> buffer{};
  while (fgets(buffer.data(), buffer.size(), pipe) != nullptr) out += buffer.data();
  const int status = pclose(pipe);
  if (code != nullptr) *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

class HoldE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    queue_ = "hold_" + schema_.name();
    poison_queue_ = queue_ + "_full";
    DeclareQueue(queue_);
    // A queue that refuses everything: the broker nacks each publish to it (a rejection).
    DeclareQueue(poison_queue_, {{"x-overflow", "reject-publish"}}, {{"x-max-length", 0}});
    config_path_ = "/tmp/outboxd-" + schema_.name() + ".toml";
    std::ofstream out(config_path_);
    out << "[database]\nurl = \"" << PgUrl() << "\"\nschema = \"" << schema_.name() << "\"\n"
        << "[relay]\ninstance = \"hold\"\nbatch_size = 500\nsweep_interval = \"200ms\"\n"
        << "[retry]\ninitial_delay = \"100ms\"\nmax_delay = \"200ms\"\nmax_attempts = 2\n"
        << "[sinks.default]\ntype = \"rabbitmq\"\nurl = \"" << AmqpUrl() << "\"\n"
        << "routing_key = \"{topic}\"\non_abandon = \"hold\"\n"
        << "[http]\nlisten = \"127.0.0.1:" << port_ << "\"\ntoken = \"hold-token\"\n"
        << "stats_interval = \"200ms\"\n";
  }
  void TearDown() override {
    DeleteQueue(queue_);
    DeleteQueue(poison_queue_);
    std::remove(config_path_.c_str());
    std::remove((config_path_ + ".log").c_str());
  }

  std::string Enqueue(const std::string& topic, const std::string& stream) {
    return Scalar(schema_.conn(), "SELECT " + schema_.name() + ".enqueue('" + topic +
                                      "', '{}', stream_key => '" + stream + "')");
  }
  std::string Query(const std::string& sql) { return Scalar(schema_.conn(), sql); }
  std::string Messages() { return schema_.name() + ".messages"; }
  std::string Ctl(const std::string& arguments, int* code = nullptr) {
    return RunCommand(std::string{OUTBOXCTL_PATH} + " --db '" + PgUrl() + "' --schema " +
                          schema_.name() + " " + arguments,
                      code);
  }
  // curl's answer to an admin API request: "<status> <body>".
  std::string Api(const std::string& method, const std::string& path,
                  const std::string& body = "") {
    return RunCommand("curl -s -o - -w '%{http_code}' -X " + method +
                      " -H 'Authorization: Bearer hold-token' " +
                      (body.empty() ? "" : "-d '" + body + "' ") +
                      "http://127.0.0.1:" + std::to_string(port_) + path);
  }
  std::string Log() {
    std::ifstream in(config_path_ + ".log");
    return {std::istreambuf_iterator<char>(in), {}};
  }

  // Starts outboxd on the poison message alone and waits until it is abandoned, holding stream
  // "p"; then writes the stream's next three messages and one message on each of kOtherStreams
  // streams, and waits until the other streams' messages are delivered. Returns the three.
  std::vector<std::string> HoldThenFlow(Outboxd& relay, Consumer& consumer) {
    EXPECT_TRUE(WaitUntil(
        [&] {
          return Query("SELECT count(*) FROM " + Messages() + " WHERE id = '" + poison_ +
                       "' AND status = 'abandoned' AND holds_stream") == "1";
        },
        seconds{20}))
        << Log();
    std::vector<std::string> behind;
    for (int i = 0; i < 3; ++i) behind.push_back(Enqueue(queue_, "p"));
    Sql(schema_.conn(), "SELECT " + schema_.name() + ".enqueue('" + queue_ +
                            "', '{}', stream_key => 's' || g) FROM generate_series(1, " +
                            std::to_string(kOtherStreams) + ") g");
    EXPECT_TRUE(WaitUntil([&] { return consumer.count() >= kOtherStreams; }, seconds{30}))
        << consumer.count() << " delivered\n"
        << Log();
    // The held stream's messages: not published, not even tried.
    EXPECT_EQ(Query("SELECT count(*) FROM " + Messages() +
                    " WHERE stream_key = 'p' AND status = "
                    "'pending' AND attempts = 0 AND lease_epoch = 0"),
              "3");
    for (const auto& delivery : consumer.deliveries()) {
      EXPECT_NE(delivery.stream_key, "p") << "a held stream's message was published";
    }
    EXPECT_NE(Ctl("list --held").find(poison_), std::string::npos) << Ctl("list --held");
    EXPECT_NE(Ctl("status").find("streams held  1 "), std::string::npos);
    (void)relay;
    return behind;
  }

  // The deliveries of stream "p", in arrival order.
  static std::vector<Delivery> StreamP(const Consumer& consumer) {
    std::vector<Delivery> stream;
    for (auto& delivery : consumer.deliveries()) {
      if (delivery.stream_key == "p") stream.push_back(std::move(delivery));
    }
    return stream;
  }

  TestSchema schema_;
  int port_ = FreePort();
  std::string queue_;
  std::string poison_queue_;
  std::string config_path_;
  std::string poison_;
};

TEST_F(HoldE2eTest, AHeldStreamWaitsWhileOthersFlowAndSkipReleasesItInOrder) {
  Consumer consumer(queue_);
  poison_ = Enqueue(poison_queue_, "p");
  Outboxd relay(config_path_);
  const auto behind = HoldThenFlow(relay, consumer);

  // The admin API: the held list, the gauge, a dry run, and a request it refuses.
  EXPECT_NE(Api("GET", "/api/messages?held=true").find(R"("holds_stream":true)"),
            std::string::npos);
  EXPECT_TRUE(WaitUntil(
      [&] { return Api("GET", "/metrics").find("\noutbox_streams_held 1\n") != std::string::npos; },
      seconds{5}));
  EXPECT_EQ(
      Api("POST", "/api/messages/skip", R"({"ids": [")" + poison_ + R"("], "dry_run": true})"),
      R"({"dry_run":true,"count":1,"ids":[")" + poison_ +
          R"("],"ids_truncated":false})"
          "\n200");
  EXPECT_EQ(Api("POST", "/api/messages/skip", R"({"status": "pending"})"),
            R"({"error":"skip: acts only on abandoned messages, not on pending ones"})"
            "\n400");
  EXPECT_NE(Api("POST", "/api/messages/skip", R"({"dry_run": true})")
                .find("skip: refusing to act on every message"),
            std::string::npos);
  EXPECT_EQ(Api("POST", "/api/messages/skip", R"({"held": true, "dry_run": true})"),
            R"({"dry_run":true,"count":1,"ids":[")" + poison_ +
                R"("],"ids_truncated":false})"
                "\n200")
      << "\"held\": true selects every held message";
  int code = -1;
  EXPECT_EQ(Ctl("skip --dry-run " + poison_, &code), "would skip 1 message: " + poison_ + "\n");
  EXPECT_EQ(code, 0);
  EXPECT_EQ(Ctl("skip " + poison_, &code), "skipped 1 message: " + poison_ + "\n");
  EXPECT_EQ(code, 0);
  ASSERT_TRUE(WaitUntil([&] { return StreamP(consumer).size() >= 3; }, seconds{10})) << Log();
  const auto stream = StreamP(consumer);
  ASSERT_EQ(stream.size(), 3U);
  for (std::size_t i = 0; i < stream.size(); ++i) {
    EXPECT_EQ(stream[i].message_id, behind[i]) << "out of order at " << i;
    EXPECT_EQ(stream[i].stream_seq, static_cast<std::int64_t>(i) + 2);
  }
  EXPECT_EQ(stream[0].headers.at("outbox-stream-prev-seq"), "0") << "seq 1 was abandoned";
  EXPECT_EQ(relay.Stop(SIGTERM, seconds{30}), 0) << Log();
  consumer.Stop();
  EXPECT_EQ(Query("SELECT status || ' ' || holds_stream FROM " + Messages() + " WHERE id = '" +
                  poison_ + "'"),
            "abandoned false");
}

TEST_F(HoldE2eTest, AReplayAfterTheFixPublishesTheHeldMessageFirstThenItsStream) {
  Consumer consumer(queue_);
  poison_ = Enqueue(poison_queue_, "p");
  Outboxd relay(config_path_);
  const auto behind = HoldThenFlow(relay, consumer);

  // The fix: the queue takes messages again.
  DeleteQueue(poison_queue_);
  DeclareQueue(poison_queue_);
  Consumer fixed(poison_queue_);
  int code = -1;
  EXPECT_EQ(Ctl("replay " + poison_, &code), "replayed 1 message: " + poison_ + "\n");
  EXPECT_EQ(code, 0);
  ASSERT_TRUE(
      WaitUntil([&] { return StreamP(consumer).size() >= 3 && fixed.count() >= 1; }, seconds{10}))
      << Log();
  ASSERT_EQ(fixed.deliveries().front().message_id, poison_);
  EXPECT_EQ(fixed.deliveries().front().stream_seq, 1);
  const auto stream = StreamP(consumer);
  ASSERT_EQ(stream.size(), 3U);
  for (std::size_t i = 0; i < stream.size(); ++i) EXPECT_EQ(stream[i].message_id, behind[i]);
  EXPECT_EQ(stream[0].headers.count("outbox-stream-prev-seq"), 0U) << "nothing was skipped";
  EXPECT_EQ(relay.Stop(SIGTERM, seconds{30}), 0) << Log();
  consumer.Stop();
  fixed.Stop();
  EXPECT_EQ(Query("SELECT count(*) FROM " + Messages()), "0") << "every message published";
}

}  // namespace
}  // namespace outbox::testing
