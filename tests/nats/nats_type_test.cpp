// The NATS sink type for outboxd: [sinks.<name>] type = "nats" read from TOML, every bad value
// refused with its key named, secrets from the environment and masked in --check-config and in
// errors.
#include "outbox/sink/nats_type.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "outbox/core/error.h"
#include "support/sink_type_test.h"

namespace outbox::nats {
namespace {

using Env = testing::FakeEnvironment;

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

// A file of the test's own, removed at the end.
class TempFile {
 public:
  TempFile() : path_("/tmp/outbox-nats-type-" + std::to_string(getpid()) + "-" + Next()) {
    std::ofstream(path_) << "contents\n";
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  static std::string Next() {
    static int counter = 0;
    return std::to_string(++counter);
  }
  std::string path_;
};

// The table's required key.
std::string Url() { return "url = \"nats://127.0.0.1:4222\"\n"; }

TEST(NatsSinkTypeTest, DefaultsInDescribe) {
  const auto settings = ParseSink(Url());
  const SinkOptions& options = OptionsOf(settings);
  EXPECT_EQ(options.url, "nats://127.0.0.1:4222");
  EXPECT_EQ(options.subject, "{topic}");
  EXPECT_EQ(options.expect_stream, "");
  EXPECT_EQ(options.max_pending, 1000U);
  EXPECT_EQ(options.connect_timeout, std::chrono::milliseconds{5000});
  EXPECT_EQ(options.ping_interval, std::chrono::milliseconds{10000});
  EXPECT_EQ(options.max_message_bytes, 1048576U);
  EXPECT_EQ(options.envelope, EnvelopeStyle::kFull);
  EXPECT_EQ(Described(settings),
            "url = \"nats://127.0.0.1:4222\"\n"
            "subject = \"{topic}\"\n"
            "expect_stream = \"\"\n"
            "max_pending = 1000\n"
            "connect_timeout = \"5s\"\n"
            "ping_interval = \"10s\"\n"
            "max_message_bytes = 1048576\n"
            "token = \"\"\n"
            "creds = \"\"\n"
            "nkey_seed = \"\"\n"
            "tls_ca_file = \"\"\n"
            "tls_cert_file = \"\"\n"
            "tls_key_file = \"\"\n"
            "tls_server_name = \"\"\n"
            "envelope = \"full\"\n");
  const auto endpoint = settings->Endpoint();
  ASSERT_TRUE(endpoint.has_value());
  EXPECT_EQ(endpoint->host, "127.0.0.1");
  EXPECT_EQ(endpoint->port, 4222);
}

TEST(NatsSinkTypeTest, EveryKey) {
  const TempFile ca;
  const TempFile cert;
  const TempFile key;
  const auto settings = ParseSink(
      "url = \"tls://n1.example:4443,tls://n2.example\"\n"
      "subject = \"events.{target}.{type}\"\n"
      "expect_stream = \"EVENTS\"\n"
      "max_pending = 5000\n"
      "connect_timeout = \"2s\"\n"
      "max_message_bytes = 4096\n"
      "token = \"t0k3n-from-file\"\n"
      "tls_ca_file = \"" +
      ca.path() +
      "\"\n"
      "tls_cert_file = \"" +
      cert.path() +
      "\"\n"
      "tls_key_file = \"" +
      key.path() +
      "\"\n"
      "tls_server_name = \"nats.internal\"\n"
      "envelope = \"external\"\n");
  const SinkOptions& options = OptionsOf(settings);
  EXPECT_EQ(options.url, "tls://n1.example:4443,tls://n2.example");
  EXPECT_EQ(options.subject, "events.{target}.{type}");
  EXPECT_EQ(options.expect_stream, "EVENTS");
  EXPECT_EQ(options.max_pending, 5000U);
  EXPECT_EQ(options.connect_timeout, std::chrono::milliseconds{2000});
  EXPECT_EQ(options.max_message_bytes, 4096U);
  EXPECT_EQ(options.token, "t0k3n-from-file");
  EXPECT_EQ(options.tls_ca_file, ca.path());
  EXPECT_EQ(options.tls_cert_file, cert.path());
  EXPECT_EQ(options.tls_key_file, key.path());
  EXPECT_EQ(options.tls_server_name, "nats.internal");
  EXPECT_EQ(options.envelope, EnvelopeStyle::kExternal);
  const std::string described = Described(settings);
  EXPECT_NE(described.find("token = \"***\""), std::string::npos) << described;
  EXPECT_EQ(described.find("t0k3n"), std::string::npos) << described;
  EXPECT_NE(described.find("tls_server_name = \"nats.internal\""), std::string::npos);
  EXPECT_NE(described.find("envelope = \"external\""), std::string::npos) << described;
  EXPECT_EQ(settings->Endpoint()->host, "n1.example");
  EXPECT_EQ(settings->Endpoint()->port, 4443);

  const TempFile creds;
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "creds = \"" + creds.path() + "\"\n")).creds, creds.path());
  const TempFile seed;
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "nkey_seed = \"" + seed.path() + "\"\n")).nkey_seed,
            seed.path());
}

