#include "exactly_once_scenario.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <memory>
#include <thread>

#include "support/child_process.h"
#include "support/pg_test_support.h"

namespace outbox::testing {

using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The last line of `log` that contains `text`, or "" (the consumer's summary, the writer's).
std::string LastLineWith(const std::string& log, const std::string& text) {
  const auto at = log.rfind(text);
  if (at == std::string::npos) return {};
  const auto start = log.rfind('\n', at);
  const auto end = log.find('\n', at);
  return log.substr(start == std::string::npos ? 0 : start + 1,
                    end == std::string::npos ? std::string::npos : end - start - 1);
}

}  // namespace

void RunExactlyOnce(const ExactlyOnceRun& run) {
  const std::string config = "/tmp/outboxd-" + run.schema + ".toml";
  const std::string log = config + ".log";
  {
    std::ofstream out(config);
    out << "[database]\nurl = \"" << PgUrl() << "\"\nschema = \"" << run.schema << "\"\n"
        << "[relay]\ninstance = \"exactly-once-e2e\"\nlease = \"4s\"\npublish_timeout = \"2s\"\n"
        << "sweep_interval = \"200ms\"\nmax_backoff = \"500ms\"\n"
        << run.sinks << "\n[http]\nlisten = \"\"\n";
  }
  std::vector<std::string> writer_args = run.writer;
  writer_args.insert(writer_args.end(),
                     {"--db", PgUrl(), "--schema", run.schema, "--table", OrdersTable(run.schema)});
  const std::vector<std::string> relay_args{OUTBOXD_PATH, "--config", config};
  const auto start_consumer = [&] {
    return std::make_unique<ChildProcess>(run.consumer, log, Ready::LogLine(run.consumer_ready));
  };
  const auto start_relay = [&] {
    return std::make_unique<ChildProcess>(relay_args, log, Ready::Notify());
  };

  ChildProcess writer(writer_args, log);
  auto relay = start_relay();
  // Both die mid-run without a chance to clean up, and come back: the relay holding leases on
  // what it published, the consumer while it works through a backlog (it starts late), between a
  // commit and an acknowledgement or inside a transaction.
  std::this_thread::sleep_for(milliseconds{1500});
  EXPECT_EQ(relay->Stop(SIGKILL), 128 + SIGKILL);
  relay = start_relay();
  auto consumer = start_consumer();
  ASSERT_TRUE(consumer->WaitReady()) << ReadFile(log);
  std::this_thread::sleep_for(milliseconds{300});
  EXPECT_EQ(consumer->Stop(SIGKILL), 128 + SIGKILL);
  consumer = start_consumer();
  ASSERT_EQ(writer.Wait(seconds{180}), 0) << ReadFile(log);

  PgConn conn = Connect();
  const std::string applied_table = AppliedTable(run.schema);
  const std::string expected =
      Scalar(conn.get(), "SELECT count(*) FROM " + OrdersTable(run.schema) + ", unnest(event_ids)");
  const auto applied = [&] {
    // The consumer creates its table when it starts; until then nothing is applied.
    if (Scalar(conn.get(), "SELECT to_regclass('" + applied_table + "') IS NULL") == "t") {
      return std::string{"0"};
    }
    return Scalar(conn.get(), "SELECT count(DISTINCT message_id) FROM " + applied_table);
  };
  for (int i = 0; i < 1200 && applied() != expected; ++i)
    std::this_thread::sleep_for(milliseconds{100});
  std::this_thread::sleep_for(milliseconds{500});  // a late second application would show by now
  EXPECT_EQ(relay->Stop(SIGTERM), 0);
  EXPECT_EQ(consumer->Stop(SIGTERM), 0);
  const std::string output = ReadFile(log);

  const std::string writer_said = LastLineWith(output, "place_orders: committed");
  ASSERT_FALSE(writer_said.empty()) << output;
  EXPECT_EQ(writer_said.find("rolled back 0"), std::string::npos) << writer_said;
  EXPECT_EQ(std::stoul(expected) % run.copies, 0U);
  ASSERT_EQ(applied(), expected) << output;
  // Exactly once: as many rows as distinct ids, and each id is a committed order's event.
  EXPECT_EQ(Scalar(conn.get(), "SELECT count(*) FROM " + applied_table), expected) << output;
  EXPECT_EQ(Scalar(conn.get(), "SELECT count(*) FROM " + applied_table +
                                   " a WHERE NOT EXISTS (SELECT 1 FROM " + OrdersTable(run.schema) +
                                   " o WHERE a.message_id = ANY(o.event_ids))"),
            "0")
      << output;
  // Each copy arrived from its own target: the target column names one per copy of an order.
  EXPECT_EQ(Scalar(conn.get(), "SELECT count(DISTINCT target) FROM " + applied_table),
            std::to_string(run.copies));
  // In stream order: per (target, stream), in the order of application, seqs 1, 2, 3, ...
  EXPECT_EQ(Scalar(conn.get(),
                   "SELECT count(*) FROM (SELECT stream_seq, row_number() OVER "
                   "(PARTITION BY target, stream_key ORDER BY n) AS k FROM " +
                       applied_table + ") x WHERE stream_seq IS DISTINCT FROM k"),
            "0")
      << output;
  std::printf("[ e2e ] %s events committed (%s), applied exactly once in stream order; %s\n",
              expected.c_str(), writer_said.c_str(), LastLineWith(output, "processed").c_str());
  std::remove(config.c_str());
  std::remove(log.c_str());
}

}  // namespace outbox::testing
