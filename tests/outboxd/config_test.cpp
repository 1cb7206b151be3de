#include "config.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "outbox/core/error.h"
#include "outbox/sink/file_type.h"
#include "outbox/sink/rabbitmq_type.h"
#include "outbox/store/mariadb_type.h"
#include "outbox/store/postgres.h"
#include "outbox/store/postgres_type.h"
#include "outbox/store/sqlite_type.h"
#include "support/child_process.h"

namespace outbox::outboxd {
namespace {

// The settings of a sink of each type, as its type read them.
const rabbitmq::SinkOptions& Rabbit(const SinkConfig& sink) {
  return dynamic_cast<const rabbitmq::SinkSettings&>(*sink.settings).options();
}
const file::SinkOptions& File(const SinkConfig& sink) {
  return dynamic_cast<const file::SinkSettings&>(*sink.settings).options();
}
// The [database] settings, as the store type read them.
const postgres::StoreSettings& Pg(const Config& config) {
  return dynamic_cast<const postgres::StoreSettings&>(*config.database);
}
const sqlite::StoreSettings& Lite(const Config& config) {
  return dynamic_cast<const sqlite::StoreSettings&>(*config.database);
}

using std::chrono::milliseconds;
using std::chrono::seconds;
using Env = std::map<std::string, std::string>;

GetenvFn FakeEnv(Env env) {
  return [env = std::move(env)](const char* name) -> const char* {
    const auto found = env.find(name);
    return found == env.end() ? nullptr : found->second.c_str();
  };
}

constexpr std::string_view kMinimal = R"(
[database]
url = "postgresql://outbox@db/app"

[sinks.default]
type = "file"
)";

Config Parse(std::string_view text, const Env& env = {}) {
  return ParseConfig(text, "test.toml", FakeEnv(env));
}

// Parses `text`, expecting a ConfigError for `key` whose message contains `fragment`.
void ExpectError(std::string_view text, const std::string& key, const std::string& fragment,
                 const Env& env = {}) {
  try {
    Parse(text, env);
    ADD_FAILURE() << "no error; expected one for " << key << " in:\n" << text;
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key(), key) << error.what();
    EXPECT_NE(std::string{error.what()}.find(fragment), std::string::npos)
        << "'" << error.what() << "' lacks '" << fragment << "'";
  }
}

std::string WithRelay(std::string_view relay_lines) {
  return std::string{kMinimal} + "\n[relay]\n" + std::string{relay_lines} + "\n";
}

std::string WithSink(std::string_view sink_lines) {
  return "[database]\nurl = \"postgresql://outbox@db/app\"\n[sinks.default]\n" +
         std::string{sink_lines} + "\n";
}

constexpr std::string_view kRabbit = "type = \"rabbitmq\"\nurl = \"amqp://guest:guest@mq/\"\n";

// ---- The example file ----

TEST(ConfigTest, ExampleFileIsValidAndStatesTheDefaults) {
  const Config config = LoadConfig(OUTBOX_EXAMPLE_CONFIG, FakeEnv({}));
  const Config defaults;
  EXPECT_EQ(config.database_type, defaults.database_type);
  EXPECT_EQ(Pg(config).url(), "postgresql://outbox@127.0.0.1:5432/app");
  EXPECT_EQ(Pg(config).schema(), postgres::kDefaultSchema);
  EXPECT_EQ(config.relay.batch_size, defaults.relay.batch_size);
  EXPECT_EQ(config.relay.lease, defaults.relay.lease);
  EXPECT_EQ(config.relay.sweep_interval, defaults.relay.sweep_interval);
  EXPECT_EQ(config.relay.publish_timeout, defaults.relay.publish_timeout);
  EXPECT_EQ(config.relay.shutdown_timeout, defaults.relay.shutdown_timeout);
  EXPECT_EQ(config.relay.min_backoff, defaults.relay.min_backoff);
  EXPECT_EQ(config.relay.max_backoff, defaults.relay.max_backoff);
  EXPECT_EQ(config.relay.purge_interval, defaults.relay.purge_interval);
  EXPECT_EQ(config.relay.idle_lease, config.relay.lease) << "idle_lease's default: the lease";
  EXPECT_EQ(config.retry.initial_delay, defaults.retry.initial_delay);
  EXPECT_EQ(config.retry.max_delay, defaults.retry.max_delay);
  EXPECT_EQ(config.retry.multiplier, defaults.retry.multiplier);
  EXPECT_EQ(config.retry.jitter, defaults.retry.jitter);
  EXPECT_EQ(config.retry.max_attempts, defaults.retry.max_attempts);
  EXPECT_EQ(config.retention.published, defaults.retention.published);
  EXPECT_EQ(config.retention.abandoned, defaults.retention.abandoned);
  EXPECT_EQ(config.log_level, defaults.log_level);
  EXPECT_EQ(config.log_format, defaults.log_format);
  EXPECT_EQ(config.http.listen, defaults.http.listen);
  EXPECT_EQ(config.http.token, defaults.http.token);
  EXPECT_EQ(config.http.allow_unauthenticated, defaults.http.allow_unauthenticated);
  EXPECT_EQ(config.http.stats_interval, defaults.http.stats_interval);
  EXPECT_EQ(config.http.ready_max_age, defaults.http.ready_max_age);

  ASSERT_EQ(config.sinks.size(), 2U);
  EXPECT_EQ(config.sinks[0].name, "default");
  const auto& rabbit = Rabbit(config.sinks[0]);
  const rabbitmq::SinkOptions rabbit_defaults;
  EXPECT_EQ(rabbit.url, "amqp://guest:guest@127.0.0.1:5672/");
  EXPECT_EQ(rabbit.exchange, rabbit_defaults.exchange);
  EXPECT_EQ(rabbit.routing_key, rabbit_defaults.routing_key);
  EXPECT_EQ(rabbit.mandatory, rabbit_defaults.mandatory);
  EXPECT_EQ(rabbit.persistent, rabbit_defaults.persistent);
  EXPECT_EQ(rabbit.confirm_window, rabbit_defaults.confirm_window);
  EXPECT_EQ(rabbit.connect_timeout, rabbit_defaults.connect_timeout);
  EXPECT_EQ(rabbit.heartbeat, rabbit_defaults.heartbeat);
  EXPECT_EQ(rabbit.declare_exchange_type, rabbit_defaults.declare_exchange_type);
  EXPECT_EQ(rabbit.max_message_bytes, rabbit_defaults.max_message_bytes);
  EXPECT_EQ(rabbit.envelope, rabbit_defaults.envelope);
  EXPECT_EQ(config.sinks[1].name, "audit");
  const auto& file = File(config.sinks[1]);
  EXPECT_EQ(file.path, file::SinkOptions{}.path);
  EXPECT_EQ(file.fsync, file::SinkOptions{}.fsync);
  EXPECT_EQ(file.envelope, file::SinkOptions{}.envelope);
}

TEST(ConfigTest, StatementDeadlineIsReadValidatedAndDescribed) {
  EXPECT_EQ(Pg(Parse(kMinimal)).statement_deadline(), std::chrono::seconds{15});
  EXPECT_NE(Describe(Parse(kMinimal)).find("statement_deadline = \"15s\""), std::string::npos)
      << Describe(Parse(kMinimal));
  const auto with = [](std::string_view value) {
    return "[database]\nurl = \"x\"\nstatement_deadline = " + std::string{value} +
           "\n[sinks.default]\ntype = \"file\"\n";
  };
  EXPECT_EQ(Pg(Parse(with("\"2s\""))).statement_deadline(), std::chrono::seconds{2});
  EXPECT_EQ(Pg(Parse(with("\"0s\""))).statement_deadline(), std::chrono::milliseconds{0});
  ExpectError(with("\"500ms\""), "database.statement_deadline",
              "must be at least 1s (or \"0s\" to wait for the database without a deadline), got "
              "500ms");
  ExpectError(with("\"2h\""), "database.statement_deadline", "must be between 0s and 1h");
  ExpectError(with("\"soon\""), "database.statement_deadline", "");
  ExpectError(with("15"), "database.statement_deadline", "(a string)");
}

TEST(ConfigTest, WalModeIsReadAndDescribed) {
  const Config config =
      Parse("[database]\nurl = \"x\"\nmode = \"wal\"\n[sinks.default]\ntype = \"file\"\n");
  EXPECT_TRUE(Pg(config).WalMode());
  EXPECT_NE(Describe(config).find("mode = \"wal\""), std::string::npos) << Describe(config);
  EXPECT_NE(Describe(Parse(kMinimal)).find("mode = \"table\""), std::string::npos);
  // Each mode has its own default linger (issue #49); a file's value holds in either.
  EXPECT_EQ(config.relay.linger, kWalLinger);
  EXPECT_NE(Describe(config).find("linger = \"26ms\""), std::string::npos) << Describe(config);
  EXPECT_EQ(Parse(kMinimal).relay.linger, kTableLinger);
  EXPECT_EQ(Parse("[database]\nurl = \"x\"\nmode = \"wal\"\n[relay]\nlinger = \"7ms\"\n"
                  "[sinks.default]\ntype = \"file\"\n")
                .relay.linger,
            std::chrono::milliseconds{7});
}

TEST(ConfigTest, ExampleFileMentionsEveryKey) {
  std::ifstream in(OUTBOX_EXAMPLE_CONFIG);
  std::stringstream example;
  example << in.rdbuf();
  const std::string text = example.str();
  // Describe writes every key there is; each must be in the example, set or commented out.
  std::istringstream described(Describe(LoadConfig(OUTBOX_EXAMPLE_CONFIG, FakeEnv({}))));
  int keys = 0;
  for (std::string line; std::getline(described, line);) {
    const std::size_t equals = line.find(" = ");
    if (equals == std::string::npos) continue;
    const std::string key = line.substr(0, equals);
    ++keys;
    EXPECT_TRUE(text.find("\n" + key + " = ") != std::string::npos ||
                text.find("\n# " + key + " = ") != std::string::npos)
        << "the example does not document " << key;
  }
  EXPECT_GT(keys, 30);
}

// ---- Defaults ----

TEST(ConfigTest, MinimalFileGetsDefaults) {
  const Config config = Parse(kMinimal);
  const Config defaults;
  EXPECT_EQ(Pg(config).url(), "postgresql://outbox@db/app");
  EXPECT_EQ(Pg(config).schema(), "outbox");
  EXPECT_FALSE(Pg(config).WalMode());
  EXPECT_EQ(config.relay.batch_size, 500);
  EXPECT_EQ(config.relay.lease, milliseconds{30000});
  // PostgreSQL's writers wake the relay: the sweep is a safety net (issue #21).
  EXPECT_EQ(config.relay.sweep_interval, milliseconds{10000});
  EXPECT_EQ(config.relay.linger, milliseconds{22});
  EXPECT_EQ(config.relay.publish_timeout, milliseconds{10000});
  EXPECT_EQ(config.relay.shutdown_timeout, milliseconds{10000});
  EXPECT_EQ(config.retry.max_attempts, defaults.retry.max_attempts);
  EXPECT_EQ(config.retention.abandoned, defaults.retention.abandoned);
  EXPECT_EQ(config.log_level, "info");
  EXPECT_EQ(config.log_format, "text");
  const std::string pid_suffix = "-" + std::to_string(::getpid());
  ASSERT_GT(config.relay.instance.size(), pid_suffix.size());
  EXPECT_EQ(config.relay.instance.substr(config.relay.instance.size() - pid_suffix.size()),
            pid_suffix);
  ASSERT_EQ(config.sinks.size(), 1U);
  EXPECT_EQ(config.sinks[0].name, "default");
  EXPECT_EQ(File(config.sinks[0]).path, "-");
}