TEST(NatsSinkTypeTest, EnvelopeIsFullOrExternal) {
  testing::ExpectEnvelopeKey(Type(), Url(), [](const outbox::SinkSettings& settings) {
    return dynamic_cast<const SinkSettings&>(settings).options().envelope;
  });
}

TEST(NatsSinkTypeTest, CloudEventsKeys) {
  testing::ExpectCloudEventsKeys(
      Type(), Url(),
      [](const outbox::SinkSettings& settings) {
        return dynamic_cast<const SinkSettings&>(settings).options().cloudevents;
      },
      {"binary", "structured"});
}

TEST(NatsSinkTypeTest, SecretsInTheUrlAreMasked) {
  const auto with_password = ParseSink("url = \"nats://relay:hunter2@127.0.0.1:4222\"\n");
  EXPECT_EQ(OptionsOf(with_password).url, "nats://relay:hunter2@127.0.0.1:4222");
  std::string described = Described(with_password);
  EXPECT_NE(described.find("url = \"nats://relay:***@127.0.0.1:4222\""), std::string::npos)
      << described;
  EXPECT_EQ(described.find("hunter2"), std::string::npos) << described;

  const auto with_token = ParseSink("url = \"nats://s3cr3t-t0ken@127.0.0.1\"\n");
  described = Described(with_token);
  EXPECT_NE(described.find("url = \"nats://***@127.0.0.1\""), std::string::npos) << described;
  EXPECT_EQ(described.find("s3cr3t"), std::string::npos) << described;
}

TEST(NatsSinkTypeTest, UrlAndTokenFromTheEnvironment) {
  const auto settings =
      ParseSink("url = \"nats://file-host:4222\"\n",
                {{"OUTBOX_SINK_EVENTS_URL", "nats://relay:env-pass@env-host:4333"},
                 {"OUTBOX_SINK_EVENTS_TOKEN", ""}});
  EXPECT_EQ(OptionsOf(settings).url, "nats://relay:env-pass@env-host:4333");
  EXPECT_EQ(settings->Endpoint()->host, "env-host");
  EXPECT_EQ(Described(settings).find("env-pass"), std::string::npos);

  // No url in the file at all: the environment's.
  EXPECT_EQ(OptionsOf(ParseSink("", {{"OUTBOX_SINK_EVENTS_URL", "nats://h"}})).url, "nats://h");

  const auto token =
      ParseSink(Url() + "token = \"from-file\"\n", {{"OUTBOX_SINK_EVENTS_TOKEN", "from-env"}});
  EXPECT_EQ(OptionsOf(token).token, "from-env");
  EXPECT_EQ(Described(token).find("from-env"), std::string::npos);

  // A bad URL from the environment: the error says so, without the password.
  const auto [key, message] =
      ErrorOf(Url(), {{"OUTBOX_SINK_EVENTS_URL", "nats://relay:env-pass@host:notaport"}});
  EXPECT_EQ(key, "sinks.events.url");
  EXPECT_NE(message.find("OUTBOX_SINK_EVENTS_URL"), std::string::npos) << message;
  EXPECT_EQ(message.find("env-pass"), std::string::npos) << message;
}

