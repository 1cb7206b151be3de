// The relay's wake-up on MariaDB (store/wakeup.h; the design in src/store/mariadb/wakeup.cpp): a
// commit in another connection wakes Wait within the poll bound, pending messages that were there
// already do not, Interrupt ends a Wait at once, the deadline holds, and a connection killed on
// the server is re-established (kReconnected). Also measures the commit-to-wake latency and the
// statements an idle relay costs (more samples with OUTBOX_MARIADB_WAKEUP_SAMPLES).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <thread>

#include "outbox/core/error.h"
#include "support/mariadb_test_support.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

NewMessage Message(std::string topic = "t") {
  NewMessage message;
  message.topic = std::move(topic);
  message.payload = "{}";
  return message;
}

class MariaDbWakeupTest : public ::testing::Test {
 protected:
  MariaDbTestSchema schema_;

  // The server's URL with the test's database as the connection's default, so that the test can
  // find the wakeup's session among the server's (information_schema.PROCESSLIST.DB).
  std::string OwnUrl() const {
    std::string url = MariaDbUrl();
    const auto query = url.find('?');
    const auto slash = url.rfind('/', query);
    return url.substr(0, slash + 1) + schema_.name() +
           (query == std::string::npos ? "" : url.substr(query));
  }
  std::unique_ptr<Wakeup> Open(milliseconds min_poll = milliseconds{5},
                               milliseconds max_poll = milliseconds{200}) {
    mariadb::WakeupOptions options;
    options.url = OwnUrl();
    options.schema = schema_.name();
    options.min_poll = min_poll;
    options.max_poll = max_poll;
    return mariadb::OpenWakeup(std::move(options));
  }
  std::unique_ptr<Store> OpenStore() {
    mariadb::StoreOptions options;
    options.url = MariaDbUrl();
    options.schema = schema_.name();
    return mariadb::OpenStore(std::move(options));
  }
  // The wakeup's session (the only one whose default database is the test's).
  std::string Session() {
    return MariaDbScalar(schema_.conn(),
                         "SELECT MAX(ID) FROM information_schema.PROCESSLIST WHERE DB = '" +
                             schema_.name() + "'")
        .value_or("");
  }
};

TEST_F(MariaDbWakeupTest, ACommitInAnotherConnectionWakesWaitWithinThePollBound) {
  auto wakeup = Open();
  auto store = OpenStore();
  wakeup->AnnounceIdle();
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds{300});  // the poll has slowed to its bound by then
    const NewMessage message = Message();
    store->Enqueue(std::span{&message, 1});
  });
  const auto started = Clock::now();
  const auto reason = wakeup->Wait(started + std::chrono::seconds{10});
  const auto waited = Clock::now() - started;
  writer.join();
  EXPECT_EQ(reason, WakeReason::kNotified);
  EXPECT_GE(waited, milliseconds{300});
  EXPECT_LT(waited, milliseconds{300 + 200 + 300}) << "the commit, then at most max_poll";
}

// Pending messages that were there before the relay went idle (a paused target's, another relay's
// partitions') do not wake it again and again; a new one does.
TEST_F(MariaDbWakeupTest, MessagesAlreadyPendingDoNotWakeANewOneDoes) {
  auto wakeup = Open(milliseconds{1}, milliseconds{20});
  auto store = OpenStore();
  const std::vector<NewMessage> old{Message(), Message()};
  store->Enqueue(old);
  wakeup->AnnounceIdle();
  EXPECT_EQ(wakeup->Wait(Clock::now() + milliseconds{300}), WakeReason::kTimeout);
  // A message whose writer was still open when the relay announced (an id from before the
  // baseline) wakes it when it commits.
  auto late = MariaDbConnect();
  late.Execute("test", "START TRANSACTION");
  mariadb::Writer writer{schema_.name()};
  writer.Enqueue(late.Ready(), Message());
  EXPECT_EQ(wakeup->Wait(Clock::now() + milliseconds{200}), WakeReason::kTimeout)
      << "not committed yet";
  late.Execute("test", "COMMIT", true);
  EXPECT_EQ(wakeup->Wait(Clock::now() + std::chrono::seconds{5}), WakeReason::kNotified);
}

TEST_F(MariaDbWakeupTest, InterruptEndsAWaitAtOnceAndTheDeadlineHolds) {
  auto wakeup = Open();
  wakeup->AnnounceIdle();
  auto started = Clock::now();
  EXPECT_EQ(wakeup->Wait(started + milliseconds{150}), WakeReason::kTimeout);
  EXPECT_GE(Clock::now() - started, milliseconds{150});
  EXPECT_LT(Clock::now() - started, milliseconds{150 + 250});

  std::thread interrupter([&] {
    std::this_thread::sleep_for(milliseconds{100});
    wakeup->Interrupt();
  });
  started = Clock::now();
  EXPECT_EQ(wakeup->Wait(started + std::chrono::seconds{30}), WakeReason::kInterrupted);
  interrupter.join();
  EXPECT_LT(Clock::now() - started, milliseconds{100 + 100});
  // An Interrupt before the Wait makes it return at once, once.
  wakeup->Interrupt();
  started = Clock::now();
  EXPECT_EQ(wakeup->Wait(started + std::chrono::seconds{30}), WakeReason::kInterrupted);
  EXPECT_LT(Clock::now() - started, milliseconds{50});
  EXPECT_EQ(wakeup->Wait(Clock::now() + milliseconds{50}), WakeReason::kTimeout);
}