TEST(ConfigTest, ValuesAreRead) {
  const Config config = Parse(std::string{kMinimal} + R"(
[relay]
instance = "relay-7"
batch_size = 50
lease = "4m"
sweep_interval = "250ms"
linger = "0ms"
publish_timeout = "90s"
shutdown_timeout = "0s"
[retry]
initial_delay = "100ms"
max_delay = "1h"
multiplier = 3
jitter = 0.5
max_attempts = 4
[retention]
published = "1d"
abandoned = "7d"
[log]
level = "debug"
format = "json"
[sinks.orders-mq]
type = "rabbitmq"
url = "amqp://u:p@mq:5672/vh"
exchange = "events"
routing_key = "{target}.{topic}.{type}"
mandatory = false
persistent = false
confirm_window = 16
connect_timeout = "1500ms"
heartbeat = "0s"
declare_exchange_type = "topic"
max_message_bytes = 1024
envelope = "external"
)");
  EXPECT_EQ(config.relay.instance, "relay-7");
  EXPECT_EQ(config.relay.batch_size, 50);
  EXPECT_EQ(config.relay.lease, std::chrono::minutes{4});
  EXPECT_EQ(config.relay.sweep_interval, milliseconds{250});
  EXPECT_EQ(config.relay.linger, milliseconds{0});
  EXPECT_EQ(config.relay.publish_timeout, seconds{90});
  EXPECT_EQ(config.relay.shutdown_timeout, milliseconds{0});
  EXPECT_EQ(config.retry.initial_delay, milliseconds{100});
  EXPECT_EQ(config.retry.max_delay, std::chrono::hours{1});
  EXPECT_EQ(config.retry.multiplier, 3.0);
  EXPECT_EQ(config.retry.jitter, 0.5);
  EXPECT_EQ(config.retry.max_attempts, 4);
  EXPECT_EQ(config.retention.published, std::chrono::hours{24});
  EXPECT_EQ(config.retention.abandoned, std::chrono::hours{24 * 7});
  EXPECT_EQ(config.log_level, "debug");
  EXPECT_EQ(config.log_format, "json");
  ASSERT_EQ(config.sinks.size(), 2U);
  EXPECT_EQ(config.sinks[1].name, "orders-mq");
  const auto& rabbit = Rabbit(config.sinks[1]);
  EXPECT_EQ(rabbit.url, "amqp://u:p@mq:5672/vh");
  EXPECT_EQ(rabbit.exchange, "events");
  EXPECT_EQ(rabbit.routing_key, "{target}.{topic}.{type}");
  EXPECT_FALSE(rabbit.mandatory);
  EXPECT_FALSE(rabbit.persistent);
  EXPECT_EQ(rabbit.confirm_window, 16U);
  EXPECT_EQ(rabbit.connect_timeout, milliseconds{1500});
  EXPECT_EQ(rabbit.heartbeat, seconds{0});
  EXPECT_EQ(rabbit.declare_exchange_type, "topic");
  EXPECT_EQ(rabbit.max_message_bytes, 1024U);
  EXPECT_EQ(rabbit.envelope, EnvelopeStyle::kExternal);
}

TEST(ConfigTest, SinksKeepFileOrder) {
  const Config config = Parse(R"(
[database]
url = "x"
[sinks.zeta]
type = "file"
[sinks.alpha]
type = "file"
path = "/tmp/a"
[sinks.mid]
type = "file"
)");
  ASSERT_EQ(config.sinks.size(), 3U);
  EXPECT_EQ(config.sinks[0].name, "zeta");
  EXPECT_EQ(config.sinks[1].name, "alpha");
  EXPECT_EQ(config.sinks[2].name, "mid");
}

// ---- Unknown keys ----

TEST(ConfigTest, UnknownKeysAreRejectedByFullName) {
  ExpectError(std::string{kMinimal} + "\n[metrics]\nport = 9090\n", "metrics",
              "unknown section or key");
  ExpectError("stray = 1\n" + std::string{kMinimal}, "stray", "unknown section or key");
  ExpectError(WithRelay("batchsize = 10"), "relay.batchsize",
              "unknown key (did you mean \"relay.batch_size\"?)");
  ExpectError(WithRelay("color = \"red\""), "relay.color", "[relay] accepts: instance, batch_size");
  ExpectError(std::string{kMinimal} + "[database.pool]\nsize = 3\n", "database.pool",
              "unknown key");
  ExpectError(std::string{kMinimal} + "[retry]\nattempts = 3\n", "retry.attempts", "unknown key");
  ExpectError(std::string{kMinimal} + "[log]\nfile = \"x\"\n", "log.file", "unknown key");
  ExpectError(std::string{kMinimal} + "[retention]\npublish = \"1s\"\n", "retention.publish",
              "did you mean \"retention.published\"");
}

TEST(ConfigTest, SinkKeysDependOnItsType) {
  ExpectError(WithSink("type = \"file\"\nurl = \"amqp://x/\""), "sinks.default.url", "unknown key");
  ExpectError(WithSink(std::string{kRabbit} + "path = \"-\""), "sinks.default.path", "unknown key");
  ExpectError(WithSink(std::string{kRabbit} + "confirm_windows = 5"),
              "sinks.default.confirm_windows", "did you mean \"sinks.default.confirm_window\"");
}

// Issue #43: every sink type takes max_rate (and max_burst), read in one place.
TEST(ConfigTest, EverySinkTakesAMaxRateAndAMaxBurst) {
  EXPECT_FALSE(Parse(kMinimal).sinks[0].rate_limit.has_value());
  const Config file = Parse(WithSink("type = \"file\"\nmax_rate = 200"));
  ASSERT_TRUE(file.sinks[0].rate_limit.has_value());
  EXPECT_EQ(file.sinks[0].rate_limit->max_rate, 200.0);
  EXPECT_EQ(file.sinks[0].rate_limit->burst(), 200.0) << "one second's worth by default";
  const Config rabbit = Parse(WithSink(std::string{kRabbit} + "max_rate = 2.5\nmax_burst = 10"));
  ASSERT_TRUE(rabbit.sinks[0].rate_limit.has_value());
  EXPECT_EQ(rabbit.sinks[0].rate_limit->max_rate, 2.5);
  EXPECT_EQ(rabbit.sinks[0].rate_limit->burst(), 10.0);
  EXPECT_NE(Describe(rabbit).find("max_rate = 2.5\nmax_burst = 10"), std::string::npos)
      << Describe(rabbit);
  ExpectError(WithSink("type = \"file\"\nmax_rate = 0"), "sinks.default.max_rate",
              "must be a positive number of messages a second");
  ExpectError(WithSink("type = \"file\"\nmax_rate = -3"), "sinks.default.max_rate",
              "must be a positive number");
  ExpectError(WithSink("type = \"file\"\nmax_rate = \"fast\""), "sinks.default.max_rate", "");
  ExpectError(WithSink("type = \"file\"\nmax_rate = nan"), "sinks.default.max_rate", "got nan");
  ExpectError(WithSink("type = \"file\"\nmax_rate = 2e6"), "sinks.default.max_rate",
              "(at most 1000000), got 2e+06");
  ExpectError(WithSink("type = \"file\"\nmax_rate = 10\nmax_burst = 0"), "sinks.default.max_burst",
              "must be a number of messages from 1");
  ExpectError(WithSink("type = \"file\"\nmax_burst = 10"), "sinks.default.max_burst",
              "is only read with max_rate");
  ExpectError(WithSink("type = \"file\"\nmax_rates = 10"), "sinks.default.max_rates",
              "did you mean \"sinks.default.max_rate\"");
}

// The claim check (docs/claim-check.md): a sub-table of any sink's table, read by outboxd for every
// type, described after the sink's keys, its secret masked and given to the redactor.
TEST(ConfigTest, AnySinkTakesAClaimCheckTable) {
  const std::string claim_check =
      "\n[sinks.default.claim_check]\nendpoint = \"http://127.0.0.1:9000\"\nbucket = \"claims\"\n"
      "access_key_id = \"AKIA1\"\n";
  const Config config =
      Parse(WithSink(std::string{kRabbit} + claim_check),
            {{"OUTBOX_SINK_DEFAULT_CLAIM_CHECK_SECRET_ACCESS_KEY", "claim-secret-42"}});
  const std::string described = Describe(config);
  EXPECT_NE(described.find("[sinks.default.claim_check]\nendpoint = \"http://127.0.0.1:9000\""),
            std::string::npos)
      << described;
  EXPECT_EQ(described.find("claim-secret-42"), std::string::npos) << described;
  const auto secrets = config.sinks.at(0).settings->Secrets();
  EXPECT_NE(std::find(secrets.begin(), secrets.end(), "claim-secret-42"), secrets.end());
  ExpectError(WithSink("type = \"file\"\npath = \"-\"\nclaim_check = 5"),
              "sinks.default.claim_check", "expected a table");
  ExpectError(WithSink(std::string{kRabbit} + claim_check + "threshold = \"1MB\"\n"),
              "sinks.default.claim_check.threshold", "expected an integer");
}

// A top-level [claim_check] is every sink's default: used by a sink without a table of its own,
// read under one with a table, not used by one that says enabled = false.
TEST(ConfigTest, AGlobalClaimCheckIsEverySinksDefault) {
  const std::string text =
      "[database]\nurl = \"postgresql://outbox@db/app\"\n"
      "[claim_check]\nendpoint = \"http://127.0.0.1:9000\"\nbucket = \"claims\"\n"
      "access_key_id = \"AKIA1\"\nprefix = \"all/\"\n"
      "[sinks.a]\ntype = \"file\"\npath = \"-\"\n"
      "[sinks.b]\ntype = \"file\"\npath = \"-\"\n[sinks.b.claim_check]\nprefix = \"b/\"\n"
      "[sinks.c]\ntype = \"file\"\npath = \"-\"\n[sinks.c.claim_check]\nenabled = false\n";
  const Config config = Parse(text, {{"OUTBOX_CLAIM_CHECK_SECRET_ACCESS_KEY", "global-secret-9"}});
  const std::string described = Describe(config);
  EXPECT_NE(described.find("[claim_check]\nendpoint = \"http://127.0.0.1:9000\""),
            std::string::npos)
      << described;
  EXPECT_NE(described.find("[sinks.a.claim_check]\nendpoint = \"http://127.0.0.1:9000\"\n"
                           "bucket = \"claims\"\nregion = \"us-east-1\"\nurl_style = \"path\"\n"
                           "prefix = \"all/\"\n"),
            std::string::npos)
      << described;
  EXPECT_NE(described.find("[sinks.b.claim_check]\nendpoint = \"http://127.0.0.1:9000\"\n"
                           "bucket = \"claims\"\nregion = \"us-east-1\"\nurl_style = \"path\"\n"
                           "prefix = \"b/\"\n"),
            std::string::npos)
      << described;
  EXPECT_EQ(described.find("[sinks.c.claim_check]"), std::string::npos) << described;
  EXPECT_EQ(described.find("global-secret-9"), std::string::npos) << described;
  ExpectError("claim_check = 1\n" + WithSink("type = \"file\"\npath = \"-\""), "claim_check",
              "expected a table");
  ExpectError(WithSink("type = \"file\"\npath = \"-\"") + "[claim_check]\nbucket = \"claims\"\n",
              "claim_check.endpoint", "http:// or https://");
}

TEST(ConfigTest, OnAbandonIsEverySinksAndNamesTheTargetsThatHold) {
  const Config config = Parse(R"(
[database]
url = "x"
[sinks.default]
type = "file"
on_abandon = "hold"
[sinks.audit]
type = "file"
on_abandon = "continue"
[sinks.other]
type = "file"
)");
  EXPECT_EQ(config.retry.hold_targets, std::vector<std::string>{"default"});
  EXPECT_EQ(config.sinks[0].on_abandon, "hold");
  EXPECT_EQ(config.sinks[2].on_abandon, "continue");
  EXPECT_NE(Describe(config).find("[sinks.default]\ntype = \"file\"\non_abandon = \"hold\"\n"),
            std::string::npos)
      << Describe(config);
  ExpectError(WithSink("type = \"file\"\non_abandon = \"stop\""), "sinks.default.on_abandon",
              "must be \"continue\" or \"hold\", got \"stop\"");
  ExpectError(WithSink("type = \"file\"\non_abandon = true"), "sinks.default.on_abandon", "string");
  ExpectError(WithSink("type = \"file\"\non_abandom = \"hold\""), "sinks.default.on_abandom",
              "did you mean \"sinks.default.on_abandon\"");
  ExpectError(WithSink("type = \"file\"\nabandon = \"hold\""), "sinks.default.abandon",
              "accepts: type, path, fsync, envelope, cloudevents_mode, cloudevents_source, "
              "on_abandon, max_rate, max_burst");
}

// ---- Types ----

