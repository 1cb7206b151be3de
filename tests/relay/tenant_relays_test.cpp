// TenantRelays: many databases (here schemas of the test database, each a tenant's outbox) relayed
// by one process through one dispatcher, against a real PostgreSQL.
#include "outbox/relay/tenant_relays.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "outbox/core/error.h"
#include "outbox/store/postgres_type.h"
#include "support/pg_test_support.h"
#include "support/tcp_proxy.h"
#include "test_sink.h"

namespace outbox {
namespace {

using std::chrono::milliseconds;
using testing::PgHostPort;
using testing::PgUrl;
using testing::PgUrlWith;
using testing::Scalar;
using testing::TcpProxy;
using testing::TestSchema;
using testing::TestSink;

bool WaitFor(const std::function<bool()>& done, milliseconds limit = milliseconds{20000}) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds{10});
  }
  return done();
}

RelayGroup::Settings FastSettings() {
  RelayGroup::Settings settings;
  settings.relay.instance = "tenants-test";
  settings.relay.lease = std::chrono::seconds{10};
  settings.relay.sweep_interval = milliseconds{500};
  settings.relay.linger = milliseconds{0};
  settings.relay.publish_timeout = std::chrono::seconds{2};
  settings.relay.min_backoff = milliseconds{50};
  settings.relay.max_backoff = milliseconds{500};
  return settings;
}

NamedDatabase Named(const std::string& name, const std::string& url, const std::string& schema) {
  return {.name = name,
          .settings = std::make_shared<postgres::StoreSettings>(url, schema, false,
                                                                std::chrono::seconds{3}),
          .fingerprint = url + " " + schema};
}

class TenantRelaysTest : public ::testing::Test {
 protected:
  void Start(const std::vector<NamedDatabase>& databases) {
    auto owned = std::make_unique<TestSink>();
    sink_ = owned.get();
    SinkMap sinks;
    sinks.emplace(std::string{kDefaultTarget}, std::move(owned));
    relays_ = std::make_unique<TenantRelays>(FastSettings(), std::move(sinks), registry_,
                                             [](LogLevel, std::string_view) {});
    relays_->Serve(databases);
    thread_ = std::thread([this] { relays_->Run(); });
  }

  void TearDown() override {
    if (relays_) relays_->Stop();
    if (thread_.joinable()) thread_.join();
    relays_.reset();
  }

  static std::string Enqueue(const TestSchema& schema, const std::string& key) {
    return Scalar(schema.conn(),
                  "SELECT " + schema.name() + ".enqueue('orders', '{}', '" + key + "')");
  }

  // Delivered messages by database name.
  std::map<std::string, int> DeliveredBy() const {
    std::map<std::string, int> by;
    for (const Envelope& envelope : sink_->delivered()) ++by[envelope.database];
    return by;
  }

  const TenantRelays::DatabaseState* State(const std::vector<TenantRelays::DatabaseState>& states,
                                           const std::string& name) {
    for (const auto& state : states) {
      if (state.name == name) return &state;
    }
    return nullptr;
  }

  observe::Registry registry_;
  TestSink* sink_ = nullptr;
  std::unique_ptr<TenantRelays> relays_;
  std::thread thread_;
};

