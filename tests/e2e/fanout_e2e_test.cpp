// One enqueue, two destinations, end to end (issue #24): outboxd with two RabbitMQ sinks, the
// service's own ("default", full envelope) and a partner's ("partner", envelope = "external"),
// whose broker is down for a while. Real PostgreSQL, real RabbitMQ, the real binary; the
// partner's broker is a port where nothing listens, brought up later as a TCP proxy in front of
// the real broker.

#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <map>
#include <set>

#include "support/amqp_test_client.h"
#include "support/child_process.h"
#include "support/free_port.h"
#include "support/pg_test_support.h"
#include "support/tcp_proxy.h"
#include "support/wait.h"

namespace outbox::testing {
namespace {

using std::chrono::seconds;

constexpr int kEvents = 600;
constexpr int kStreams = 12;

class FanOutE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    internal_queue_ = "fanout_internal_" + schema_.name();
    partner_queue_ = "fanout_partner_" + schema_.name();
    DeclareQueue(internal_queue_);
    DeclareQueue(partner_queue_);
    config_path_ = "/tmp/outboxd-" + schema_.name() + ".toml";
  }
  void TearDown() override {
    DeleteQueue(internal_queue_);
    DeleteQueue(partner_queue_);
    std::remove(config_path_.c_str());
    std::remove((config_path_ + ".log").c_str());
  }

  void WriteConfig(const std::string& partner_url) {
    std::ofstream out(config_path_);
    out << "[database]\nurl = \"" << PgUrl() << "\"\nschema = \"" << schema_.name() << "\"\n"
        << "[relay]\ninstance = \"fanout\"\nbatch_size = 200\nlease = \"10s\"\n"
        << "publish_timeout = \"3s\"\nsweep_interval = \"200ms\"\nmax_backoff = \"500ms\"\n"
        << "[retry]\ninitial_delay = \"50ms\"\nmax_delay = \"100ms\"\nmax_attempts = 3\n"
        << "[sinks.default]\ntype = \"rabbitmq\"\nurl = \"" << AmqpUrl() << "\"\n"
        << "routing_key = \"" << internal_queue_ << "\"\n"
        << "[sinks.partner]\ntype = \"rabbitmq\"\nurl = \"" << partner_url << "\"\n"
        << "routing_key = \"" << partner_queue_ << "\"\nenvelope = \"external\"\n"
        << "[http]\nlisten = \"\"\n";
  }

  std::int64_t Count(const std::string& where) {
    return std::stoll(Scalar(
        schema_.conn(), "SELECT count(*) FROM " + schema_.name() + ".messages WHERE " + where));
  }

  std::string Log() {
    std::ifstream in(config_path_ + ".log");
    return {std::istreambuf_iterator<char>(in), {}};
  }

  TestSchema schema_;
  std::string internal_queue_;
  std::string partner_queue_;
  std::string config_path_;
};

// The payload's "n", the event's number.
int EventNumber(const Delivery& delivery) {
  const auto at = delivery.body.find("\"n\": ");
  return at == std::string::npos ? -1 : std::atoi(delivery.body.c_str() + at + 5);
}

// The first delivery of each message, in delivery order (redeliveries after an unknown outcome
// are allowed; a consumer deduplicates them by message id).
std::vector<Delivery> FirstDeliveries(const Consumer& consumer) {
  std::set<std::string> seen;
  std::vector<Delivery> first;
  for (auto& delivery : consumer.deliveries()) {
    if (seen.insert(delivery.message_id).second) first.push_back(std::move(delivery));
  }
  return first;
}