TEST(ConfigTest, WrongTypesNameTheExpectedOne) {
  try {
    Parse(WithRelay("batch_size = \"500\""));
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key(), "relay.batch_size");
    EXPECT_EQ(
        std::string{error.what()}.rfind("relay.batch_size: expected an integer, got string", 0), 0U)
        << error.what();
    EXPECT_NE(std::string{error.what()}.find("test.toml:"), std::string::npos) << "a location";
  }
  ExpectError(WithRelay("instance = 7"), "relay.instance", "expected a string, got integer");
  ExpectError(WithRelay("batch_size = 1.5"), "relay.batch_size", "expected an integer, got float");
  ExpectError(WithSink(std::string{kRabbit} + "mandatory = \"yes\""), "sinks.default.mandatory",
              "expected a boolean (true or false), got string");
  ExpectError(WithSink(std::string{kRabbit} + "confirm_window = [1]"),
              "sinks.default.confirm_window", "expected an integer, got array");
  ExpectError(std::string{kMinimal} + "[retry]\nmultiplier = \"2\"\n", "retry.multiplier",
              "expected a number, got string");
  ExpectError("relay = 5\n" + std::string{kMinimal}, "relay", "expected a table, got integer");
  ExpectError("database = \"x\"\n", "database", "expected a table, got string");
  ExpectError("[database]\nurl = \"x\"\n[sinks]\ndefault = 1\n", "sinks.default",
              "expected a table");
  ExpectError("sinks = [1]\n[database]\nurl = \"x\"\n", "sinks", "expected a table, got array");
  ExpectError(std::string{kMinimal} + "[log]\nlevel = 1979-05-27T07:32:00Z\n", "log.level",
              "expected a string, got date-time");
}

// ---- Ranges and choices ----

TEST(ConfigTest, OutOfRangeValuesAreRejected) {
  ExpectError(WithRelay("batch_size = 0"), "relay.batch_size", "between 1 and 10000, got 0");
  ExpectError(WithRelay("batch_size = 10001"), "relay.batch_size", "got 10001");
  ExpectError(WithRelay("instance = \"\""), "relay.instance", "must be 1 to 255 bytes");
  ExpectError(WithRelay("lease = \"500ms\""), "relay.lease", "between 1s and 1d");
  ExpectError(WithRelay("lease = \"10s\"\npublish_timeout = \"5001ms\""), "relay.publish_timeout",
              "at most half of relay.lease (10s), got 5001ms");
  ExpectError(WithRelay("min_backoff = \"1s\"\nmax_backoff = \"500ms\""), "relay.max_backoff",
              "at least relay.min_backoff");
  ExpectError(WithRelay("lease = \"1m\"\nidle_lease = \"59s\""), "relay.idle_lease",
              "must be at least relay.lease (1m), got 59s");
  ExpectError(WithRelay("idle_lease = \"2d\""), "relay.idle_lease", "between 1s and 1d");
  ExpectError(WithRelay("idle_lease = 30"), "relay.idle_lease", "expected");
  ExpectError(WithSink(std::string{kRabbit} + "confirm_window = 0"), "sinks.default.confirm_window",
              "between 1 and 100000, got 0");
  ExpectError(WithSink(std::string{kRabbit} + "max_message_bytes = -1"),
              "sinks.default.max_message_bytes", "got -1");
  ExpectError(WithSink(std::string{kRabbit} + "heartbeat = \"1500ms\""), "sinks.default.heartbeat",
              "whole number of seconds");
  ExpectError(std::string{kMinimal} + "[retry]\njitter = 1.0\n", "retry.jitter",
              "must be in [0, 1)");
  ExpectError(std::string{kMinimal} + "[retry]\ninitial_delay = \"10s\"\nmax_delay = \"1s\"\n",
              "retry.max_delay", "must be at least initial_delay");
  ExpectError(std::string{kMinimal} + "[retry]\nmultiplier = 0.5\n", "retry.multiplier",
              "must be a finite number >= 1");
  ExpectError(std::string{kMinimal} + "[retry]\nmultiplier = nan\n", "retry.multiplier",
              "must be a finite number >= 1");
  ExpectError(std::string{kMinimal} + "[retry]\nmax_attempts = 0\n", "retry.max_attempts",
              "between 1 and");
  ExpectError(std::string{kMinimal} + "[retention]\npublished = \"1500ms\"\n",
              "retention.published", "whole number of seconds");
  ExpectError(
      std::string{kMinimal} + "[log]\nlevel = \"verbose\"\n", "log.level",
      "must be one of \"trace\", \"debug\", \"info\", \"warn\", \"error\"; got \"verbose\"");
  ExpectError(std::string{kMinimal} + "[log]\nformat = \"xml\"\n", "log.format", "\"json\"");
  ExpectError("[database]\nurl = \"x\"\nschema = \"Outbox\"\n[sinks.default]\ntype = \"file\"\n",
              "database.schema", "plain lower-case identifier");
  ExpectError("[database]\nurl = \"x\"\nmode = \"logical\"\n[sinks.default]\ntype = \"file\"\n",
              "database.mode", "must be \"table\" or \"wal\", got \"logical\"");
  ExpectError("[database]\nurl = \"x\"\nmode = 1\n[sinks.default]\ntype = \"file\"\n",
              "database.mode", "");
  ExpectError(WithSink("type = \"file\"\npath = \"\""), "sinks.default.path",
              "must be a file path");
}

TEST(ConfigTest, RabbitTemplatesAndTopologyAreChecked) {
  ExpectError(WithSink(std::string{kRabbit} + "routing_key = \"{topik}\""),
              "sinks.default.routing_key", "unknown placeholder '{topik}'");
  ExpectError(WithSink(std::string{kRabbit} + "routing_key = \"{topic\""),
              "sinks.default.routing_key", "unterminated '{' at offset 0");
  ExpectError(WithSink(std::string{kRabbit} + "exchange = \"a}\""), "sinks.default.exchange",
              "unexpected '}' at offset 1");
  ExpectError(WithSink(std::string{kRabbit} + "exchange = \"" + std::string(256, 'x') + "\""),
              "sinks.default.exchange", "at most 255 bytes");
  ExpectError(WithSink(std::string{kRabbit} + "declare_exchange_type = \"topic\""),
              "sinks.default.exchange", "plain, non-empty name");
  ExpectError(WithSink(std::string{kRabbit} + "declare_exchange_type = \"x-delayed\""),
              "sinks.default.declare_exchange_type", "must be one of");
  ExpectError(WithSink("type = \"rabbitmq\"\nurl = \"amqps://mq/\""), "sinks.default.url",
              "amqps:// (TLS) is not supported yet");
  ExpectError(WithSink("type = \"rabbitmq\"\nurl = \"http://u:secret@mq/\""), "sinks.default.url",
              "expected an amqp:// URL, got \"http://u:***@mq/\"");
}

// ---- Durations ----

TEST(ConfigTest, DurationsAreStringsWithAUnit) {
  EXPECT_EQ(Parse(WithRelay("lease = \"1h\"\npublish_timeout = \"30m\"")).relay.publish_timeout,
            std::chrono::minutes{30});
  ExpectError(WithRelay("lease = 30"), "relay.lease",
              "expected a duration such as \"250ms\", \"30s\", \"5m\", \"1h\" or \"7d\" (a "
              "string), got integer");
  for (const char* bad :
       {"30", "30 s", "1.5s", "-1s", "30sec", "s", "", "1h30m", "99999999999999s"}) {
    ExpectError(WithRelay(std::string{"lease = \""} + bad + "\""), "relay.lease",
                std::string{"got \""} + bad + "\"");
  }
  // The linger is bounded: at most 1 s, and less than half of the lease.
  ExpectError(WithRelay("linger = \"2s\""), "relay.linger", "got \"2s\"");
  ExpectError(WithRelay("linger = \"-1ms\""), "relay.linger", "got \"-1ms\"");
  ExpectError(WithRelay("lease = \"1s\"\npublish_timeout = \"100ms\"\nlinger = \"500ms\""),
              "relay.linger", "must be less than half of relay.lease");
}

// ---- Sinks ----

TEST(ConfigTest, SinkTypeIsRequiredAndKnown) {
  ExpectError(WithSink("type = \"pulsar\""), "sinks.default.type",
              "unknown sink type \"pulsar\"; expected \"rabbitmq\", \"file\", \"kafka\", "
              "\"nats\", \"redis\", \"http\" or \"amqp10\"");
  ExpectError(WithSink("path = \"-\""), "sinks.default.type", "is required");
  ExpectError(WithSink("type = 1"), "sinks.default.type", "expected a string, got integer");
  ExpectError("[database]\nurl = \"x\"\n", "sinks", "at least one sink is required");
  ExpectError("[database]\nurl = \"x\"\n[sinks]\n", "sinks", "at least one sink is required");
  ExpectError("[database]\nurl = \"x\"\n[sinks.\"a.b\"]\ntype = \"file\"\n", "sinks.a.b",
              "a sink name must be");
  ExpectError(
      "[database]\nurl = \"x\"\n[sinks.a-b]\ntype = \"file\"\n[sinks.a_b]\ntype = \"file\"\n",
      "sinks.a_b", "OUTBOX_SINK_A_B_URL is also that of sink \"a-b\"");
}

// ---- Required keys and the environment ----

TEST(ConfigTest, RequiredKeysAreNamed) {
  ExpectError("[sinks.default]\ntype = \"file\"\n", "database.url",
              "is required (or set OUTBOX_DATABASE_URL)");
  ExpectError("[database]\nurl = \"\"\n[sinks.default]\ntype = \"file\"\n", "database.url",
              "is required");
  ExpectError(WithSink("type = \"rabbitmq\""), "sinks.default.url",
              "is required (or set OUTBOX_SINK_DEFAULT_URL)");
  ExpectError("[database]\nurl = \"x\"\n[sinks.audit-log]\ntype = \"rabbitmq\"\n",
              "sinks.audit-log.url", "OUTBOX_SINK_AUDIT_LOG_URL");
}

TEST(ConfigTest, EnvironmentOverridesWin) {
  const Env env{{"OUTBOX_DATABASE_URL", "postgresql://env@db/app"},
                {"OUTBOX_SINK_AUDIT_LOG_URL", "amqp://env:pw@mq/"}};
  // Without the keys in the file.
  Config config = Parse("[sinks.audit-log]\ntype = \"rabbitmq\"\n", env);
  EXPECT_EQ(Pg(config).url(), "postgresql://env@db/app");
  EXPECT_EQ(Rabbit(config.sinks[0]).url, "amqp://env:pw@mq/");
  // Over the keys in the file.
  config = Parse(
      "[database]\nurl = \"postgresql://file@db/app\"\n"
      "[sinks.audit-log]\ntype = \"rabbitmq\"\nurl = \"amqp://file@mq/\"\n",
      env);
  EXPECT_EQ(Pg(config).url(), "postgresql://env@db/app");
  EXPECT_EQ(Rabbit(config.sinks[0]).url, "amqp://env:pw@mq/");
  // Empty variables are unset.
  config = Parse(kMinimal, {{"OUTBOX_DATABASE_URL", ""}});
  EXPECT_EQ(Pg(config).url(), "postgresql://outbox@db/app");
  // A bad value from the environment is named as such.
  ExpectError(WithSink("type = \"rabbitmq\""), "sinks.default.url",
              "(from OUTBOX_SINK_DEFAULT_URL)", {{"OUTBOX_SINK_DEFAULT_URL", "nats://mq"}});
}

// ---- [database] type ----

constexpr std::string_view kSqlite = R"(
[database]
type = "sqlite"
path = "/var/lib/app/app.db"

[sinks.default]
type = "file"
)";

TEST(ConfigTest, DatabaseTypeDefaultsToPostgres) {
  const Config config = Parse(kMinimal);
  EXPECT_EQ(config.database_type, "postgres");
  EXPECT_EQ(Pg(config).url(), "postgresql://outbox@db/app");
  const Config explicit_type = Parse(
      "[database]\ntype = \"postgres\"\nurl = \"postgresql://db/app\"\n"
      "[sinks.default]\ntype = \"file\"\n");
  EXPECT_EQ(explicit_type.database_type, "postgres");
  EXPECT_EQ(Pg(explicit_type).url(), "postgresql://db/app");
}