TEST_F(TenantRelaysTest, EachDatabasesMessagesCarryItsNameAndItsOwnSeries) {
  TestSchema a;
  TestSchema b;
  Start({Named("tenant-a", PgUrl(), a.name()), Named("tenant-b", PgUrl(), b.name())});
  // The same stream key in both: two streams, each numbered from 1.
  for (int i = 0; i < 3; ++i) Enqueue(a, "order-1");
  Enqueue(b, "order-1");
  ASSERT_TRUE(WaitFor([&] { return sink_->delivered().size() == 4; }));
  const auto by = DeliveredBy();
  EXPECT_EQ(by.at("tenant-a"), 3);
  EXPECT_EQ(by.at("tenant-b"), 1);
  for (const Envelope& envelope : sink_->delivered()) {
    if (envelope.database == "tenant-b") {
      EXPECT_EQ(envelope.stream_seq, 1);
    }
  }
  ASSERT_TRUE(WaitFor([&] { return relays_->CountersTotal().published == 4; }));
  const std::string metrics = registry_.RenderPrometheus();
  EXPECT_NE(metrics.find("outbox_published_total{database=\"tenant-a\"} 3"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("outbox_published_total{database=\"tenant-b\"} 1"), std::string::npos);
  const auto states = relays_->States();
  ASSERT_EQ(states.size(), 2U);
  EXPECT_TRUE(states[0].relaying && states[1].relaying);
}

TEST_F(TenantRelaysTest, AnUnreachableOrUnmigratedDatabaseHoldsBackNothingOfTheOthers) {
  TestSchema healthy;
  TestSchema behind_proxy;
  const auto [host, port] = PgHostPort();
  TcpProxy proxy(host, port);
  proxy.SetMode(TcpProxy::Mode::kBlackhole);  // its connections time out
  const std::string proxied = PgUrlWith("port=" + std::to_string(proxy.port()));
  Start({Named("healthy", PgUrl(), healthy.name()), Named("down", proxied, behind_proxy.name()),
         Named("unmigrated", PgUrl(), "never_migrated_here")});
  for (int i = 0; i < 5; ++i) Enqueue(healthy, "k" + std::to_string(i));
  Enqueue(behind_proxy, "k0");
  ASSERT_TRUE(WaitFor([&] { return DeliveredBy()["healthy"] == 5; }));
  // Reported, not relaying, each with why.
  ASSERT_TRUE(WaitFor([&] {
    const auto states = relays_->States();
    const auto* down = State(states, "down");
    const auto* unmigrated = State(states, "unmigrated");
    return down != nullptr && !down->relaying && !down->problem.empty() &&
           down->problem != "starting" && unmigrated != nullptr && !unmigrated->relaying &&
           unmigrated->problem.find("not migrated") != std::string::npos;
  }));
  EXPECT_EQ(DeliveredBy().count("down"), 0U);
  // Back: its message goes out without a restart.
  proxy.SetMode(TcpProxy::Mode::kForward);
  ASSERT_TRUE(WaitFor([&] { return DeliveredBy()["down"] == 1; }));
  const auto back = relays_->States();
  EXPECT_TRUE(State(back, "down")->relaying);
  // Lost while it runs: the relay rides the outage out, and says so meanwhile.
  proxy.SetMode(TcpProxy::Mode::kBlackhole);
  proxy.DropAll();
  ASSERT_TRUE(WaitFor([&] {
    const auto states = relays_->States();
    const auto* down = State(states, "down");
    return !down->relaying && down->problem.find("does not answer") != std::string::npos;
  }));
  Enqueue(healthy, "after");
  ASSERT_TRUE(WaitFor([&] { return DeliveredBy()["healthy"] == 6; }));
  proxy.SetMode(TcpProxy::Mode::kForward);
  ASSERT_TRUE(WaitFor([&] {
    const auto states = relays_->States();
    return State(states, "down")->relaying;
  }));
}

TEST_F(TenantRelaysTest, ServeStartsTheNewDrainsTheGoneAndRestartsTheChanged) {
  TestSchema a;
  TestSchema b;
  Start({Named("a", PgUrl(), a.name())});
  Enqueue(a, "k");
  ASSERT_TRUE(WaitFor([&] { return DeliveredBy()["a"] == 1; }));
  relays_->Serve({Named("b", PgUrl(), b.name())});
  // `a` is drained and gone: what it is written now stays in its table.
  const auto states = relays_->States();
  ASSERT_EQ(states.size(), 1U);
  EXPECT_EQ(states[0].name, "b");
  Enqueue(a, "k");
  Enqueue(b, "k");
  ASSERT_TRUE(WaitFor([&] { return DeliveredBy()["b"] == 1; }));
  std::this_thread::sleep_for(milliseconds{700});  // more than a sweep
  EXPECT_EQ(DeliveredBy()["a"], 1);
  EXPECT_EQ(
      Scalar(a.conn(), "SELECT count(*) FROM " + a.name() + ".messages WHERE status = 'pending'"),
      "1");
  // The totals keep what a drained database published.
  EXPECT_EQ(relays_->CountersTotal().published, 2U);
  // The same name with other settings: restarted on them (here: `a`'s schema under b's name).
  relays_->Serve({Named("b", PgUrl(), a.name())});
  ASSERT_TRUE(WaitFor([&] { return DeliveredBy()["b"] == 2; }));
}

TEST(TenantRelaysNames, ADatabaseNameIsShortAndPlain) {
  EXPECT_NO_THROW(ValidateDatabaseName("tenant-42.eu_west"));
  EXPECT_THROW(ValidateDatabaseName(""), ConfigError);
  EXPECT_THROW(ValidateDatabaseName("a b"), ConfigError);
  EXPECT_THROW(ValidateDatabaseName("a\"b"), ConfigError);
  EXPECT_THROW(ValidateDatabaseName(std::string(64, 'x')), ConfigError);
  EXPECT_NO_THROW(ValidateDatabaseName(std::string(63, 'x')));
}

}  // namespace
}  // namespace outbox