TEST_F(FanOutE2eTest,
       TheInternalCopiesGoAtOnceAndTheExternalOnesFollowInOrderWhenTheirBrokerIsBack) {
  const int dead_port = FreePort();
  WriteConfig("amqp://guest:guest@127.0.0.1:" + std::to_string(dead_port) + "/");
  // One statement, one enqueue per event, in n order: each stream's events in n order.
  Sql(schema_.conn(),
      "SELECT " + schema_.name() +
          ".enqueue(topic => 'orders', payload => jsonb_build_object('n', g), "
          "stream_key => 'order-' || (g % " +
          std::to_string(kStreams) +
          "), type => 'OrderPlaced', correlation_id => 'c-' || g, "
          "headers => jsonb_build_object('traceparent', "
          "'00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', 'x-tenant', 't1'), "
          "targets => ARRAY['default', 'partner']) FROM generate_series(1, " +
          std::to_string(kEvents) + ") g");
  ASSERT_EQ(Count("event_id IS NOT NULL"), 2 * kEvents);

  Consumer internal(internal_queue_);
  Outboxd relay(config_path_);
  EXPECT_TRUE(WaitUntil([&] { return internal.count() >= kEvents; }, seconds{30}))
      << internal.count() << " of " << kEvents << " internal copies\n"
      << Log();
  EXPECT_TRUE(WaitUntil([&] { return Count("target = 'default'") == 0; }, seconds{10}))
      << Count("target = 'default'") << " internal copies not recorded";
  // The partner's copies wait, spending nothing.
  EXPECT_EQ(Count("target = 'partner'"), kEvents);
  EXPECT_EQ(Count("target = 'partner' AND (attempts > 0 OR status IN ('failed', 'abandoned'))"), 0);
  EXPECT_NE(Log().find("sink 'partner' is unavailable"), std::string::npos) << Log();

  // The partner's broker comes up: its copies follow.
  Consumer partner(partner_queue_);
  TcpProxy broker("127.0.0.1", 5672, dead_port);
  EXPECT_TRUE(WaitUntil([&] { return Count("target = 'partner'") == 0; }, seconds{60}))
      << Count("target = 'partner'") << " partner copies still in the outbox\n"
      << Log();
  EXPECT_TRUE(WaitUntil([&] { return partner.count() >= kEvents; }, seconds{10}));
  EXPECT_EQ(relay.Stop(SIGTERM, seconds{30}), 0) << Log();
  internal.Stop();
  partner.Stop();

  const auto internal_copies = FirstDeliveries(internal);
  const auto partner_copies = FirstDeliveries(partner);
  ASSERT_EQ(internal_copies.size(), static_cast<std::size_t>(kEvents));
  ASSERT_EQ(partner_copies.size(), static_cast<std::size_t>(kEvents));

  // Both sides see one event id per event; it is the first target's copy's id.
  std::map<int, std::string> internal_event;
  for (const auto& delivery : internal_copies) {
    const auto event = delivery.headers.find(std::string{wire::kEventId});
    ASSERT_NE(event, delivery.headers.end()) << "no event_id on an internal copy";
    EXPECT_EQ(event->second, delivery.message_id) << "default is the first target";
    internal_event[EventNumber(delivery)] = event->second;
    // The full envelope: the outbox's own headers are there.
    EXPECT_EQ(delivery.headers.count("outbox-topic"), 1U);
    EXPECT_EQ(delivery.headers.count("outbox-partition"), 1U);
  }
  ASSERT_EQ(internal_event.size(), static_cast<std::size_t>(kEvents));
  std::map<std::string, int> last_partner_n;  // per stream: the last event number seen
  for (const auto& delivery : partner_copies) {
    const int n = EventNumber(delivery);
    const auto event = delivery.headers.find(std::string{wire::kEventId});
    ASSERT_NE(event, delivery.headers.end()) << "no event_id on a partner copy";
    EXPECT_EQ(event->second, internal_event[n]) << "event " << n;
    EXPECT_NE(delivery.message_id, event->second) << "each copy has its own id";
    // The external envelope: the user's headers, the type and ids, nothing of the outbox's.
    for (const auto& [name, value] : delivery.headers) {
      EXPECT_FALSE(name.starts_with(wire::kReservedHeaderPrefix))
          << "internal header " << name << " sent to the partner";
    }
    EXPECT_EQ(delivery.headers.at("correlation_id"), "c-" + std::to_string(n));
    EXPECT_EQ(delivery.headers.at("x-tenant"), "t1");
    EXPECT_EQ(delivery.headers.at("traceparent"),
              "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    EXPECT_EQ(delivery.type, "OrderPlaced");
    // In stream order: within a stream, events in n order.
    const std::string stream = "order-" + std::to_string(n % kStreams);
    EXPECT_GT(n, last_partner_n[stream]) << "stream " << stream << " out of order";
    last_partner_n[stream] = n;
  }
  EXPECT_EQ(last_partner_n.size(), static_cast<std::size_t>(kStreams));
  // The internal copies kept their streams' order too, by stream_seq.
  std::map<std::string, std::int64_t> last_seq;
  for (const auto& delivery : internal_copies) {
    EXPECT_GT(delivery.stream_seq, last_seq[delivery.stream_key]) << delivery.stream_key;
    last_seq[delivery.stream_key] = delivery.stream_seq;
  }
  EXPECT_NE(Log().find("sink 'partner' is available again"), std::string::npos) << Log();
}

}  // namespace
}  // namespace outbox::testing