TEST(ConfigTest, SqliteNeedsAPathAndNoUrl) {
  const Config config = Parse(kSqlite);
  EXPECT_EQ(config.database_type, "sqlite");
  EXPECT_EQ(Lite(config).path(), "/var/lib/app/app.db");
  // Writers in other processes cannot wake the relay: it looks every second by default.
  EXPECT_EQ(config.relay.sweep_interval, milliseconds{1000});
  // The listener serves SQLite too: on by default, as with PostgreSQL.
  EXPECT_EQ(config.http.listen, HttpConfig{}.listen);
  // OUTBOX_DATABASE_URL may be set for other tools; it does not apply to a SQLite file.
  const Config with_env = Parse(kSqlite, {{"OUTBOX_DATABASE_URL", "postgresql://env@db/app"}});
  EXPECT_EQ(with_env.database_type, "sqlite");
  EXPECT_EQ(Lite(with_env).path(), "/var/lib/app/app.db");

  const std::string sink = "[sinks.default]\ntype = \"file\"\n";
  ExpectError("[database]\ntype = \"sqlite\"\n" + sink, "database.path",
              "is required with type = \"sqlite\"");
  ExpectError("[database]\ntype = \"sqlite\"\npath = \"\"\n" + sink, "database.path",
              "must be a file path");
  ExpectError("[database]\ntype = \"sqlite\"\npath = 7\n" + sink, "database.path",
              "expected a string, got integer");
  ExpectError(
      "[database]\ntype = \"sqlite\"\npath = \"a.db\"\nurl = \"postgresql://db/app\"\n" + sink,
      "database.url", "is for type = \"postgres\"; a \"sqlite\" database is named by");
  ExpectError("[database]\ntype = \"sqlite\"\npath = \"a.db\"\nschema = \"outbox\"\n" + sink,
              "database.schema", "is for type = \"postgres\"");
  ExpectError("[database]\nurl = \"postgresql://db/app\"\npath = \"a.db\"\n" + sink,
              "database.path", "is only for type = \"sqlite\"");
  ExpectError("[database]\ntype = \"mysql\"\nurl = \"x\"\n" + sink, "database.type",
              "unknown store type \"mysql\"; expected \"postgres\", \"sqlite\" or \"mariadb\"");
  ExpectError("[database]\ntype = \"sqlite\"\npaht = \"a.db\"\n" + sink, "database.paht",
              "did you mean \"database.path\"");
}

TEST(ConfigTest, SqliteServesTheHttpListenerToo) {
  const Config on = Parse(std::string{kSqlite} + "[http]\nlisten = \"127.0.0.1:9781\"\n");
  EXPECT_EQ(on.http.listen, "127.0.0.1:9781");
  EXPECT_EQ(Parse(kSqlite).http.listen, HttpConfig{}.listen);
  const Config off = Parse(std::string{kSqlite} + "[http]\nlisten = \"\"\n");
  EXPECT_EQ(off.http.listen, "");
}

TEST(ConfigTest, SqliteDescribeParsesBack) {
  const std::string described = Describe(Parse(kSqlite));
  EXPECT_NE(described.find("type = \"sqlite\"\npath = \"/var/lib/app/app.db\"\n"),
            std::string::npos)
      << described;
  EXPECT_EQ(described.find("url = "), std::string::npos) << described;
  EXPECT_EQ(described.find("schema = "), std::string::npos) << described;
  EXPECT_EQ(Describe(Parse(described)), described);
}

// ---- [database] type = "mariadb" (issue #45): read and checked without a server ----

constexpr std::string_view kMariaDb = R"(
[database]
type = "mariadb"
url = "mariadb://outbox:s%3Acret@db:3307/app?connect_timeout=5"

[sinks.default]
type = "file"
)";

const mariadb::StoreSettings& Maria(const Config& config) {
  return dynamic_cast<const mariadb::StoreSettings&>(*config.database);
}

TEST(ConfigTest, MariaDbTakesAUrlASchemaAndADeadline) {
  const Config config = Parse(kMariaDb);
  EXPECT_EQ(config.database_type, "mariadb");
  EXPECT_EQ(Maria(config).url(), "mariadb://outbox:s%3Acret@db:3307/app?connect_timeout=5");
  EXPECT_EQ(Maria(config).schema(), "outbox");
  EXPECT_EQ(Maria(config).statement_deadline(), seconds{15});
  EXPECT_EQ(config.database->Description(), "MariaDB database outbox on db:3307");
  // The poll wakes the relay for every new message; the sweep is for what it cannot see.
  EXPECT_EQ(config.relay.sweep_interval, seconds{5});
  const Config mysql = Parse(
      "[database]\ntype = \"mariadb\"\nurl = \"mysql://u@h/app\"\nschema = \"Outbox_2\"\n"
      "statement_deadline = \"2m\"\nmode = \"table\"\n[sinks.default]\ntype = \"file\"\n");
  EXPECT_EQ(Maria(mysql).schema(), "Outbox_2");
  EXPECT_EQ(Maria(mysql).statement_deadline(), seconds{120});
  EXPECT_EQ(Maria(config).idle_poll(), std::chrono::milliseconds{200});
  EXPECT_EQ(Maria(Parse("[database]\ntype = \"mariadb\"\nurl = \"mysql://u@h/app\"\n"
                        "idle_poll = \"50ms\"\n[sinks.default]\ntype = \"file\"\n"))
                .idle_poll(),
            std::chrono::milliseconds{50});
  // The environment's url wins, as for PostgreSQL.
  const Config from_env = Parse(kMariaDb, {{"OUTBOX_DATABASE_URL", "mysql://env@h2/app"}});
  EXPECT_EQ(Maria(from_env).url(), "mysql://env@h2/app");
}

TEST(ConfigTest, MariaDbDescribeMasksThePasswordAndParsesBack) {
  const Config config = Parse(kMariaDb);
  const std::string described = Describe(config);
  EXPECT_NE(described.find("type = \"mariadb\"\nurl = "
                           "\"mariadb://outbox:***@db:3307/app?connect_timeout=5\"\n"
                           "schema = \"outbox\"\nmode = \"table\"\nstatement_deadline = \"15s\"\n"
                           "idle_poll = \"200ms\"\n"),
            std::string::npos)
      << described;
  EXPECT_EQ(described.find("cret"), std::string::npos) << described;
  EXPECT_EQ(Describe(Parse(described)), described);
  // The password as the server may quote it back (decoded) and as written.
  EXPECT_EQ(config.database->Secrets(), (std::vector<std::string>{"s:cret", "s%3Acret"}));
  EXPECT_TRUE(Parse("[database]\ntype = \"mariadb\"\nurl = \"mariadb://h/app\"\n"
                    "[sinks.default]\ntype = \"file\"\n")
                  .database->Secrets()
                  .empty());
}

TEST(ConfigTest, MariaDbRefusesBadTablesNamingTheKey) {
  const std::string sink = "[sinks.default]\ntype = \"file\"\n";
  const std::string head = "[database]\ntype = \"mariadb\"\n";
  const std::string url = "url = \"mariadb://u:pw@h/app\"\n";
  ExpectError(head + sink, "database.url", "is required (or set OUTBOX_DATABASE_URL)");
  ExpectError(head + "url = \"postgresql://u:pw@h/app\"\n" + sink, "database.url",
              "must start with mariadb:// or mysql://");
  ExpectError(head + "url = \"mariadb://u:pw@h:99999/app\"\n" + sink, "database.url",
              "bad port '99999'");
  ExpectError(head + "url = \"mariadb://u:pw@h/app?sslmode=require\"\n" + sink, "database.url",
              "unknown URL option 'sslmode'");
  ExpectError(head + sink, "database.url", "(from OUTBOX_DATABASE_URL) the URL must start with",
              {{"OUTBOX_DATABASE_URL", "postgres://u:pw@h/app"}});
  ExpectError(head + url + "mode = \"wal\"\n" + sink, "database.mode", "MariaDB has no WAL mode");
  ExpectError(head + url + "mode = \"fast\"\n" + sink, "database.mode",
              "must be \"table\" (MariaDB's only mode), got \"fast\"");
  ExpectError(head + url + "schema = \"out-box\"\n" + sink, "database.schema",
              "must be a plain identifier");
  ExpectError(head + url + "schema = \"\"\n" + sink, "database.schema",
              "must be a plain identifier");
  ExpectError(head + url + "path = \"a.db\"\n" + sink, "database.path",
              "is only for type = \"sqlite\"");
  ExpectError(head + url + "shema = \"x\"\n" + sink, "database.shema",
              "did you mean \"database.schema\"");
  ExpectError(head + url + "statement_deadline = \"0s\"\n" + sink, "database.statement_deadline",
              "must be at least 1s");
  ExpectError(head + url + "statement_deadline = \"2h\"\n" + sink, "database.statement_deadline",
              "");
  ExpectError(head + url + "idle_poll = \"1ms\"\n" + sink, "database.idle_poll",
              "must be between 5ms and 1m");
  ExpectError(head + url + "idle_poll = 100\n" + sink, "database.idle_poll", "(a string)");
  // No message quotes the password.
  for (const std::string bad : {"url = \"postgresql://u:pw-secret@h/app\"\n",
                                "url = \"mariadb://u:pw-secret@h:0/app\"\n"}) {
    try {
      Parse(head + bad + sink);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const ConfigError& error) {
      EXPECT_EQ(std::string{error.what()}.find("pw-secret"), std::string::npos) << error.what();
    }
  }
}

// ---- [http] ----

TEST(ConfigTest, HttpDefaultsToLoopbackWithoutToken) {
  const Config config = Parse(kMinimal);
  EXPECT_EQ(config.http.listen, "127.0.0.1:9780");
  EXPECT_EQ(config.http.host(), "127.0.0.1");
  EXPECT_EQ(config.http.port(), 9780);
  EXPECT_EQ(config.http.token, "");
  EXPECT_EQ(config.http.stats_interval, seconds{5});
  EXPECT_EQ(config.http.ready_max_age, seconds{15});
}

TEST(ConfigTest, HttpValuesAreRead) {
  Config config = Parse(std::string{kMinimal} +
                        "[http]\nlisten = \"[::1]:8080\"\ntoken = \"abc.DEF-123_~+/=\"\n"
                        "stats_interval = \"1s\"\nready_max_age = \"2s\"\n");
  EXPECT_EQ(config.http.host(), "::1");
  EXPECT_EQ(config.http.port(), 8080);
  EXPECT_EQ(config.http.token, "abc.DEF-123_~+/=");
  EXPECT_EQ(config.http.stats_interval, seconds{1});
  EXPECT_EQ(config.http.ready_max_age, seconds{2});
  config = Parse(std::string{kMinimal} + "[http]\nlisten = \"\"\n");
  EXPECT_EQ(config.http.listen, "");
  config = Parse(std::string{kMinimal} + "[http]\nlisten = \"localhost:1\"\n");
  EXPECT_EQ(config.http.host(), "localhost");
  EXPECT_EQ(config.http.port(), 1);
}

TEST(ConfigTest, HttpSettingsAreValidated) {
  const std::string http = std::string{kMinimal} + "[http]\n";
  for (const std::string listen :
       {"9780", ":9780", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:80x", "::1:9780",
        "[::1", "[]:80", "a b:80", "127.0.0.1:-1"}) {
    ExpectError(http + "listen = \"" + listen + "\"\n", "http.listen", "expected \"host:port\"");
  }
  ExpectError(http + "listen = 9780\n", "http.listen", "expected a string");
  ExpectError(http + "lisen = \"\"\n", "http.lisen", "did you mean \"http.listen\"");
  ExpectError(http + "token = \"has space\"\n", "http.token", "printable ASCII without spaces");
  ExpectError(http + "token = \"" + std::string(257, 'x') + "\"\n", "http.token", "at most 256");
  ExpectError(http + "stats_interval = \"10ms\"\n", "http.stats_interval", "between 100ms");
  ExpectError(http + "stats_interval = \"10s\"\n", "http.ready_max_age",
              "at least twice http.stats_interval (10s), got 15s");
  ExpectError(http + "ready_max_age = \"9s\"\n", "http.ready_max_age", "at least twice");
}

