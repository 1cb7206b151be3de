// The Redis sink type for outboxd: [sinks.<name>] type = "redis" read from TOML, every bad value
// refused with its key named, the URL from the environment and its password masked in
// --check-config. Also, without a server: the URL reader, the classification of error replies
// (one test per row of sink/redis.h's table) and the warning about a short dedup window.
#include "outbox/sink/redis_type.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "classify.h"
#include "outbox/core/error.h"
#include "support/sink_type_test.h"

namespace outbox::redis {
namespace {

using Env = testing::FakeEnvironment;
using std::chrono::milliseconds;

// Parses `[sinks.events]` + `body` with `env` as the environment.
std::unique_ptr<const outbox::SinkSettings> ParseSink(const std::string& body, Env env = {}) {
  return testing::ParseSinkTable(Type(), body, std::move(env));
}

const SinkOptions& OptionsOf(const std::unique_ptr<const outbox::SinkSettings>& settings) {
  return dynamic_cast<const SinkSettings&>(*settings).options();
}

std::string Described(const std::unique_ptr<const outbox::SinkSettings>& settings) {
  return testing::DescribeSink(settings);
}

// The ConfigError of parsing `body`: its key and message.
std::pair<std::string, std::string> ErrorOf(const std::string& body, Env env = {}) {
  return testing::SinkTableError(Type(), body, std::move(env));
}

const std::string kUrl = "url = \"redis://127.0.0.1:6379\"\n";

TEST(RedisSinkTypeTest, DefaultsInDescribe) {
  const auto settings = ParseSink(kUrl);
  const SinkOptions& options = OptionsOf(settings);
  EXPECT_EQ(options.stream, "{topic}");
  EXPECT_EQ(options.max_len, 0U);
  EXPECT_TRUE(options.dedup);
  EXPECT_EQ(options.dedup_window, std::chrono::hours{24});
  EXPECT_EQ(options.dedup_prefix, "outbox:dedup:");
  EXPECT_EQ(options.pipeline, 1000U);
  EXPECT_EQ(options.connect_timeout, milliseconds{5000});
  EXPECT_EQ(options.max_message_bytes, 16U * 1024 * 1024);
  EXPECT_EQ(options.envelope, EnvelopeStyle::kFull);
  EXPECT_EQ(Described(settings),
            "url = \"redis://127.0.0.1:6379\"\n"
            "stream = \"{topic}\"\n"
            "max_len = 0\n"
            "dedup = true\n"
            "dedup_window = \"1d\"\n"
            "dedup_prefix = \"outbox:dedup:\"\n"
            "pipeline = 1000\n"
            "connect_timeout = \"5s\"\n"
            "max_message_bytes = 16777216\n"
            "envelope = \"full\"\n");
  const auto endpoint = settings->Endpoint();
  ASSERT_TRUE(endpoint.has_value());
  EXPECT_EQ(endpoint->host, "127.0.0.1");
  EXPECT_EQ(endpoint->port, 6379);
}

TEST(RedisSinkTypeTest, EveryKey) {
  const auto settings = ParseSink(R"(url = "redis://relay:p%40ss@redis.example:6380/2"
stream = "events.{target}.{topic}.{type}"
max_len = 100000
dedup = false
dedup_window = "2h"
dedup_prefix = "app:{seen}:"
pipeline = 64
connect_timeout = "750ms"
max_message_bytes = 2000000
envelope = "external"
)");
  const SinkOptions& options = OptionsOf(settings);
  EXPECT_EQ(options.url, "redis://relay:p%40ss@redis.example:6380/2");
  EXPECT_EQ(options.stream, "events.{target}.{topic}.{type}");
  EXPECT_EQ(options.max_len, 100000U);
  EXPECT_FALSE(options.dedup);
  EXPECT_EQ(options.dedup_window, std::chrono::hours{2});
  EXPECT_EQ(options.dedup_prefix, "app:{seen}:");
  EXPECT_EQ(options.pipeline, 64U);
  EXPECT_EQ(options.connect_timeout, milliseconds{750});
  EXPECT_EQ(options.max_message_bytes, 2000000U);
  EXPECT_EQ(options.envelope, EnvelopeStyle::kExternal);
  const std::string described = Described(settings);
  EXPECT_NE(described.find("url = \"redis://relay:***@redis.example:6380/2\""), std::string::npos)
      << described;
  EXPECT_EQ(described.find("p%40ss"), std::string::npos) << described;
  EXPECT_NE(described.find("dedup_window = \"2h\""), std::string::npos) << described;
  EXPECT_NE(described.find("connect_timeout = \"750ms\""), std::string::npos) << described;
  EXPECT_NE(described.find("envelope = \"external\""), std::string::npos) << described;
  const auto endpoint = settings->Endpoint();
  ASSERT_TRUE(endpoint.has_value());
  EXPECT_EQ(endpoint->host, "redis.example");
  EXPECT_EQ(endpoint->port, 6380);
}

TEST(RedisSinkTypeTest, EnvelopeIsFullOrExternal) {
  testing::ExpectEnvelopeKey(Type(), kUrl, [](const outbox::SinkSettings& settings) {
    return dynamic_cast<const SinkSettings&>(settings).options().envelope;
  });
}

TEST(RedisSinkTypeTest, CloudEventsKeys) {
  testing::ExpectCloudEventsKeys(
      Type(), kUrl,
      [](const outbox::SinkSettings& settings) {
        return dynamic_cast<const SinkSettings&>(settings).options().cloudevents;
      },
      {"binary"});
}

TEST(RedisSinkTypeTest, UrlFromTheEnvironmentWinsAndIsMasked) {
  const auto settings =
      ParseSink(kUrl, {{"OUTBOX_SINK_EVENTS_URL", "redis://:env-S3cret@10.0.0.5:7000/1"}});
  EXPECT_EQ(OptionsOf(settings).url, "redis://:env-S3cret@10.0.0.5:7000/1");
  const std::string described = Described(settings);
  EXPECT_NE(described.find("url = \"redis://:***@10.0.0.5:7000/1\""), std::string::npos)
      << described;
  EXPECT_EQ(described.find("env-S3cret"), std::string::npos) << described;
  // Without url in the file, the environment is enough.
  EXPECT_EQ(OptionsOf(ParseSink("", {{"OUTBOX_SINK_EVENTS_URL", "redis://r:6379"}})).url,
            "redis://r:6379");
  // A bad URL from the environment says so, without the password.
  const auto [key, message] =
      ErrorOf("", {{"OUTBOX_SINK_EVENTS_URL", "redis://u:Hidden-Pw@host:notaport"}});
  EXPECT_EQ(key, "sinks.events.url");
  EXPECT_NE(message.find("OUTBOX_SINK_EVENTS_URL"), std::string::npos) << message;
  EXPECT_EQ(message.find("Hidden-Pw"), std::string::npos) << message;
}

TEST(RedisSinkTypeTest, UnixSocketHasNoProbe) {
  const auto settings = ParseSink("url = \"unix:///run/redis/redis.sock?db=4\"\n");
  EXPECT_FALSE(settings->Endpoint().has_value());
  const Endpoint endpoint = ParseUrl(OptionsOf(settings).url);
  EXPECT_EQ(endpoint.unix_path, "/run/redis/redis.sock");
  EXPECT_EQ(endpoint.db, 4);
}

TEST(RedisSinkTypeTest, TlsIsRefusedWithTheReason) {
  const auto [key, message] = ErrorOf("url = \"rediss://:pw@host:6380\"\n");
  EXPECT_EQ(key, "sinks.events.url");
  EXPECT_NE(message.find("TLS"), std::string::npos) << message;
  EXPECT_NE(message.find("hiredis 1.0"), std::string::npos) << message;
  EXPECT_NE(message.find("bookworm"), std::string::npos) << message;
  EXPECT_NE(message.find("test.toml:3"), std::string::npos) << message;
}

TEST(RedisSinkTypeTest, BadValuesNameTheirKey) {
  struct Case {
    std::string body;
    std::string key;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"", "url", "is required (or set OUTBOX_SINK_EVENTS_URL)"},
      {"url = 5\n", "url", "expected a string"},
      {"url = \"\"\n", "url", "is required"},
      {"url = \"http://host\"\n", "url", "expected a redis://"},
      {"url = \"redis://\"\n", "url", "no host"},
      {"url = \"redis://host:0\"\n", "url", "expected host[:port]"},
      {"url = \"redis://host:99999\"\n", "url", "expected host[:port]"},
      {"url = \"redis://host/x\"\n", "url", "database must be a number"},
      {"url = \"redis://host/-1\"\n", "url", "database must be a number"},
      {"url = \"redis://host?db=1\"\n", "url", "query parameters"},
      {"url = \"redis://user@host\"\n", "url", "a user needs a password"},
      {"url = \"redis://u:%zz@host\"\n", "url", "password has a '%'"},
      {"url = \"redis://u:@host\"\n", "url", "password is empty"},
      {"url = \"unix://relative/path\"\n", "url", "absolute path"},
      {"url = \"unix:///s.sock?timeout=1\"\n", "url", "db=N"},
      {kUrl + "stream = \"\"\n", "stream", "1 to 1024 bytes"},
      {kUrl + "stream = \"a\\nb\"\n", "stream", "control characters"},
      {kUrl + "stream = \"{nope}\"\n", "stream", "{nope}"},
      {kUrl + "stream = \"open{\"\n", "stream", "{"},
      {kUrl + "stream = 1\n", "stream", "expected a string"},
      {kUrl + "max_len = -1\n", "max_len", "between 0 and"},
      {kUrl + "max_len = \"10\"\n", "max_len", "expected an integer"},
      {kUrl + "dedup = \"yes\"\n", "dedup", "expected a boolean"},
      {kUrl + "dedup_window = \"500ms\"\n", "dedup_window", "between 1s and 365d"},
      {kUrl + "dedup_window = \"400d\"\n", "dedup_window", "between 1s and 365d"},
      {kUrl + "dedup_window = \"soon\"\n", "dedup_window", "expected a duration"},
      {kUrl + "dedup_window = 60\n", "dedup_window", "(a string)"},
      {kUrl + "dedup_prefix = \"\"\n", "dedup_prefix", "1 to 1024 bytes"},
      {kUrl + "dedup_prefix = \"a\\tb\"\n", "dedup_prefix", "control characters"},
      {kUrl + "pipeline = 0\n", "pipeline", "between 1 and 100000"},
      {kUrl + "pipeline = 100001\n", "pipeline", "between 1 and 100000"},
      {kUrl + "connect_timeout = \"0s\"\n", "connect_timeout", "between 1ms and 10m"},
      {kUrl + "connect_timeout = \"1h\"\n", "connect_timeout", "between 1ms and 10m"},
      {kUrl + "max_message_bytes = 0\n", "max_message_bytes", "between 1 and 536870912"},
      {kUrl + "max_message_bytes = 536870913\n", "max_message_bytes", "between 1 and 536870912"},
      {kUrl + "maxlen = 5\n", "maxlen", "did you mean \"sinks.events.max_len\""},
      {kUrl + "password = \"x\"\n", "password", "unknown key"},
  };
  for (const Case& c : cases) {
    const auto [key, message] = ErrorOf(c.body);
    EXPECT_EQ(key, "sinks.events." + c.key) << c.body << " -> " << message;
    EXPECT_NE(message.find(c.says), std::string::npos) << c.body << " -> " << message;
  }
}

TEST(RedisSinkTypeTest, ErrorsNeverShowThePassword) {
  for (const std::string url :
       {"redis://u:Top-S3cret@host:x", "redis://u:Top-S3cret@host/db", "ftp://u:Top-S3cret@host",
        "u:Top-S3cret@host:6379", "unix://u:Top-S3cret@relative"}) {
    const auto [key, message] = ErrorOf("url = \"" + url + "\"\n");
    EXPECT_EQ(key, "sinks.events.url") << url;
    EXPECT_EQ(message.find("Top-S3cret"), std::string::npos) << message;
  }
}

TEST(RedisUrlTest, ParsesEveryForm) {
  Endpoint plain = ParseUrl("redis://cache");
  EXPECT_EQ(plain.host, "cache");
  EXPECT_EQ(plain.port, 6379);
  EXPECT_EQ(plain.db, 0);
  EXPECT_FALSE(plain.password.has_value());
  EXPECT_EQ(plain.Describe(), "cache:6379");

  Endpoint acl = ParseUrl("redis://relay%2D1:p%3Aw%40d@[::1]:7000/15");
  EXPECT_EQ(acl.host, "::1");
  EXPECT_EQ(acl.port, 7000);
  EXPECT_EQ(acl.user, "relay-1");
  EXPECT_EQ(acl.password, "p:w@d");
  EXPECT_EQ(acl.db, 15);
  EXPECT_EQ(acl.Describe(), "relay-1@[::1]:7000/15");

  Endpoint password_only = ParseUrl("redis://:secret@127.0.0.1:6379/");
  EXPECT_EQ(password_only.user, "");
  EXPECT_EQ(password_only.password, "secret");
  EXPECT_EQ(password_only.db, 0);

  Endpoint unix_socket = ParseUrl("unix://:pw@/var/run/redis.sock?db=2");
  EXPECT_EQ(unix_socket.unix_path, "/var/run/redis.sock");
  EXPECT_EQ(unix_socket.password, "pw");
  EXPECT_EQ(unix_socket.db, 2);
  EXPECT_EQ(unix_socket.Describe(), "unix:/var/run/redis.sock?db=2");
}

TEST(RedisUrlTest, MasksOnlyThePassword) {
  EXPECT_EQ(MaskUrl("redis://relay:pw@host:1/2"), "redis://relay:***@host:1/2");
  EXPECT_EQ(MaskUrl("redis://:p@w:d@host"), "redis://:***@host");
  EXPECT_EQ(MaskUrl("redis://host:6379/1"), "redis://host:6379/1");
  EXPECT_EQ(MaskUrl("unix://:pw@/tmp/r.sock"), "unix://:***@/tmp/r.sock");
  // Not a URL the sink reads: the whole user info.
  EXPECT_EQ(MaskUrl("redis://u:pw@host:bad"), "redis://***@host:bad");
  EXPECT_EQ(MaskUrl("rediss://u:pw@host"), "rediss://***@host");
  EXPECT_EQ(MaskUrl("u:pw@host"), "***@host");
}

// One test per row of the classification table in sink/redis.h.
TEST(RedisClassifyTest, ErrorRepliesBecomeFailureKinds) {
  struct Row {
    std::string reply;
    FailureKind kind;
    bool server_state;
  };
  const std::vector<Row> rows = {
      {"LOADING Redis is loading the dataset in memory", FailureKind::kUnavailable, true},
      {"BUSY Redis is busy running a script.", FailureKind::kUnavailable, true},
      {"MASTERDOWN Link with MASTER is down", FailureKind::kUnavailable, true},
      {"READONLY You can't write against a read only replica.", FailureKind::kUnavailable, true},
      {"NOAUTH Authentication required.", FailureKind::kUnavailable, true},
      {"OOM command not allowed when used memory > 'maxmemory'.", FailureKind::kUnavailable, true},
      {"TRYAGAIN Multiple keys request during rehashing of slot", FailureKind::kUnavailable, true},
      {"CLUSTERDOWN The cluster is down", FailureKind::kUnavailable, true},
      {"NOREPLICAS Not enough good replicas to write.", FailureKind::kUnavailable, true},
      {"MISCONF Redis is configured to save RDB snapshots", FailureKind::kUnavailable, true},
      {"WRONGTYPE Operation against a key holding the wrong kind of value", FailureKind::kRejected,
       false},
      {"NOPERM this user has no permissions to access one of the keys", FailureKind::kUnavailable,
       false},
      {"ERR unknown command 'XADD'", FailureKind::kRejected, false},
      {"CROSSSLOT Keys in request don't hash to the same slot", FailureKind::kRejected, false},
      {"MOVED 3999 127.0.0.1:6381", FailureKind::kRejected, false},
      {"SOMETHINGNEW text", FailureKind::kRejected, false},
  };
  for (const Row& row : rows) {
    const ErrorVerdict verdict = ClassifyErrorReply(row.reply);
    EXPECT_EQ(verdict.failure.kind, row.kind) << row.reply;
    EXPECT_EQ(verdict.server_state, row.server_state) << row.reply;
    EXPECT_NE(verdict.failure.reason.find(row.reply), std::string::npos)
        << row.reply << " -> " << verdict.failure.reason;
    EXPECT_EQ(verdict.code, row.reply.substr(0, row.reply.find(' ')));
  }
  EXPECT_TRUE(ClassifyErrorReply("OOM x").out_of_memory);
  EXPECT_NE(ClassifyErrorReply("OOM x").failure.reason.find("out of memory"), std::string::npos);
  EXPECT_TRUE(ClassifyErrorReply("READONLY x").reconnect);
  EXPECT_TRUE(ClassifyErrorReply("NOAUTH x").reconnect);
  EXPECT_FALSE(ClassifyErrorReply("LOADING x").reconnect);
  // A long reply is cut, not echoed whole.
  EXPECT_LT(ClassifyErrorReply("ERR " + std::string(5000, 'x')).failure.reason.size(), 400U);
}

TEST(RedisOpenTest, WarnsWhenTheDedupWindowIsShorterThanTheLease) {
  std::vector<std::string> warnings;
  SinkOptions options;
  options.dedup_window = std::chrono::seconds{10};
  options.lease = std::chrono::seconds{30};
  options.log = [&warnings](LogLevel level, std::string_view message) {
    if (level == LogLevel::kWarn) warnings.emplace_back(message);
  };
  EXPECT_NE(OpenSink(options), nullptr);  // lazy: no server needed
  ASSERT_EQ(warnings.size(), 1U);
  EXPECT_NE(warnings[0].find("dedup_window (10000 ms) is shorter than the relay's lease"),
            std::string::npos)
      << warnings[0];

  warnings.clear();
  options.dedup_window = std::chrono::seconds{30};
  OpenSink(options);
  options.dedup_window = std::chrono::seconds{10};
  options.dedup = false;
  OpenSink(options);
  EXPECT_TRUE(warnings.empty());

  // Through the sink type, with the context outboxd gives.
  const auto settings = ParseSink(kUrl + "dedup_window = \"5s\"\n");
  EXPECT_NE(settings->Open({.log = options.log, .lease = std::chrono::seconds{30}}), nullptr);
  EXPECT_EQ(warnings.size(), 1U);
}

TEST(RedisOpenTest, ValidateOptionsNamesTheKey) {
  const auto key_of = [](SinkOptions options) {
    try {
      ValidateOptions(options);
    } catch (const ConfigError& error) {
      return error.key();
    }
    return std::string{"<none>"};
  };
  EXPECT_EQ(key_of({}), "<none>");
  EXPECT_EQ(key_of({.url = "rediss://h"}), "url");
  EXPECT_EQ(key_of({.stream = ""}), "stream");
  EXPECT_EQ(key_of({.stream = "{x}"}), "stream");
  EXPECT_EQ(key_of({.dedup_window = milliseconds{10}}), "dedup_window");
  EXPECT_EQ(key_of({.dedup_prefix = ""}), "dedup_prefix");
  EXPECT_EQ(key_of({.pipeline = 0}), "pipeline");
  EXPECT_EQ(key_of({.connect_timeout = milliseconds{0}}), "connect_timeout");
  EXPECT_EQ(key_of({.max_message_bytes = 0}), "max_message_bytes");
}

}  // namespace
}  // namespace outbox::redis