TEST(NatsSinkTypeTest, BadValuesNameTheirKey) {
  EXPECT_EQ(ErrorOf("").first, "sinks.events.url");
  EXPECT_EQ(ErrorOf("url = \"\"\n").first, "sinks.events.url");
  EXPECT_EQ(ErrorOf("url = 4222\n").first, "sinks.events.url");
  EXPECT_EQ(ErrorOf("url = \"127.0.0.1:4222\"\n").first, "sinks.events.url");
  EXPECT_EQ(ErrorOf("url = \"amqp://127.0.0.1\"\n").first, "sinks.events.url");
  EXPECT_EQ(ErrorOf("url = \"nats://h:70000\"\n").first, "sinks.events.url");
  EXPECT_EQ(ErrorOf("url = \"nats://a,tls://b\"\n").first, "sinks.events.url");
  const auto [url_key, url_message] = ErrorOf("url = \"nats://relay:hunter2@h:x\"\n");
  EXPECT_EQ(url_key, "sinks.events.url");
  EXPECT_EQ(url_message.find("hunter2"), std::string::npos) << url_message;
  EXPECT_NE(url_message.find("relay:***@"), std::string::npos) << url_message;

  const auto [unknown, unknown_message] = ErrorOf(Url() + "subjekt = \"x\"\n");
  EXPECT_EQ(unknown, "sinks.events.subjekt");
  EXPECT_NE(unknown_message.find("did you mean"), std::string::npos) << unknown_message;

  EXPECT_EQ(ErrorOf(Url() + "subject = \"{nope}\"\n").first, "sinks.events.subject");
  EXPECT_EQ(ErrorOf(Url() + "subject = \"orders.{topic\"\n").first, "sinks.events.subject");
  EXPECT_EQ(ErrorOf(Url() + "subject = \"\"\n").first, "sinks.events.subject");
  EXPECT_EQ(ErrorOf(Url() + "subject = \"orders.*\"\n").first, "sinks.events.subject");
  EXPECT_EQ(ErrorOf(Url() + "subject = \"orders.>\"\n").first, "sinks.events.subject");
  EXPECT_EQ(ErrorOf(Url() + "subject = \"orders..{topic}\"\n").first, "sinks.events.subject");
  EXPECT_EQ(ErrorOf(Url() + "subject = \"orders {topic}\"\n").first, "sinks.events.subject");
  EXPECT_EQ(ErrorOf(Url() + "expect_stream = \"a.b\"\n").first, "sinks.events.expect_stream");
  EXPECT_EQ(ErrorOf(Url() + "expect_stream = \"a b\"\n").first, "sinks.events.expect_stream");
  EXPECT_EQ(ErrorOf(Url() + "max_pending = 0\n").first, "sinks.events.max_pending");
  EXPECT_EQ(ErrorOf(Url() + "max_pending = 100001\n").first, "sinks.events.max_pending");
  EXPECT_EQ(ErrorOf(Url() + "max_pending = \"10\"\n").first, "sinks.events.max_pending");
  EXPECT_EQ(ErrorOf(Url() + "connect_timeout = \"0s\"\n").first, "sinks.events.connect_timeout");
  EXPECT_EQ(ErrorOf(Url() + "ping_interval = \"10ms\"\n").first, "sinks.events.ping_interval");
  EXPECT_EQ(ErrorOf(Url() + "ping_interval = \"2h\"\n").first, "sinks.events.ping_interval");
  EXPECT_EQ(ErrorOf(Url() + "connect_timeout = \"11m\"\n").first, "sinks.events.connect_timeout");
  EXPECT_EQ(ErrorOf(Url() + "connect_timeout = \"soon\"\n").first, "sinks.events.connect_timeout");
  EXPECT_EQ(ErrorOf(Url() + "max_message_bytes = 0\n").first, "sinks.events.max_message_bytes");
  EXPECT_EQ(ErrorOf(Url() + "max_message_bytes = 67108865\n").first,
            "sinks.events.max_message_bytes");
  EXPECT_EQ(ErrorOf(Url() + "token = 7\n").first, "sinks.events.token");
}

TEST(NatsSinkTypeTest, FilesMustBeReadable) {
  for (const std::string key :
       {"creds", "nkey_seed", "tls_ca_file", "tls_cert_file", "tls_key_file"}) {
    const auto [error_key, message] =
        ErrorOf(Url() + key + " = \"/nonexistent/outbox-test/" + key + ".pem\"\n");
    EXPECT_EQ(error_key, "sinks.events." + key);
    EXPECT_NE(message.find("cannot read"), std::string::npos) << message;
    EXPECT_NE(message.find("/nonexistent/outbox-test/"), std::string::npos) << message;
  }
  // A directory is no file either.
  EXPECT_EQ(ErrorOf(Url() + "creds = \"/\"\n").first, "sinks.events.creds");
}

TEST(NatsSinkTypeTest, OneWayToAuthenticateAndCertificatesWithTheirKeys) {
  const TempFile creds;
  const TempFile seed;
  const TempFile cert;
  EXPECT_EQ(ErrorOf(Url() + "token = \"t\"\ncreds = \"" + creds.path() + "\"\n").first,
            "sinks.events.creds");
  EXPECT_EQ(
      ErrorOf(Url() + "creds = \"" + creds.path() + "\"\nnkey_seed = \"" + seed.path() + "\"\n")
          .first,
      "sinks.events.nkey_seed");
  const auto [key, message] = ErrorOf("url = \"nats://u:secretpw@h\"\ntoken = \"other-secret\"\n");
  EXPECT_EQ(key, "sinks.events.token");
  EXPECT_EQ(message.find("secretpw"), std::string::npos) << message;
  EXPECT_EQ(message.find("other-secret"), std::string::npos) << message;
  EXPECT_EQ(ErrorOf(Url() + "tls_cert_file = \"" + cert.path() + "\"\n").first,
            "sinks.events.tls_key_file");
  EXPECT_EQ(ErrorOf(Url() + "tls_key_file = \"" + cert.path() + "\"\n").first,
            "sinks.events.tls_cert_file");
  EXPECT_EQ(ErrorOf(Url() + "tls_server_name = \"a b\"\n").first, "sinks.events.tls_server_name");
}

// OpenSink checks what the parser checks, for programs that build SinkOptions themselves.
TEST(NatsSinkTypeTest, OpenSinkValidatesWithoutConnecting) {
  SinkOptions options;
  options.url = "nats://127.0.0.1:1";  // nobody listens: opening does not connect
  EXPECT_NE(OpenSink(options), nullptr);
  options.subject = "a.*";
  try {
    OpenSink(options);
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key(), "subject");
  }
  options.subject = "{topic}";
  options.max_pending = 0;
  EXPECT_THROW(OpenSink(options), ConfigError);
}

}  // namespace
}  // namespace outbox::nats