TEST(ConfigTest, HttpTokenComesFromTheEnvironmentAndIsNeverShown) {
  const std::string file_token = std::string{kMinimal} + "[http]\ntoken = \"tok-file-1\"\n";
  Config config = Parse(file_token, {{"OUTBOX_HTTP_TOKEN", "tok-env-1"}});
  EXPECT_EQ(config.http.token, "tok-env-1");
  config = Parse(file_token, {{"OUTBOX_HTTP_TOKEN", ""}});
  EXPECT_EQ(config.http.token, "tok-file-1");
  const std::string described = Describe(config);
  EXPECT_EQ(described.find("tok-"), std::string::npos) << described;
  EXPECT_NE(described.find("[http]\nlisten = \"127.0.0.1:9780\"\ntoken = \"***\"\n"),
            std::string::npos)
      << described;
  EXPECT_NE(Describe(Parse(kMinimal)).find("token = \"\"\n"), std::string::npos);
  // A bad token is refused without being quoted.
  try {
    Parse(kMinimal, {{"OUTBOX_HTTP_TOKEN", "zz9 bad"}});
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key(), "http.token");
    EXPECT_EQ(std::string{error.what()}.find("zz9"), std::string::npos) << error.what();
    EXPECT_NE(std::string{error.what()}.find("(from OUTBOX_HTTP_TOKEN)"), std::string::npos);
  }
}

// Beyond loopback, the listener needs a token or an explicit allow_unauthenticated = true.
TEST(ConfigTest, ListeningBeyondLoopbackWithoutATokenIsRefused) {
  const std::string http = std::string{kMinimal} + "[http]\n";  // listen on line 8
  for (const char* listen :
       {"0.0.0.0:9780", "[::]:9780", "10.1.2.3:80", "[fe80::1]:80", "[::ffff:10.0.0.1]:80",
        "metrics.example:9780", "128.0.0.1:1", "0:9780", "localhost.example:1"}) {
    SCOPED_TRACE(listen);
    const std::string text = http + "listen = \"" + listen + "\"\n";
    ExpectError(text, "http.listen", "listens beyond loopback without a token");
    ExpectError(text, "http.listen", "OUTBOX_HTTP_TOKEN");
    ExpectError(text, "http.listen", "allow_unauthenticated = true");
    ExpectError(text, "http.listen", "(test.toml:8)");
    // Either fix is accepted.
    Config config = Parse(text + "allow_unauthenticated = true\n");
    EXPECT_TRUE(config.http.allow_unauthenticated);
    EXPECT_TRUE(config.http.listens_beyond_loopback());
    config = Parse(text + "token = \"t0k\"\n");
    EXPECT_FALSE(config.http.allow_unauthenticated);
    config = Parse(text, {{"OUTBOX_HTTP_TOKEN", "t0k-env"}});
    EXPECT_EQ(config.http.token, "t0k-env");
    // An empty variable is no token; false is the default.
    ExpectError(text, "http.listen", "without a token", {{"OUTBOX_HTTP_TOKEN", ""}});
    ExpectError(text + "allow_unauthenticated = false\n", "http.listen", "without a token");
  }
  // Loopback (and a listener that is off) needs neither.
  for (const char* listen : {"127.0.0.1:9780", "127.9.8.7:1", "[::1]:9780", "localhost:9780",
                             "LocalHost:9780", "[::ffff:127.0.0.1]:9780", "127.1:9780", ""}) {
    SCOPED_TRACE(listen);
    const Config config = Parse(http + "listen = \"" + listen + "\"\n");
    EXPECT_FALSE(config.http.listens_beyond_loopback());
    EXPECT_FALSE(config.http.allow_unauthenticated);
  }
  EXPECT_FALSE(Parse(kMinimal).http.listens_beyond_loopback());
  ExpectError(http + "allow_unauthenticated = \"yes\"\n", "http.allow_unauthenticated",
              "expected a boolean (true or false), got string");
  ExpectError(http + "allow_unauthenticated = 1\n", "http.allow_unauthenticated",
              "expected a boolean");
  // --check-config shows the setting, and it parses back.
  const std::string described =
      Describe(Parse(http + "listen = \"0.0.0.0:9780\"\nallow_unauthenticated = true\n"));
  EXPECT_NE(described.find("token = \"\"\nallow_unauthenticated = true\n"), std::string::npos)
      << described;
  EXPECT_EQ(Describe(Parse(described)), described);
  EXPECT_NE(Describe(Parse(kMinimal)).find("allow_unauthenticated = false\n"), std::string::npos);
}

// ---- Files ----

class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "outbox_config_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, std::string_view text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  std::filesystem::path dir_;
};

void ExpectFileError(const std::string& path, const std::string& fragment) {
  try {
    LoadConfig(path, FakeEnv({}));
    ADD_FAILURE() << "no error for " << path;
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key(), "file") << error.what();
    EXPECT_NE(std::string{error.what()}.find(fragment), std::string::npos)
        << "'" << error.what() << "' lacks '" << fragment << "'";
  }
}

TEST_F(ConfigFileTest, UnreadableAndMalformedFilesAreFileErrors) {
  ExpectFileError((dir_ / "missing.toml").string(), "No such file or directory");
  ExpectFileError(dir_.string(), "it is a directory, not a regular file");
  const std::string bad = Write("bad.toml", "[database]\nurl = \"x\"\n\n[relay\nbatch_size = 1\n");
  ExpectFileError(bad, "bad.toml is not valid TOML");
  ExpectFileError(bad, " 4 | [relay");  // toml11 shows the line, numbered
  const std::string duplicate = Write("dup.toml", "[relay]\nlease = \"1s\"\nlease = \"2s\"\n");
  ExpectFileError(duplicate, " 3 | lease = \"2s\"");
}

// What is not a regular file is refused before anything is read: /dev/zero never ends, a FIFO
// nobody writes never answers.
TEST_F(ConfigFileTest, OnlyRegularFilesAreRead) {
  const auto started = std::chrono::steady_clock::now();
  ExpectFileError("/dev/zero",
                  "cannot read /dev/zero: it is a character device, not a regular file");
  const std::string fifo = (dir_ / "fifo.toml").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ExpectFileError(fifo, "it is a FIFO, not a regular file");
  ExpectFileError(dir_.string(), "it is a directory, not a regular file");
  // Through a symbolic link, the file it names counts.
  std::filesystem::create_symlink("/dev/zero", dir_ / "zero.toml");
  ExpectFileError((dir_ / "zero.toml").string(), "it is a character device");
  std::filesystem::create_symlink(Write("ok.toml", kMinimal), dir_ / "link.toml");
  EXPECT_NO_THROW(LoadConfig((dir_ / "link.toml").string(), FakeEnv({})));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds{5});
}

TEST_F(ConfigFileTest, FilesOverOneMebibyteAreRefused) {
  ASSERT_EQ(kMaxConfigBytes, 1048576U);
  // Exactly 1 MiB (a valid file padded with a comment) loads; one byte more does not.
  std::string text = std::string{kMinimal} + "# ";
  text += std::string(kMaxConfigBytes - text.size() - 1, 'x') + "\n";
  ASSERT_EQ(text.size(), kMaxConfigBytes);
  EXPECT_NO_THROW(LoadConfig(Write("max.toml", text), FakeEnv({})));
  ExpectFileError(Write("over.toml", text + "\n"),
                  "over.toml is 1048577 bytes; a configuration file may have at most 1 MiB");
  ExpectFileError(Write("big.toml", std::string(2 * kMaxConfigBytes, '#')), "is 2097152 bytes");
  // The same limit holds for text handed to ParseConfig.
  ExpectError(text + "\n", "file", "test.toml is 1048577 bytes");
}

// The real program: a FIFO, /dev/zero or a file nested too deep as --config ends it at once
// with exit code 2 and the reason.
TEST_F(ConfigFileTest, OutboxdExitsWithTwoOnAFileItRefuses) {
  const std::string fifo = (dir_ / "fifo.toml").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string deep = Write("deep.toml", "level = " + std::string(100000, '[') + "\n");
  const std::string log = (dir_ / "outboxd.log").string();
  for (const std::string& path : {fifo, std::string{"/dev/zero"}, deep}) {
    SCOPED_TRACE(path);
    for (const bool check : {true, false}) {
      std::vector<std::string> argv{OUTBOXD_PATH, "--config", path};
      if (check) argv.emplace_back("--check-config");
      testing::ChildProcess outboxd(argv, log);
      EXPECT_EQ(outboxd.Wait(std::chrono::seconds{20}), 2);
    }
  }
  std::ifstream in(log);
  std::stringstream output;
  output << in.rdbuf();
  EXPECT_NE(output.str().find("it is a FIFO, not a regular file"), std::string::npos)
      << output.str();
  EXPECT_NE(output.str().find("it is a character device, not a regular file"), std::string::npos)
      << output.str();
  EXPECT_NE(output.str().find("deep.toml:1: nested more than 32 levels deep"), std::string::npos)
      << output.str();
}

// --check-config and a start refuse the same configurations: a start runs the checks that
// --check-config runs (sinks, relay options, metric families) before it opens anything else.
// Relay::CheckOptions read "less than half of relay.lease" as linger < lease / 2, rounded down,
// where the file's check reads linger * 2 < lease: with lease = 1001ms and linger = 500ms,
// --check-config said valid and the start exited 2 ("relay.linger: must be ...").
TEST_F(ConfigFileTest, CheckConfigAndAStartGiveTheSameVerdict) {
  const std::string log = (dir_ / "outboxd.log").string();
  const auto read_log = [&] {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  struct Case {
    std::string lease;
    std::string linger;
    bool valid;
  };
  for (const Case& at : {Case{"1001ms", "500ms", true}, Case{"1001ms", "501ms", false},
                         Case{"1000ms", "500ms", false}, Case{"1000ms", "499ms", true}}) {
    SCOPED_TRACE("lease " + at.lease + ", linger " + at.linger);
    std::filesystem::remove(log);
    const std::string path = Write(
        "edge.toml", "[database]\ntype = \"sqlite\"\npath = \"" + (dir_ / "app.db").string() +
                         "\"\n[relay]\nlease = \"" + at.lease + "\"\nlinger = \"" + at.linger +
                         "\"\npublish_timeout = \"400ms\"\n[http]\nlisten = \"\"\n"
                         "[sinks.default]\ntype = \"file\"\npath = \"" +
                         (dir_ / "events.jsonl").string() + "\"\n");
    testing::ChildProcess check({OUTBOXD_PATH, "--config", path, "--check-config"}, log);
    EXPECT_EQ(check.Wait(std::chrono::seconds{20}), at.valid ? 0 : 2) << read_log();
    testing::ChildProcess start({OUTBOXD_PATH, "--config", path}, log);
    if (!at.valid) {
      EXPECT_EQ(start.Wait(std::chrono::seconds{20}), 2) << read_log();
      continue;
    }
    // It runs: it says so, and stops cleanly on SIGTERM.
    for (int i = 0; i < 200 && read_log().find("relaying") == std::string::npos; ++i) {
      std::this_thread::sleep_for(milliseconds{50});
    }
    EXPECT_NE(read_log().find("relaying"), std::string::npos) << read_log();
    start.Signal(SIGTERM);
    EXPECT_EQ(start.Wait(std::chrono::seconds{20}), 0) << read_log();
  }
}

TEST_F(ConfigFileTest, LoadsAFile) {
  const Config config = LoadConfig(Write("ok.toml", kMinimal), FakeEnv({}));
  EXPECT_EQ(Pg(config).url(), "postgresql://outbox@db/app");
}

TEST_F(ConfigFileTest, ErrorLocationsNameTheFileAndLine) {
  const std::string path = Write("where.toml", WithRelay("batch_size = 0"));
  try {
    LoadConfig(path, FakeEnv({}));
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key(), "relay.batch_size");
    EXPECT_NE(std::string{error.what()}.find("where.toml:9)"), std::string::npos) << error.what();
  }
}

// ---- Hostile text: deep nesting, huge values ----