TEST_F(MariaDbWakeupTest, AKilledConnectionIsReestablishedAndWaitSaysSo) {
  auto wakeup = Open();
  auto store = OpenStore();
  wakeup->AnnounceIdle();
  const std::string session = Session();
  ASSERT_FALSE(session.empty());
  schema_.conn().Execute("test", "KILL CONNECTION " + session);
  EXPECT_EQ(wakeup->Wait(Clock::now() + std::chrono::seconds{10}), WakeReason::kReconnected);
  EXPECT_NE(Session(), session) << "a new session";
  // Working again: announce, commit, woken.
  wakeup->AnnounceIdle();
  const NewMessage message = Message();
  store->Enqueue(std::span{&message, 1});
  EXPECT_EQ(wakeup->Wait(Clock::now() + std::chrono::seconds{10}), WakeReason::kNotified);
}

TEST_F(MariaDbWakeupTest, BadOptionsAreConfigErrors) {
  mariadb::WakeupOptions options;
  options.url = "";
  options.schema = schema_.name();
  EXPECT_THROW(mariadb::OpenWakeup(options), ConfigError);
  options.url = "postgresql://localhost/x";
  EXPECT_THROW(mariadb::OpenWakeup(options), ConfigError);
  options.url = MariaDbUrl();
  options.schema = "bad name";
  EXPECT_THROW(mariadb::OpenWakeup(options), ConfigError);
  options.schema = schema_.name();
  options.min_poll = milliseconds{0};
  EXPECT_THROW(mariadb::OpenWakeup(options), ConfigError);
  options.min_poll = milliseconds{50};
  options.max_poll = milliseconds{10};
  EXPECT_THROW(mariadb::OpenWakeup(options), ConfigError);
  options.max_poll = milliseconds{100};
  options.schema = "no_such_outbox_schema";
  try {
    mariadb::OpenWakeup(options);
    ADD_FAILURE() << "opened on a schema that is not there";
  } catch (const StoreError& error) {
    EXPECT_EQ(error.kind(), FailureKind::kPermanent);
  }
}

// The statements an idle relay costs and the commit-to-wake latency for commits at random times in
// an idle spell. The suite runs it briefly with max_poll 50 ms; OUTBOX_MARIADB_WAKEUP_SAMPLES=n
// measures with the defaults (min_poll 5 ms, max_poll 200 ms), n commits 0 to 1 s into an idle
// spell, and prints the numbers.
TEST_F(MariaDbWakeupTest, MeasuresIdleStatementsAndCommitToWakeLatency) {
  const char* env = std::getenv("OUTBOX_MARIADB_WAKEUP_SAMPLES");
  const bool measure = env != nullptr;
  const int samples = measure ? std::max(1, std::atoi(env)) : 3;
  const milliseconds max_poll{measure ? 200 : 50};
  const milliseconds window{measure ? 2000 : 1000};
  auto wakeup = Open(milliseconds{5}, max_poll);
  auto store = OpenStore();

  // Idle: the statements of the wakeup's session over the window, once the backoff reached
  // max_poll. information_schema.PROCESSLIST's TIME_MS (time since the session's last command
  // began) drops at every statement; sampled every 5 ms, each drop is one statement.
  wakeup->AnnounceIdle();
  EXPECT_EQ(wakeup->Wait(Clock::now() + max_poll * 5), WakeReason::kTimeout);
  const std::string session = Session();
  int statements = 0;
  std::thread sampler([&] {
    auto sampling = MariaDbConnect();
    double last = -1;
    const auto until = Clock::now() + window;
    while (Clock::now() < until) {
      const double time_ms = std::stod(
          MariaDbScalar(sampling,
                        "SELECT TIME_MS FROM information_schema.PROCESSLIST WHERE ID = " + session)
              .value_or("0"));
      if (last >= 0 && time_ms < last) ++statements;
      last = time_ms;
      std::this_thread::sleep_for(milliseconds{5});
    }
  });
  EXPECT_EQ(wakeup->Wait(Clock::now() + window), WakeReason::kTimeout);
  sampler.join();
  const double per_second = statements * 1000.0 / static_cast<double>(window.count());
  const double bound = 1000.0 / static_cast<double>(max_poll.count());
  EXPECT_GE(per_second, bound * 0.6) << "an idle relay still polls every max_poll";
  EXPECT_LE(per_second, bound * 1.2) << "an idle relay polls at most every max_poll";
  std::cout << "[ measure  ] idle: " << per_second << " statements/s\n";

  std::mt19937 random{42};
  std::uniform_int_distribution<int> idle_for{0, measure ? 1000 : 200};
  std::vector<double> latencies;
  for (int i = 0; i < samples; ++i) {
    wakeup->AnnounceIdle();
    Clock::time_point committed{};
    std::thread writer([&] {
      std::this_thread::sleep_for(milliseconds{idle_for(random)});
      const NewMessage message = Message();
      store->Enqueue(std::span{&message, 1});
      committed = Clock::now();
    });
    const auto reason = wakeup->Wait(Clock::now() + std::chrono::seconds{10});
    const auto woken = Clock::now();
    writer.join();
    ASSERT_EQ(reason, WakeReason::kNotified);
    latencies.push_back(
        std::max(0.0, std::chrono::duration<double, std::milli>(woken - committed).count()));
  }
  std::sort(latencies.begin(), latencies.end());
  const auto at = [&](double q) {
    return latencies[std::min(latencies.size() - 1,
                              static_cast<std::size_t>(q * static_cast<double>(latencies.size())))];
  };
  std::cout << "[ measure  ] commit to wake over " << samples << " commits: p50 " << at(0.5)
            << " ms, p99 " << at(0.99) << " ms, max " << latencies.back() << " ms\n";
  EXPECT_LE(latencies.back(), static_cast<double>(max_poll.count()) + 150.0);
}

}  // namespace
}  // namespace outbox::testing