// toml11 recurses once per level: 100,000 levels overflowed the stack (SIGSEGV).
TEST(ConfigTest, NestingDeeperThanTheLimitIsRefused) {
  constexpr std::size_t kDeep = 100000;
  const std::string head = std::string{kMinimal} + "[relay]\n";  // then line 8
  ExpectError(head + "level = " + std::string(kDeep, '[') + std::string(kDeep, ']'), "file",
              "test.toml:8: nested more than 32 levels deep");
  ExpectError(head + "level = " + std::string(kDeep, '['), "file",
              "test.toml:8: nested more than 32 levels deep");
  std::string tables = head + "level = ";
  for (std::size_t i = 0; i < kDeep; ++i) tables += "{a = ";
  ExpectError(tables + "1" + std::string(kDeep, '}'), "file", "nested more than 32");
  std::string mixed = head + "level = ";
  for (std::size_t i = 0; i < kDeep; ++i) mixed += "[{a = ";
  ExpectError(mixed, "file", "nested more than 32");
  // Across lines, and as table headers and dotted keys (each part is a table more).
  std::string lines = head + "level = [\n";
  for (std::size_t i = 0; i < 40; ++i) lines += " [ # a comment ]]]\n";
  ExpectError(lines, "file", "test.toml:39: nested more than 32");
  std::string dotted = head;
  for (std::size_t i = 0; i < kDeep; ++i) dotted += "a.";
  ExpectError(dotted + "b = 1\n", "file", "test.toml:8: nested more than 32");
  std::string header = std::string{kMinimal} + "[a";
  for (std::size_t i = 0; i < kDeep; ++i) header += ".a";
  ExpectError(header + "]\n", "file", "nested more than 32");
  std::string array_tables = std::string{kMinimal} + "[[a";
  for (std::size_t i = 0; i < kDeep; ++i) array_tables += ".\"a\"";
  ExpectError(array_tables + "]]\n", "file", "nested more than 32");
  std::string inline_dotted = head + "level = {";
  for (std::size_t i = 0; i < kDeep; ++i) inline_dotted += "a.";
  ExpectError(inline_dotted + "b = 1}\n", "file", "nested more than 32");
  // A value on the next line is still counted (toml11 refuses it, but after the scan).
  ExpectError(head + "level =\n" + std::string(kDeep, '['), "file", "nested more than 32");
}

TEST(ConfigTest, NestingUpToTheLimitIsParsed) {
  // 32 levels: [relay] and 31 arrays. It gets as far as the check of [relay]'s keys.
  const std::string head = std::string{kMinimal} + "[relay]\n";
  ExpectError(head + "level = " + std::string(31, '[') + std::string(31, ']') + "\n", "relay.level",
              "unknown key");
  ExpectError(head + "level = " + std::string(32, '[') + std::string(32, ']') + "\n", "file",
              "nested more than 32");
  // Siblings do not add up.
  std::string wide = head + "level = [";
  for (int i = 0; i < 100; ++i) wide += "[[1.5], {a.b = [2]}, {c = 3, d.e.f = 4}], ";
  ExpectError(wide + "]\n", "relay.level", "unknown key");
  // Brackets in strings and comments are text; after a string they count again.
  const std::string b(40, '[');
  const std::vector<std::string> strings{
      "\"" + b + "\\\"" + b + "\"",              // "[[…\"[[…"
      "'" + b + "\\'",                           // '[[…\' (a literal string has no escapes)
      "\"\"\"" + b + "\n" + b + "\\\"\"\"\"\"",  // """[[…\n[[…\"""" (ends in two quotes)
      "'''" + b + "\n" + b + "''''",             // '''[[…\n[[…'''' (ends in a quote)
      "\"{{{{.....\"",
      "\"\"",
      "''"};
  for (const std::string& text : strings) {
    SCOPED_TRACE(text);
    ExpectError(head + "level = [" + text + ", # " + b + "\n" + text + "]\n", "relay.level",
                "unknown key");
    ExpectError(head + "level = [" + text + ", " + b + "\n", "file", "nested more than 32");
  }
  ExpectError(head + "\"" + b + "\" = 1\n", "relay." + b, "unknown key");
  // A password with brackets is just a password.
  const std::string url = "postgresql://u:" + std::string(100, '[') + "@db/app";
  const Config config =
      Parse("[database]\nurl = \"" + url + "\"\n[sinks.default]\ntype = \"file\"\n");
  EXPECT_EQ(Pg(config).url(), url);
}

// toml11 scans a value's whole line (and the '#' lines above it) for every value: a 1 MiB line
// of values took it minutes. Such text is refused at once; ordinary arrays are not.
TEST(ConfigTest, ManyValuesOnLongLinesAreRefused) {
  const std::string head = std::string{kMinimal} + "[relay]\n";  // then line 8
  const auto started = std::chrono::steady_clock::now();
  std::string line = head + "level = [";
  while (line.size() < 1000000) line += "1,";
  ExpectError(line + "]\n", "file", "test.toml:8: too many values on long lines");
  ExpectError(line + "]\n", "file", "put the elements of a long array on lines of their own");
  // Values on a line without a '[' before them: toml11 reads every '#' line above, each time.
  std::string below_comments = head + "level = [\n";
  for (int i = 0; i < 50000; ++i) below_comments += "#\n";
  for (int i = 0; i < 2000; ++i) below_comments += "1, ";
  ExpectError(below_comments + "\n]\n", "file", "too many values on long lines");
  // The same when the '#' lines are inside a multi-line string.
  std::string in_string = head + "level = [\"\"\"\n";
  for (int i = 0; i < 50000; ++i) in_string += "#\n";
  in_string += "\"\"\"";
  for (int i = 0; i < 2000; ++i) in_string += ", 1";
  ExpectError(in_string + "\n]\n", "file", "too many values on long lines");
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds{5});
  // 2,000 values one per line, or 1,000 on one line, are fine.
  std::string tall = head + "level = [\n";
  for (int i = 0; i < 2000; ++i) tall += "  \"broker-" + std::to_string(i) + ":9092\",  # one\n";
  ExpectError(tall + "]\n", "relay.level", "unknown key");
  std::string wide = head + "# a comment\n# another\nlevel = [";
  for (int i = 0; i < 1000; ++i) wide += std::to_string(i) + ", ";
  ExpectError(wide + "]\n", "relay.level", "unknown key");
}

void ExpectShortError(std::string_view text, const std::string& key, const std::string& fragment) {
  SCOPED_TRACE(fragment);
  try {
    Parse(text);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& error) {
    const std::string what = error.what();
    EXPECT_EQ(error.key(), key) << what.substr(0, 2000);
    EXPECT_LT(what.size(), 1024U) << what.substr(0, 2000);
    EXPECT_NE(what.find(fragment), std::string::npos) << what.substr(0, 2000);
  }
}

// A huge value, key or line is quoted as a short prefix and its size, never whole.
TEST(ConfigTest, ErrorsQuoteOnlyAShortPrefixOfAHugeValue) {
  const std::string huge(20000, 'v');
  const std::string cut = std::string(64, 'v') + "…\" (20000 bytes)";
  const std::string relay = std::string{kMinimal} + "[relay]\n";
  ExpectShortError(relay + "lease = \"" + huge + "\"\n", "relay.lease", "got \"" + cut);
  ExpectShortError(relay + "batch_size = \"" + huge + "\"\n", "relay.batch_size",
                   "expected an integer, got string");
  ExpectShortError(std::string{kMinimal} + "[http]\nlisten = \"" + huge + "\"\n", "http.listen",
                   "got \"" + cut);
  ExpectShortError(std::string{kMinimal} + "[log]\nlevel = \"" + huge + "\"\n", "log.level",
                   "got \"" + cut);
  ExpectShortError(std::string{kMinimal} + "[sinks.x]\ntype = \"" + huge + "\"\n", "sinks.x.type",
                   "unknown sink type \"" + cut);
  // Not TOML: toml11 quotes the line, which is cut.
  ExpectShortError(relay + "lease = " + huge + "\n", "file", "test.toml is not valid TOML");
  ExpectShortError(relay + "lease = " + huge + "\n", "file", "vvv… (20013 bytes)");  // " 8 | ..."
  ExpectShortError(relay + "lease = \"" + huge + "\n", "file", "test.toml is not valid TOML");
  // A huge key is named cut too.
  const std::string key(20000, 'k');
  ExpectShortError(relay + key + " = 1\n", "relay." + std::string(250, 'k') + "… (20006 bytes)",
                   "unknown key");
  ExpectShortError(std::string{kMinimal} + "[sinks." + key + "]\ntype = \"file\"\n",
                   "sinks." + std::string(250, 'k') + "… (20006 bytes)", "a sink name must be");
  // 50 MB: refused for its size, without reading it as TOML.
  const auto started = std::chrono::steady_clock::now();
  ExpectShortError(relay + "lease = \"" + std::string(50'000'000, 'v') + "\"\n", "file",
                   "at most 1 MiB");
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds{5});
}

// Found by fuzz/config_fuzz.cpp: a literal string that is not UTF-8 made toml11 3.7.1 read out
// of bounds (it rewinds into a buffer other than the one it read). Text that is not UTF-8 is
// refused before toml11 sees it, wherever it is.
TEST(ConfigTest, TextThatIsNotUtf8IsRefused) {
  // The fuzzer's input (crash-31b8d0d33145dab92baa54430f260a0fdd21ea3c), byte for byte.
  const std::string found =
      "[database]\nurl = \"\"\"postgresql://outbox@db/app\"\"\"\n[sinks.\"default\"]\n"
      "type = 'file'\npath = '''/tmp/a [b] #\x90 c'''\n[relay]\ninstance = \"tab here \\u00e9 "
      "\\,\"quotedG\"\x1b# not a comment [[[\"\n";
  ASSERT_EQ(found.size(), 180U);
  ExpectError(found, "file", "test.toml:5: not valid UTF-8");
  const std::string head = std::string{kMinimal} + "[relay]\n";  // then line 8
  for (const char* value :
       {"'\x90'", "'''\x90'''", "'''a\xc3\nb'''", "\"\xff\"", "\"\"\"\xed\xa0\x80\"\"\""}) {
    SCOPED_TRACE(value);
    ExpectError(head + "instance = " + std::string{value} + "\n", "file",
                "test.toml:8: not valid UTF-8");
  }
  ExpectError(head + "# a comment \xc0\xaf\n", "file", "test.toml:8: not valid UTF-8");
  ExpectError(head + "\xfe = 1\n", "file", "test.toml:8: not valid UTF-8");
  // UTF-8 is read as it is.
  EXPECT_EQ(Parse(head + "instance = '''é ☃ 𝄞'''\n").relay.instance, "é ☃ 𝄞");
}

TEST(ConfigTest, QuotedCutsLongValuesBetweenCharacters) {
  EXPECT_EQ(config::Quoted("short"), "\"short\"");
  EXPECT_EQ(config::Quoted(std::string(64, 'x')), "\"" + std::string(64, 'x') + "\"");
  EXPECT_EQ(config::Quoted(std::string(65, 'x')), "\"" + std::string(64, 'x') + "…\" (65 bytes)");
  // "é" is two bytes: at byte 64 it would be split, so the prefix stops before it.
  EXPECT_EQ(config::Quoted(std::string(63, 'x') + "é" + std::string(10, 'y')),
            "\"" + std::string(63, 'x') + "…\" (75 bytes)");
  EXPECT_EQ(config::Quoted(std::string(62, 'x') + "é" + std::string(10, 'y')),
            "\"" + std::string(62, 'x') + "é…\" (74 bytes)");
  // Each line of a longer message is cut on its own, and the whole too.
  EXPECT_EQ(config::CutErrorText("ab\n" + std::string(200, 'z') + "\ncd", 160),
            "ab\n" + std::string(160, 'z') + "… (200 bytes)\ncd");
  EXPECT_LE(config::CutErrorText(std::string(100000, '\n'), 160, 4096).size(), 4200U);
}

// ---- Secrets ----

TEST(ConfigTest, MaskPasswordHidesEveryForm) {
  EXPECT_EQ(MaskPassword("postgresql://app:s3cret@db:5432/app"),
            "postgresql://app:***@db:5432/app");
  EXPECT_EQ(MaskPassword("amqp://guest:guest@127.0.0.1:5672/"), "amqp://guest:***@127.0.0.1:5672/");
  EXPECT_EQ(MaskPassword("amqp://u:p%40ss@mq/vh"), "amqp://u:***@mq/vh");
  EXPECT_EQ(MaskPassword("amqp://u:p@ss@mq/vh"), "amqp://u:***@mq/vh");
  EXPECT_EQ(MaskPassword("postgresql://app@db/app"), "postgresql://app@db/app");
  EXPECT_EQ(MaskPassword("postgresql://db:5432/app"), "postgresql://db:5432/app");
  EXPECT_EQ(MaskPassword("postgresql://db/app?user=u&password=s3cret&sslmode=require"),
            "postgresql://db/app?user=u&password=***&sslmode=require");
  EXPECT_EQ(MaskPassword("host=db user=app password=s3cret dbname=app"),
            "host=db user=app password=*** dbname=app");
  EXPECT_EQ(MaskPassword("host=db password = 'a b\\' c' dbname=app"),
            "host=db password = *** dbname=app");
  EXPECT_EQ(MaskPassword("host=db PASSWORD=x"), "host=db PASSWORD=***");
  EXPECT_EQ(MaskPassword("host=db old_password=x"), "host=db old_password=x");
}

TEST(ConfigTest, DescribeNeverShowsAPassword) {
  Config config = Parse(
      R"(
[database]
url = "host=db user=app password='pw-db-1 x' dbname=app"
[sinks.default]
type = "rabbitmq"
url = "amqp://u:pw-mq-1@mq/"
[sinks.second]
type = "rabbitmq"
[sinks.third]
type = "rabbitmq"
url = "amqp://u:pw-mq-3@[::1]:5673/v"
)",
      {{"OUTBOX_SINK_SECOND_URL", "amqp://u:pw-mq-2@mq/"}});
  const std::string described = Describe(config);
  EXPECT_EQ(described.find("pw-"), std::string::npos) << described;
  EXPECT_NE(described.find("password=***"), std::string::npos) << described;
  EXPECT_NE(described.find("amqp://u:***@mq/"), std::string::npos) << described;

  config.database =
      std::make_shared<const postgres::StoreSettings>("postgresql://app:pw-db-2@db/app", "outbox");
  EXPECT_EQ(Describe(config).find("pw-"), std::string::npos);
}

TEST(ConfigTest, ErrorsNeverShowAPassword) {
  // toml11 quotes the broken line; the password on it is masked.
  try {
    Parse("[database]\nurl = \"postgresql://app:pw-secret@db/app\" extra\n");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key(), "file");
    EXPECT_EQ(std::string{error.what()}.find("pw-secret"), std::string::npos) << error.what();
  }
  // Also when the line is cut before the '@' that ends the password.
  try {
    Parse("[database]\nurl = \"postgresql://app:pw-secret" + std::string(300, 'x') +
          "@db/app\" extra\n");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key(), "file");
    EXPECT_EQ(std::string{error.what()}.find("pw-se"), std::string::npos) << error.what();
    EXPECT_NE(std::string{error.what()}.find("app:***@db/app"), std::string::npos) << error.what();
  }
}

TEST(ConfigTest, DescribeParsesBackToTheSameConfiguration) {
  const std::string text = std::string{kMinimal} + R"(
[relay]
instance = "relay \"one\" \\ é"
lease = "90s"
publish_timeout = "1500ms"
[retry]
multiplier = 1.1
jitter = 0.0
[retention]
published = "3600s"
[sinks.mq]
type = "rabbitmq"
url = "amqp://u@mq/"
routing_key = "{topic}.{type}"
heartbeat = "0s"
)";
  const std::string described = Describe(Parse(text));
  const std::string again = Describe(Parse(described));
  EXPECT_EQ(described, again);
  EXPECT_NE(described.find("published = \"1h\""), std::string::npos) << described;
  EXPECT_NE(described.find("publish_timeout = \"1500ms\""), std::string::npos) << described;
  EXPECT_NE(described.find("multiplier = 1.1\n"), std::string::npos) << described;
  EXPECT_NE(described.find("jitter = 0.0\n"), std::string::npos) << described;
  EXPECT_NE(described.find(R"(instance = "relay \"one\" \\ é")"), std::string::npos) << described;
}

// The database URL may come from the environment unchecked; its DEL must come out escaped (TOML
// forbids it raw, JSON's escaping leaves it), so that the description still parses.
TEST(ConfigTest, DescribeEscapesDelInTheDatabaseUrl) {
  const std::string described =
      Describe(Parse(kMinimal, {{"OUTBOX_DATABASE_URL", "postgresql://db/a\x7f"}}));
  EXPECT_NE(described.find(R"(url = "postgresql://db/a\u007F")"), std::string::npos) << described;
  EXPECT_EQ(Pg(Parse(described)).url(), "postgresql://db/a\x7f");
}

// The one duration reader (config/duration.h) that outboxd, the sink types and outboxctl share.
TEST(DurationTest, ReadsEveryUnitAndRefusesWhatIsNotADuration) {
  using std::chrono::milliseconds;
  EXPECT_EQ(config::ParseDuration("250ms"), milliseconds{250});
  EXPECT_EQ(config::ParseDuration("30s"), milliseconds{30000});
  EXPECT_EQ(config::ParseDuration("5m"), milliseconds{300000});
  EXPECT_EQ(config::ParseDuration("1h"), milliseconds{3600000});
  EXPECT_EQ(config::ParseDuration("7d"), milliseconds{7LL * 86400000});
  EXPECT_EQ(config::ParseDuration("0s"), milliseconds{0});
  for (const char* bad : {"", "s", "10", "10x", "-1s", "1.5s", " 1s", "1s ", "1S",
                          "9999999999999ms", "999999999999d"}) {
    EXPECT_EQ(config::ParseDuration(bad), std::nullopt) << bad;
  }
  EXPECT_EQ(config::FormatDuration(milliseconds{172800000}), "2d");
  EXPECT_EQ(config::FormatDuration(milliseconds{5400000}), "90m");
  EXPECT_EQ(config::FormatDuration(milliseconds{1500}), "1500ms");
  EXPECT_EQ(config::FormatDuration(milliseconds{0}), "0s");
}

// A sink type registers once; the environment name of a sink's secret.
TEST(SinkRegistryTest, NamesItsTypesAndRefusesASecondOfTheSameName) {
  SinkRegistry registry;
  registry.Add(rabbitmq::Type());
  registry.Add(file::Type());
  EXPECT_EQ(registry.Names(), "\"rabbitmq\" or \"file\"");
  EXPECT_NE(registry.Find("file"), nullptr);
  EXPECT_EQ(registry.Find("kafka"), nullptr);
  EXPECT_THROW(registry.Add(file::Type()), std::logic_error);
  EXPECT_EQ(SinkSecretEnv("audit-log", "url"), "OUTBOX_SINK_AUDIT_LOG_URL");
}

// A store type registers once, like a sink type; outboxd knows PostgreSQL, SQLite and MariaDB.
TEST(StoreRegistryTest, NamesItsTypesAndRefusesASecondOfTheSameName) {
  StoreRegistry registry;
  registry.Add(postgres::Type());
  registry.Add(sqlite::Type());
  EXPECT_EQ(registry.Names(), "\"postgres\" or \"sqlite\"");
  registry.Add(mariadb::Type());
  EXPECT_EQ(registry.Names(), "\"postgres\", \"sqlite\" or \"mariadb\"");
  EXPECT_NE(registry.Find("sqlite"), nullptr);
  EXPECT_EQ(registry.Find("mysql"), nullptr);
  EXPECT_THROW(registry.Add(sqlite::Type()), std::logic_error);
  EXPECT_EQ(StoreTypes().Names(), registry.Names());
}

// ---- Masking by parsing (the store and sink types mask their URLs with their clients' parsers)
// ----

// Connection strings of each form, with the text of their secrets. The first is no URI libpq
// reads as meant ('/' in the password): shown as scheme and *** only.
const std::vector<std::pair<std::string, std::vector<std::string>>> kSecretDatabaseUrls = {
    {"postgresql://outbox:p#ss/w@127.0.0.1:15432/db", {"p#ss", "ss/w"}},
    {"postgresql://outbox:pw-secret-1@h/db?sslmode=disable", {"pw-secret-1"}},
    {"postgres://h/db?password=pw-secret-2&user=x", {"pw-secret-2"}},
    {"host=h password=pw-SECRET\\ X user=u", {"pw-SECRET", "SECRET\\ X", "SECRET X"}},
    {"password='pw a b\\' c' host=h", {"pw a", "a b", "' c"}},
};

// A file with `database_url` and RabbitMQ sinks whose passwords hold a space, an escaped '@', and
// none (the user's form is kept; only the password's text is replaced).
std::string MaskingConfig(const std::string& database_url) {
  return "[database]\nurl = " + config::TomlString(database_url) +
         "\n[sinks.space]\ntype = \"rabbitmq\"\nurl = \"amqp://guest:pw9 zz@localhost:5672/%2f\"\n"
         "[sinks.escaped]\ntype = \"rabbitmq\"\nurl = \"amqp://u:pw9%40at@mq/v\"\n"
         "[sinks.nopassword]\ntype = \"rabbitmq\"\nurl = \"amqp://guest@mq\"\n";
}

void ExpectNoSecret(const std::string& described, const std::vector<std::string>& secrets) {
  for (const std::string& secret : secrets) {
    EXPECT_EQ(described.find(secret), std::string::npos) << secret << " in:\n" << described;
  }
  EXPECT_EQ(described.find("pw9"), std::string::npos) << described;
}

TEST(ConfigTest, DescribeMasksEachUrlFormByParsingIt) {
  for (const auto& [url, secrets] : kSecretDatabaseUrls) {
    const std::string described = Describe(Parse(MaskingConfig(url)));
    ExpectNoSecret(described, secrets);
    EXPECT_NE(described.find("url = \"amqp://guest:***@localhost:5672/%2f\"\n"), std::string::npos)
        << described;
    EXPECT_NE(described.find("url = \"amqp://u:***@mq/v\"\n"), std::string::npos) << described;
    EXPECT_NE(described.find("url = \"amqp://guest@mq\"\n"), std::string::npos) << described;
  }
  const auto database_url = [](const std::string& url) {
    const std::string described = Describe(Parse(MaskingConfig(url)));
    const std::size_t start = described.find("url = ");
    return described.substr(start, described.find('\n', start) - start);
  };
  EXPECT_EQ(database_url(kSecretDatabaseUrls[0].first),
            "url = \"postgresql://*** (not a valid connection string: an '@' past the user info; "
            "in a URI, a user name or password must percent-encode '@', '/', ':', '?' and '#' "
            "(%40, %2F, %3A, %3F, %23))\"");
  EXPECT_EQ(database_url(kSecretDatabaseUrls[1].first),
            "url = \"postgresql://outbox:***@h/db?sslmode=disable\"");
  EXPECT_EQ(database_url(kSecretDatabaseUrls[2].first),
            "url = \"postgres://h/db?password=***&user=x\"");
  EXPECT_EQ(database_url(kSecretDatabaseUrls[3].first), "url = \"host=h password=*** user=u\"");
  EXPECT_EQ(database_url(kSecretDatabaseUrls[4].first), "url = \"password=*** host=h\"");
}

// A URL that the type refuses is quoted masked in the error.
TEST(ConfigTest, ARefusedBrokerUrlIsQuotedMasked) {
  ExpectError(WithSink("type = \"rabbitmq\"\nurl = \"http://u:pw9 zz@mq/\""), "sinks.default.url",
              "expected an amqp:// URL, got \"http://u:***@mq/\"");
  // One librabbitmq refuses is refused by the parser too (the sink would refuse it at start), and
  // shown as its scheme only.
  ExpectError(WithSink("type = \"rabbitmq\"\nurl = \"amqp://u@mq/?password=pw-mq-3\""),
              "sinks.default.url",
              "not a valid AMQP URL (amqp://user:password@host:port/vhost), got \"amqp://***\"");
}

// The real program: --check-config prints each form masked.
TEST_F(ConfigFileTest, CheckConfigPrintsNoPassword) {
  ::unsetenv("OUTBOX_DATABASE_URL");  // it would win over the file's
  for (const auto& [url, secrets] : kSecretDatabaseUrls) {
    SCOPED_TRACE(url);
    const std::string path = Write("masking.toml", MaskingConfig(url));
    const std::string log = (dir_ / "check.log").string();
    std::filesystem::remove(log);
    testing::ChildProcess outboxd({OUTBOXD_PATH, "--config", path, "--check-config"}, log);
    EXPECT_EQ(outboxd.Wait(std::chrono::seconds{20}), 0);
    std::ifstream in(log);
    std::stringstream output;
    output << in.rdbuf();
    ExpectNoSecret(output.str(), secrets);
    EXPECT_NE(output.str().find("amqp://guest:***@localhost:5672/%2f"), std::string::npos)
        << output.str();
    EXPECT_NE(output.str().find("is valid"), std::string::npos) << output.str();
  }
}

// MaskPassword stays for free text (library error messages, lines of the file): what its pattern
// used to miss, and what it must leave alone.
TEST(ConfigTest, MaskPasswordMasksUpToTheLastAtAndEscapedSpaces) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"postgresql://outbox:p#ss/w@127.0.0.1:15432/db",
       "postgresql://outbox:***@127.0.0.1:15432/db"},
      {"amqp://guest:pa ss@localhost:5672/%2f", "amqp://guest:***@localhost:5672/%2f"},
      {"failed: \"amqp://u:p?w@mq/\" (refused)", "failed: \"amqp://u:***@mq/\" (refused)"},
      {"host=h password=SECRET\\ X user=u", "host=h password=*** user=u"},
      {"password='a b\\' c' host=h", "password=*** host=h"},
      {"host=h sslpassword=x", "host=h sslpassword=***"},
      {"postgresql://h/db?SSLPASSWORD=x&password=y",
       "postgresql://h/db?SSLPASSWORD=***&password=***"},
      // No password: a user, a port.
      {"amqp://u@mq:5672/ refused for admin@example.com",
       "amqp://u@mq:5672/ refused for admin@example.com"},
      {"postgresql://db:5432/app\nuser@example.com", "postgresql://db:5432/app\nuser@example.com"},
      {"amqp://h:1/ and amqp://x@y", "amqp://h:1/ and amqp://x@y"},
  };
  for (const auto& [text, masked] : cases) EXPECT_EQ(MaskPassword(text), masked) << text;
  for (const std::string text :
       {"amqp://guest:pw9 zz@localhost/", "postgresql://outbox:pw9#ss/w@h/db",
        "host=h password=pw9\\ zz", "x password = 'pw9 \\' zz' y"}) {
    EXPECT_EQ(MaskPassword(text).find("pw9"), std::string::npos) << MaskPassword(text);
    EXPECT_EQ(MaskPassword(text).find("zz"), std::string::npos) << MaskPassword(text);
  }
}

// Secrets(config): what outboxd's redactor gets (outbox/core/secrets.h), from every kind of
// sink, the database and [http].
TEST(ConfigTest, SecretsHasEverySecretOfTheConfiguration) {
  const Config config = Parse(R"(
[database]
url = "postgresql://outbox:db-pass-5678@db/app"
[sinks.default]
type = "rabbitmq"
url = "amqp://relay:amqp-pass-1234@mq:5672/"
[sinks.nats]
type = "nats"
url = "nats://n1:4222,nats://u:nats-pass-1234@n2:4222"
[sinks.nats-url-token]
type = "nats"
url = "nats://nats-token-1234@n1:4222"
[sinks.nats-token]
type = "nats"
url = "nats://n1:4222"
token = "nats-token-5678"
[sinks.redis]
type = "redis"
url = "redis://:redis-pass-1234@r:6379"
[sinks.kafka]
type = "kafka"
brokers = "k:9092"
[sinks.kafka.librdkafka]
"sasl.password" = "sasl-pass-1234"
"client.id" = "not-a-secret"
[sinks.hook]
type = "http"
url = "https://hooks.example.com/{topic}"
headers = { Authorization = "Bearer bearer-token-1234" }
[http]
token = "api-token-1234"
)");
  const std::vector<std::string> secrets = Secrets(config);
  const auto has = [&secrets](const std::string& secret) {
    return std::find(secrets.begin(), secrets.end(), secret) != secrets.end();
  };
  for (const std::string secret :
       {"db-pass-5678", "amqp-pass-1234", "nats-token-1234", "nats-pass-1234", "nats-token-5678",
        "redis-pass-1234", "sasl-pass-1234", "bearer-token-1234", "api-token-1234"}) {
    EXPECT_TRUE(has(secret)) << secret;
  }
  EXPECT_FALSE(has("not-a-secret"));
  EXPECT_FALSE(has("relay"));  // a user name
}

// ---- Many databases: [[databases]] and [discovery] ----

constexpr std::string_view kTwoDatabases = R"(
[[databases]]
name = "tenant-a"
url = "postgresql://outbox@db/a"

[[databases]]
name = "tenant_b.eu"
type = "postgres"
url = "postgresql://outbox@db/b"
schema = "events"

[sinks.default]
type = "file"
)";

TEST(ConfigTest, ManyDatabasesAreNamedTablesOfTheirStoreType) {
  const Config config = Parse(kTwoDatabases, {{"OUTBOX_DATABASE_URL", "postgresql://env@db/x"}});
  ASSERT_TRUE(config.many_databases());
  EXPECT_EQ(config.database, nullptr);
  ASSERT_EQ(config.databases.size(), 2U);
  EXPECT_EQ(config.databases[0].name, "tenant-a");
  // OUTBOX_DATABASE_URL is [database]'s alone: it would name every database.
  EXPECT_EQ(dynamic_cast<const postgres::StoreSettings&>(*config.databases[0].settings).url(),
            "postgresql://outbox@db/a");
  const auto& second = dynamic_cast<const postgres::StoreSettings&>(*config.databases[1].settings);
  EXPECT_EQ(second.schema(), "events");
  EXPECT_NE(config.databases[0].fingerprint, config.databases[1].fingerprint);
  // An idle database's sweep is a statement: with many, the default is long.
  EXPECT_EQ(config.relay.sweep_interval, kManyDatabasesSweep);
  EXPECT_EQ(config.relay.purge_interval, kManyDatabasesPurge);
  // An idle database's heartbeat is a statement every third of its idle lease: 4 leases.
  EXPECT_EQ(config.relay.idle_lease, std::chrono::minutes{2});
  EXPECT_EQ(
      Parse(std::string{kTwoDatabases} + "[relay]\nlease = \"3s\"\npublish_timeout = \"1s\"\n")
          .relay.idle_lease,
      std::chrono::seconds{12});
  EXPECT_EQ(Parse(std::string{kTwoDatabases} + "[relay]\nlease = \"1d\"\n").relay.idle_lease,
            std::chrono::hours{24})
      << "capped at the longest idle_lease a file may name";
  EXPECT_EQ(Parse(std::string{kTwoDatabases} + "[relay]\nlease = \"3s\"\npublish_timeout = \"1s\"\n"
                                               "idle_lease = \"3s\"\n")
                .relay.idle_lease,
            std::chrono::seconds{3});
  // It describes itself back as [[databases]] tables that parse to the same.
  const std::string described = Describe(config);
  EXPECT_NE(described.find("[[databases]]\nname = \"tenant_b.eu\"\ntype = \"postgres\""),
            std::string::npos)
      << described;
  const Config again = Parse(described);
  ASSERT_EQ(again.databases.size(), 2U);
  EXPECT_EQ(again.databases[1].fingerprint, config.databases[1].fingerprint);
}

TEST(ConfigTest, ManyDatabasesRefuseBadNamesDuplicatesAndMixingWithDatabase) {
  const std::string sink = "[sinks.default]\ntype = \"file\"\n";
  ExpectError("[[databases]]\nurl = \"postgresql://db/a\"\n" + sink, "databases[0].name",
              "is required");
  ExpectError("[[databases]]\nname = \"a b\"\nurl = \"postgresql://db/a\"\n" + sink,
              "databases[0].name", "A-Z, a-z, 0-9");
  ExpectError("[[databases]]\nname = \"" + std::string(64, 'x') +
                  "\"\nurl = \"postgresql://db/a\"\n" + sink,
              "databases[0].name", "1 to 63 bytes");
  ExpectError(
      "[[databases]]\nname = \"a\"\nurl = \"postgresql://db/a\"\n"
      "[[databases]]\nname = \"a\"\nurl = \"postgresql://db/b\"\n" +
          sink,
      "databases[1].name", "names two databases");
  ExpectError(
      "[database]\nurl = \"postgresql://db/a\"\n[[databases]]\nname = \"a\"\n"
      "url = \"postgresql://db/a\"\n" +
          sink,
      "database", "use one or the other");
  // Each table is its store type's: its keys and values are checked by it.
  ExpectError("[[databases]]\nname = \"a\"\nurl = \"postgresql://db/a\"\nshema = \"x\"\n" + sink,
              "databases[0].shema", "unknown key");
  ExpectError("[[databases]]\nname = \"a\"\ntype = \"oracle\"\n" + sink, "databases[0].type",
              "unknown store type");
  ExpectError("databases = 3\n" + sink, "databases", "array of tables");
  ExpectError("databases = []\n" + sink, "databases", "names no database");
}

constexpr std::string_view kDiscovery = R"(
[discovery]
url = "postgresql://outbox:catalog-secret@db/catalog"
query = "SELECT name, url FROM tenants WHERE active"
interval = "5s"

[sinks.default]
type = "file"
)";

TEST(ConfigTest, DiscoveryReadsTheCatalogsQueryAndInterval) {
  const Config config = Parse(kDiscovery);
  ASSERT_TRUE(config.discovery);
  EXPECT_TRUE(config.many_databases());
  EXPECT_TRUE(config.databases.empty());
  EXPECT_EQ(config.discovery->interval, seconds{5});
  EXPECT_EQ(config.discovery->type, "postgres");
  EXPECT_EQ(Parse(kDiscovery, {{"OUTBOX_DISCOVERY_URL", "postgresql://env@db/c"}}).discovery->url,
            "postgresql://env@db/c");
  // The catalog's password is a secret: masked in --check-config, known to the redactor.
  EXPECT_EQ(Describe(config).find("catalog-secret"), std::string::npos);
  const std::vector<std::string> secrets = Secrets(config);
  EXPECT_NE(std::find(secrets.begin(), secrets.end(), "catalog-secret"), secrets.end());

  const std::string sink = "[sinks.default]\ntype = \"file\"\n";
  ExpectError("[discovery]\nquery = \"SELECT 1\"\n" + sink, "discovery.url", "is required");
  ExpectError("[discovery]\nurl = \"postgresql://db/c\"\n" + sink, "discovery.query",
              "is required");
  ExpectError("[discovery]\nurl = \"postgresql://db/c\"\nquery = \"  \"\n" + sink,
              "discovery.query", "is required");
  ExpectError(
      "[discovery]\nurl = \"postgresql://db/c\"\nquery = \"q\"\ninterval = \"10ms\"\n" + sink,
      "discovery.interval", "");
  ExpectError("[discovery]\nurl = \"postgresql://db/c\"\nquery = \"q\"\ntype = \"db2\"\n" + sink,
              "discovery.type", "unknown store type");
  ExpectError(
      "[discovery]\nurl = \"postgresql://db/c\"\nquery = \"q\"\nintervall = \"1s\"\n" + sink,
      "discovery.intervall", "unknown key");
}

TEST(ConfigTest, ADiscoveredRowIsReadByItsStoreType) {
  const Config config = Parse(kDiscovery);
  const NamedDatabase database = DiscoveredDatabase(
      *config.discovery, {.name = "t1", .url = "postgresql://db/t1", .schema = "tenant_one"});
  EXPECT_EQ(database.name, "t1");
  const auto& settings = dynamic_cast<const postgres::StoreSettings&>(*database.settings);
  EXPECT_EQ(settings.url(), "postgresql://db/t1");
  EXPECT_EQ(settings.schema(), "tenant_one");
  // Another url or schema is another fingerprint: the relay restarts that database.
  EXPECT_NE(DiscoveredDatabase(*config.discovery, {.name = "t1", .url = "postgresql://db/t2"})
                .fingerprint,
            database.fingerprint);
  // What the store type refuses names the catalog's column.
  try {
    (void)DiscoveredDatabase(*config.discovery,
                             {.name = "t1", .url = "postgresql://db/t1", .schema = "Bad-Schema"});
    ADD_FAILURE() << "a bad schema was accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key(), "schema") << error.what();
  }
  EXPECT_THROW((void)DiscoveredDatabase(*config.discovery, {.name = "", .url = "postgresql://x"}),
               ConfigError);
}

}  // namespace
}  // namespace outbox::outboxd
