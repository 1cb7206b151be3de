// The HTTP webhook sink type for outboxd: [sinks.<name>] type = "http" read from TOML, every key,
// the defaults, every bad value refused with its full dotted key named, the URL and the secrets
// from the environment, secrets masked in --check-config and never quoted in errors; and the
// Standard Webhooks signature (outbox::webhook::Sign) against vectors computed elsewhere. No
// server: nothing here sends a request.
#include "outbox/sink/http_type.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "outbox/core/error.h"
#include "outbox/sink/http.h"
#include "support/sink_type_test.h"
#include "url.h"

namespace outbox::webhook {
namespace {

using Env = testing::FakeEnvironment;
using std::chrono::milliseconds;

// Secrets of the right form: "whsec_" + base64 of 32 and 24 bytes (bytes 0..31; the second is
// the Standard Webhooks specification's example secret).
const std::string kSecret = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const std::string kSpecSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

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

// The key ErrorOf names.
std::string KeyOf(const std::string& body, Env env = {}) {
  return ErrorOf(body, std::move(env)).first;
}

// A file of the test's own, removed at the end.
class TempFile {
 public:
  TempFile() : path_("/tmp/outbox-http-type-" + std::to_string(getpid()) + "-" + Next()) {
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
std::string Url() { return "url = \"https://hooks.example.com/outbox/{topic}\"\n"; }

TEST(HttpSinkTypeTest, DefaultsInDescribe) {
  const auto settings = ParseSink(Url());
  const SinkOptions& options = OptionsOf(settings);
  EXPECT_EQ(options.url, "https://hooks.example.com/outbox/{topic}");
  EXPECT_EQ(options.method, "POST");
  EXPECT_TRUE(options.secrets.empty());
  EXPECT_TRUE(options.headers.empty());
  EXPECT_EQ(options.max_in_flight, 64U);
  EXPECT_EQ(options.connect_timeout, milliseconds{5000});
  EXPECT_EQ(options.request_timeout, milliseconds{30000});
  EXPECT_TRUE(options.retry_statuses.empty());
  EXPECT_EQ(options.max_retry_after, std::chrono::minutes{10});
  EXPECT_EQ(options.max_message_bytes, 1048576U);
  EXPECT_EQ(options.http_version, HttpVersion::kAuto);
  EXPECT_EQ(options.tls_ca_file, "");
  EXPECT_EQ(options.tls_cert_file, "");
  EXPECT_EQ(options.tls_key_file, "");
  EXPECT_EQ(options.proxy, "");
  EXPECT_EQ(options.envelope, EnvelopeStyle::kFull);
  EXPECT_EQ(Described(settings),
            "url = \"https://hooks.example.com/outbox/{topic}\"\n"
            "method = \"POST\"\n"
            "secrets = []\n"
            "headers = {}\n"
            "max_in_flight = 64\n"
            "connect_timeout = \"5s\"\n"
            "request_timeout = \"30s\"\n"
            "retry_statuses = []\n"
            "abandon_statuses = []\n"
            "max_retry_after = \"10m\"\n"
            "max_message_bytes = 1048576\n"
            "http_version = \"auto\"\n"
            "tls_ca_file = \"\"\n"
            "tls_cert_file = \"\"\n"
            "tls_key_file = \"\"\n"
            "proxy = \"\"\n"
            "envelope = \"full\"\n");
  // The host is fixed: the readiness check probes it (https: port 443).
  const auto endpoint = settings->Endpoint();
  ASSERT_TRUE(endpoint.has_value());
  EXPECT_EQ(endpoint->host, "hooks.example.com");
  EXPECT_EQ(endpoint->port, 443);
}

TEST(HttpSinkTypeTest, EveryKey) {
  const TempFile ca;
  const TempFile cert;
  const TempFile key;
  const auto settings = ParseSink(
      "url = \"http://127.0.0.1:8080/hooks/{target}/{topic}?type={type}\"\n"
      "method = \"PUT\"\n"
      "secrets = [\"" +
      kSecret + "\", \"" + kSpecSecret +
      "\"]\n"
      "headers = { Authorization = \"Bearer t0k3n-header\", X-Team = \"payments-value\" }\n"
      "max_in_flight = 7\n"
      "connect_timeout = \"1500ms\"\n"
      "request_timeout = \"2m\"\n"
      "retry_statuses = [404, 409]\n"
      "max_retry_after = \"90s\"\n"
      "max_message_bytes = 4096\n"
      "http_version = \"1.1\"\n"
      "tls_ca_file = \"" +
      ca.path() +
      "\"\n"
      "tls_cert_file = \"" +
      cert.path() +
      "\"\n"
      "tls_key_file = \"" +
      key.path() +
      "\"\n"
      "proxy = \"http://proxy.internal:3128\"\n"
      "envelope = \"external\"\n");
  const SinkOptions& options = OptionsOf(settings);
  EXPECT_EQ(options.url, "http://127.0.0.1:8080/hooks/{target}/{topic}?type={type}");
  EXPECT_EQ(options.method, "PUT");
  EXPECT_EQ(options.secrets, (std::vector<std::string>{kSecret, kSpecSecret}));
  const std::vector<std::pair<std::string, std::string>> headers{
      {"Authorization", "Bearer t0k3n-header"}, {"X-Team", "payments-value"}};
  EXPECT_EQ(options.headers, headers);
  EXPECT_EQ(options.max_in_flight, 7U);
  EXPECT_EQ(options.connect_timeout, milliseconds{1500});
  EXPECT_EQ(options.request_timeout, std::chrono::minutes{2});
  EXPECT_EQ(options.retry_statuses, (std::vector<int>{404, 409}));
  EXPECT_EQ(options.max_retry_after, std::chrono::seconds{90});
  EXPECT_EQ(options.max_message_bytes, 4096U);
  EXPECT_EQ(options.http_version, HttpVersion::kHttp1);
  EXPECT_EQ(options.tls_ca_file, ca.path());
  EXPECT_EQ(options.tls_cert_file, cert.path());
  EXPECT_EQ(options.tls_key_file, key.path());
  EXPECT_EQ(options.proxy, "http://proxy.internal:3128");
  EXPECT_EQ(options.envelope, EnvelopeStyle::kExternal);
  EXPECT_EQ(Described(settings),
            "url = \"http://127.0.0.1:8080/hooks/{target}/{topic}?type={type}\"\n"
            "method = \"PUT\"\n"
            "secrets = [\"***\", \"***\"]\n"
            "headers = { Authorization = \"***\", X-Team = \"***\" }\n"
            "max_in_flight = 7\n"
            "connect_timeout = \"1500ms\"\n"
            "request_timeout = \"2m\"\n"
            "retry_statuses = [404, 409]\n"
            "abandon_statuses = []\n"
            "max_retry_after = \"90s\"\n"
            "max_message_bytes = 4096\n"
            "http_version = \"1.1\"\n"
            "tls_ca_file = \"" +
                ca.path() +
                "\"\n"
                "tls_cert_file = \"" +
                cert.path() +
                "\"\n"
                "tls_key_file = \"" +
                key.path() +
                "\"\n"
                "proxy = \"http://proxy.internal:3128\"\n"
                "envelope = \"external\"\n");
  // Through a proxy, the proxy is what the readiness check probes.
  const auto endpoint = settings->Endpoint();
  ASSERT_TRUE(endpoint.has_value());
  EXPECT_EQ(endpoint->host, "proxy.internal");
  EXPECT_EQ(endpoint->port, 3128);

  // The other choices, one string as the secrets, headers as a table of their own.
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "http_version = \"2\"\n")).http_version,
            HttpVersion::kHttp2);
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "http_version = \"auto\"\n")).http_version,
            HttpVersion::kAuto);
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "method = \"POST\"\n")).method, "POST");
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "secrets = \"" + kSecret + "\"\n")).secrets,
            (std::vector<std::string>{kSecret}));
  EXPECT_TRUE(OptionsOf(ParseSink(Url() + "secrets = []\n")).secrets.empty());
  const auto table = ParseSink(Url() +
                               "[sinks.events.headers]\n"
                               "X-One = \"1\"\n"
                               "\"X-Two\" = \"\"\n");
  const std::vector<std::pair<std::string, std::string>> table_headers{{"X-One", "1"},
                                                                       {"X-Two", ""}};
  EXPECT_EQ(OptionsOf(table).headers, table_headers);
  // The limits themselves are accepted.
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "max_in_flight = 1\n")).max_in_flight, 1U);
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "max_in_flight = 10000\n")).max_in_flight, 10000U);
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "connect_timeout = \"1ms\"\n")).connect_timeout,
            milliseconds{1});
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "connect_timeout = \"10m\"\n")).connect_timeout,
            std::chrono::minutes{10});
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "request_timeout = \"1h\"\n")).request_timeout,
            std::chrono::hours{1});
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "max_retry_after = \"1s\"\n")).max_retry_after,
            std::chrono::seconds{1});
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "max_retry_after = \"24h\"\n")).max_retry_after,
            std::chrono::hours{24});
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "max_message_bytes = 67108864\n")).max_message_bytes,
            67108864U);
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "retry_statuses = [400, 408, 429, 499]\n")).retry_statuses,
            (std::vector<int>{400, 408, 429, 499}));
}

TEST(HttpSinkTypeTest, EnvelopeIsFullOrExternal) {
  testing::ExpectEnvelopeKey(Type(), Url(), [](const outbox::SinkSettings& settings) {
    return dynamic_cast<const SinkSettings&>(settings).options().envelope;
  });
  // With "external" the sink sends the message's type as `type`: no configured header may take
  // that name (any case); with "full" (outbox-type) it may.
  const auto [key, message] =
      ErrorOf(Url() + "envelope = \"external\"\nheaders = { Type = \"x\" }\n");
  EXPECT_EQ(key, "sinks.events.headers") << message;
  EXPECT_NE(message.find("'Type'"), std::string::npos) << message;
  EXPECT_NE(message.find("envelope = \"external\""), std::string::npos) << message;
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "headers = { type = \"x\" }\n")).headers.size(), 1U);
  // The outbox's own names cannot be configured in either style.
  for (const std::string name : {"event_id", "Event_Id", "message_id", "Outbox-Topic"}) {
    EXPECT_EQ(KeyOf(Url() + "headers = { " + name + " = \"x\" }\n"), "sinks.events.headers")
        << name;
  }
}

TEST(HttpSinkTypeTest, CloudEventsKeys) {
  testing::ExpectCloudEventsKeys(
      Type(), Url(),
      [](const outbox::SinkSettings& settings) {
        return dynamic_cast<const SinkSettings&>(settings).options().cloudevents;
      },
      {"binary", "structured"});
}

TEST(HttpSinkTypeTest, EndpointIsTheFixedHostOrNone) {
  auto endpoint = ParseSink("url = \"http://127.0.0.1:8080/hooks/{topic}\"\n")->Endpoint();
  ASSERT_TRUE(endpoint.has_value());
  EXPECT_EQ(endpoint->host, "127.0.0.1");
  EXPECT_EQ(endpoint->port, 8080);
  endpoint = ParseSink("url = \"http://hooks.example.com/x\"\n")->Endpoint();
  ASSERT_TRUE(endpoint.has_value());
  EXPECT_EQ(endpoint->host, "hooks.example.com");
  EXPECT_EQ(endpoint->port, 80);
  endpoint = ParseSink("url = \"https://user:pw@[::1]:8443/x\"\n")->Endpoint();
  ASSERT_TRUE(endpoint.has_value());
  EXPECT_EQ(endpoint->host, "::1");
  EXPECT_EQ(endpoint->port, 8443);
  // A placeholder before the path: no one endpoint to probe.
  EXPECT_FALSE(ParseSink("url = \"https://{target}.hooks.example.com/x\"\n")->Endpoint());
  EXPECT_FALSE(ParseSink("url = \"https://{target}/{topic}\"\n")->Endpoint());
  // ... unless through a proxy: then the proxy.
  endpoint = ParseSink("url = \"https://{target}/{topic}\"\nproxy = \"http://proxy.internal\"\n")
                 ->Endpoint();
  ASSERT_TRUE(endpoint.has_value());
  EXPECT_EQ(endpoint->host, "proxy.internal");
  EXPECT_EQ(endpoint->port, 80);
}

TEST(HttpSinkTypeTest, UrlAndSecretsFromTheEnvironment) {
  const std::string env_secrets = kSpecSecret + "  " + kSecret;
  const auto settings =
      ParseSink(Url() + "secrets = [\"" + kSecret + "\"]\n",
                {{"OUTBOX_SINK_EVENTS_URL", "https://relay:env-pass@env-host:9443/in/{topic}"},
                 {"OUTBOX_SINK_EVENTS_SECRETS", env_secrets}});
  const SinkOptions& options = OptionsOf(settings);
  EXPECT_EQ(options.url, "https://relay:env-pass@env-host:9443/in/{topic}");
  EXPECT_EQ(options.secrets, (std::vector<std::string>{kSpecSecret, kSecret}));
  EXPECT_EQ(settings->Endpoint()->host, "env-host");
  EXPECT_EQ(settings->Endpoint()->port, 9443);
  const std::string described = Described(settings);
  EXPECT_NE(described.find("url = \"https://relay:***@env-host:9443/in/{topic}\""),
            std::string::npos)
      << described;
  EXPECT_NE(described.find("secrets = [\"***\", \"***\"]"), std::string::npos) << described;
  EXPECT_EQ(described.find("env-pass"), std::string::npos) << described;
  EXPECT_EQ(described.find("whsec_"), std::string::npos) << described;

  // No url in the file at all: the environment's; no secrets in the file: the environment's.
  const auto env_only = ParseSink(
      "", {{"OUTBOX_SINK_EVENTS_URL", "http://h/x"}, {"OUTBOX_SINK_EVENTS_SECRETS", kSecret}});
  EXPECT_EQ(OptionsOf(env_only).url, "http://h/x");
  EXPECT_EQ(OptionsOf(env_only).secrets, (std::vector<std::string>{kSecret}));
  // Empty variables are unset.
  EXPECT_EQ(OptionsOf(ParseSink(Url(), {{"OUTBOX_SINK_EVENTS_URL", ""}})).url,
            "https://hooks.example.com/outbox/{topic}");
  // A sink name with '-' and lower case: OUTBOX_SINK_<NAME> upper-cased, '_' for '-'.
  EXPECT_EQ(SinkSecretEnv("audit-log", "secrets"), "OUTBOX_SINK_AUDIT_LOG_SECRETS");

  // A bad URL from the environment: the error says so, without the password.
  const auto [url_key, url_message] =
      ErrorOf(Url(), {{"OUTBOX_SINK_EVENTS_URL", "https://relay:env-pass@host:notaport/x"}});
  EXPECT_EQ(url_key, "sinks.events.url");
  EXPECT_NE(url_message.find("OUTBOX_SINK_EVENTS_URL"), std::string::npos) << url_message;
  EXPECT_EQ(url_message.find("env-pass"), std::string::npos) << url_message;
  // A bad secret from the environment: named, not quoted.
  const auto [secret_key, secret_message] =
      ErrorOf(Url(), {{"OUTBOX_SINK_EVENTS_SECRETS", kSecret + " whsec_c2hvcnQ="}});
  EXPECT_EQ(secret_key, "sinks.events.secrets");
  EXPECT_NE(secret_message.find("OUTBOX_SINK_EVENTS_SECRETS"), std::string::npos) << secret_message;
  EXPECT_NE(secret_message.find("secret 2"), std::string::npos) << secret_message;
  EXPECT_EQ(secret_message.find("c2hvcnQ"), std::string::npos) << secret_message;
  EXPECT_EQ(secret_message.find(kSecret.substr(6)), std::string::npos) << secret_message;
  // Blank (spaces only) is refused, not read as "unsigned".
  const auto [blank_key, blank_message] =
      ErrorOf(Url() + "secrets = [\"" + kSecret + "\"]\n", {{"OUTBOX_SINK_EVENTS_SECRETS", "   "}});
  EXPECT_EQ(blank_key, "sinks.events.secrets");
  EXPECT_NE(blank_message.find("holds no secret"), std::string::npos) << blank_message;
}

TEST(HttpSinkTypeTest, BadValuesNameTheirKey) {
  // url
  EXPECT_EQ(KeyOf(""), "sinks.events.url");
  EXPECT_NE(ErrorOf("").second.find("OUTBOX_SINK_EVENTS_URL"), std::string::npos);
  EXPECT_EQ(KeyOf("url = \"\"\n"), "sinks.events.url");
  EXPECT_EQ(KeyOf("url = 8080\n"), "sinks.events.url");
  EXPECT_EQ(KeyOf("url = \"hooks.example.com/x\"\n"), "sinks.events.url");
  EXPECT_EQ(KeyOf("url = \"ftp://hooks.example.com/x\"\n"), "sinks.events.url");
  EXPECT_EQ(KeyOf("url = \"amqp://hooks.example.com/x\"\n"), "sinks.events.url");
  EXPECT_EQ(KeyOf("url = \"http://:80/x\"\n"), "sinks.events.url");
  EXPECT_EQ(KeyOf("url = \"http://@/x\"\n"), "sinks.events.url");
  EXPECT_EQ(KeyOf("url = \"http://[::1/x\"\n"), "sinks.events.url");
  EXPECT_EQ(KeyOf("url = \"http://h:70000/x\"\n"), "sinks.events.url");
  EXPECT_EQ(KeyOf("url = \"http://h/x y\"\n"), "sinks.events.url");
  EXPECT_EQ(KeyOf("url = \"http://h/{nope}\"\n"), "sinks.events.url");
  EXPECT_EQ(KeyOf("url = \"http://h/{topic\"\n"), "sinks.events.url");
  EXPECT_EQ(KeyOf("url = \"http://h/topic}\"\n"), "sinks.events.url");
  EXPECT_EQ(KeyOf("url = \"http://h/{}\"\n"), "sinks.events.url");
  const auto [fragment_key, fragment] = ErrorOf("url = \"http://h/{topic}#part\"\n");
  EXPECT_EQ(fragment_key, "sinks.events.url");
  EXPECT_NE(fragment.find("fragment"), std::string::npos) << fragment;

  // The unknown key, with a suggestion when it is close.
  const auto [unknown, unknown_message] = ErrorOf(Url() + "secret = \"x\"\n");
  EXPECT_EQ(unknown, "sinks.events.secret");
  EXPECT_NE(unknown_message.find("did you mean"), std::string::npos) << unknown_message;
  const auto [far, far_message] = ErrorOf(Url() + "follow_redirects = true\n");
  EXPECT_EQ(far, "sinks.events.follow_redirects");
  EXPECT_NE(far_message.find("accepts"), std::string::npos) << far_message;

  // method
  EXPECT_EQ(KeyOf(Url() + "method = \"GET\"\n"), "sinks.events.method");
  EXPECT_EQ(KeyOf(Url() + "method = \"post\"\n"), "sinks.events.method");
  EXPECT_EQ(KeyOf(Url() + "method = \"PATCH\"\n"), "sinks.events.method");
  EXPECT_EQ(KeyOf(Url() + "method = 1\n"), "sinks.events.method");

  // secrets
  for (const std::string bad : {
           "\"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"",        // no whsec_
           "\"whsec_\"",                                  // nothing after it
           "\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS\"",   // not a multiple of 4
           "\"whsec_!!!!MfKQ9r8GKYqrTwjUPD8ILPZIo2La\"",  // not base64
           "\"whsec_AAECAwQFBgcICQoLDA0O\"",              // 15 bytes: too short
           "\"whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4"
           "OTo7PD0+P0A=\"",  // 65 bytes: too long
           "7",
           "[7]",
           "{ a = \"b\" }",
       }) {
    const auto [key, message] = ErrorOf(Url() + "secrets = " + bad + "\n");
    EXPECT_EQ(key, "sinks.events.secrets") << bad;
    // The secret itself is never quoted.
    if (bad.front() == '"' && bad.size() > 20) {
      EXPECT_EQ(message.find(bad.substr(7, 12)), std::string::npos) << message;
    }
  }
  // The second of two: named by its position.
  const auto [second_key, second] =
      ErrorOf(Url() + "secrets = [\"" + kSecret + "\", \"whsec_AAECAwQFBgcICQoLDA0O\"]\n");
  EXPECT_EQ(second_key, "sinks.events.secrets");
  EXPECT_NE(second.find("secret 2"), std::string::npos) << second;
  EXPECT_EQ(second.find("AAECAwQFBgcICQoLDA0O"), std::string::npos) << second;

  // headers
  for (const std::string bad : {
           R"({ "bad name" = "x" })",
           R"({ "bad:name" = "x" })",
           R"({ "" = "x" })",
           R"({ "X-Ünicode" = "x" })",
           R"({ content-type = "text/plain" })",
           R"({ Content-Type = "text/plain" })",
           R"({ Content-Length = "1" })",
           R"({ Host = "evil.example" })",
           R"({ Transfer-Encoding = "chunked" })",
           R"({ Connection = "close" })",
           R"({ Keep-Alive = "1" })",
           R"({ Upgrade = "h2c" })",
           R"({ TE = "trailers" })",
           R"({ Trailer = "x" })",
           R"({ Expect = "100-continue" })",
           R"({ Proxy-Authorization = "Basic eA==" })",
           R"({ webhook-id = "x" })",
           R"({ Webhook-Signature = "v1,x" })",
           R"({ webhook-timestamp = "1" })",
           R"({ outbox-topic = "x" })",
           R"({ OUTBOX-ATTEMPTS = "1" })",
           R"({ X-A = "line\r\nX-Injected: 1" })",
           R"({ X-A = "cr\r" })",
           R"({ X-A = "lf\n" })",
           R"({ X-A = "nul\u0000" })",
           R"({ X-A = 1 })",
           R"("X-A: 1")",
           R"(["X-A"])",
       }) {
    EXPECT_EQ(KeyOf(Url() + "headers = " + bad + "\n").rfind("sinks.events.headers", 0), 0U) << bad;
  }
  const auto [reserved_key, reserved] = ErrorOf(Url() + R"(headers = { Webhook-Id = "x" })"
                                                        "\n");
  EXPECT_EQ(reserved_key, "sinks.events.headers");
  EXPECT_NE(reserved.find("Webhook-Id"), std::string::npos) << reserved;

  // max_in_flight
  EXPECT_EQ(KeyOf(Url() + "max_in_flight = 0\n"), "sinks.events.max_in_flight");
  EXPECT_EQ(KeyOf(Url() + "max_in_flight = 10001\n"), "sinks.events.max_in_flight");
  EXPECT_EQ(KeyOf(Url() + "max_in_flight = -1\n"), "sinks.events.max_in_flight");
  EXPECT_EQ(KeyOf(Url() + "max_in_flight = \"64\"\n"), "sinks.events.max_in_flight");

  // durations
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"connect_timeout", "\"0s\""},
           {"connect_timeout", "\"0ms\""},
           {"connect_timeout", "\"11m\""},
           {"connect_timeout", "\"soon\""},
           {"connect_timeout", "5"},
           {"request_timeout", "\"0ms\""},
           {"request_timeout", "\"61m\""},
           {"request_timeout", "\"2h\""},
           {"request_timeout", "\"-1s\""},
           {"max_retry_after", "\"999ms\""},
           {"max_retry_after", "\"0s\""},
           {"max_retry_after", "\"25h\""},
           {"max_retry_after", "\"2d\""},
       }) {
    EXPECT_EQ(KeyOf(Url() + key + " = " + value + "\n"), "sinks.events." + key) << value;
  }

  // retry_statuses
  for (const std::string bad : {"[503]", "[500]", "[399]", "[200]", "[500, 404]", "[404, 503]",
                                "[\"404\"]", "404", "\"404\"", "[404.0]", "[[404]]"}) {
    EXPECT_EQ(KeyOf(Url() + "retry_statuses = " + bad + "\n"), "sinks.events.retry_statuses")
        << bad;
  }
  const auto [status_key, status_message] = ErrorOf(Url() + "retry_statuses = [404, 503]\n");
  EXPECT_NE(status_message.find("503"), std::string::npos) << status_message;

  // abandon_statuses (issue #40): 4xx or 5xx, never one that asks to wait, nor one retried.
  for (const std::string bad : {"[200]", "[399]", "[600]", "[408]", "[429]", "[503]", "[\"404\"]",
                                "404", "\"404\"", "[404.0]", "[[404]]", "{}"}) {
    EXPECT_EQ(KeyOf(Url() + "abandon_statuses = " + bad + "\n"), "sinks.events.abandon_statuses")
        << bad;
  }
  EXPECT_EQ(KeyOf(Url() + "retry_statuses = [404]\nabandon_statuses = [410, 404]\n"),
            "sinks.events.abandon_statuses");
  const auto [both_key, both_message] =
      ErrorOf(Url() + "retry_statuses = [404]\nabandon_statuses = [404]\n");
  EXPECT_NE(both_message.find("retry_statuses lists too"), std::string::npos) << both_message;
  const auto [wait_key, wait_message] = ErrorOf(Url() + "abandon_statuses = [429]\n");
  EXPECT_NE(wait_message.find("asks to wait"), std::string::npos) << wait_message;
  EXPECT_EQ(
      OptionsOf(ParseSink(Url() + "abandon_statuses = [404, 410, 501, 403]\n")).abandon_statuses,
      (std::vector<int>{404, 410, 501, 403}));

  // max_message_bytes
  EXPECT_EQ(KeyOf(Url() + "max_message_bytes = 0\n"), "sinks.events.max_message_bytes");
  EXPECT_EQ(KeyOf(Url() + "max_message_bytes = 67108865\n"), "sinks.events.max_message_bytes");
  EXPECT_EQ(KeyOf(Url() + "max_message_bytes = \"1MB\"\n"), "sinks.events.max_message_bytes");

  // http_version
  for (const std::string bad : {"\"3\"", "\"1.0\"", "\"http/2\"", "\"\"", "2", "2.0"}) {
    EXPECT_EQ(KeyOf(Url() + "http_version = " + bad + "\n"), "sinks.events.http_version") << bad;
  }

  // proxy
  for (const std::string bad : {"\"proxy.internal:3128\"", "\"socks5://proxy.internal:1080\"",
                                "\"http://\"", "\"http://proxy:99999\"", "3128"}) {
    EXPECT_EQ(KeyOf(Url() + "proxy = " + bad + "\n"), "sinks.events.proxy") << bad;
  }
  const auto [proxy_key, proxy_message] =
      ErrorOf(Url() + "proxy = \"ftp://relay:pr0xy-pass@proxy.internal:21\"\n");
  EXPECT_EQ(proxy_key, "sinks.events.proxy");
  EXPECT_EQ(proxy_message.find("pr0xy-pass"), std::string::npos) << proxy_message;

  // Strings where strings belong.
  EXPECT_EQ(KeyOf(Url() + "tls_ca_file = 1\n"), "sinks.events.tls_ca_file");
  EXPECT_EQ(KeyOf(Url() + "tls_cert_file = true\n"), "sinks.events.tls_cert_file");
  EXPECT_EQ(KeyOf(Url() + "tls_key_file = []\n"), "sinks.events.tls_key_file");
}

TEST(HttpSinkTypeTest, FilesMustBeReadableAndCertificatesComeWithTheirKeys) {
  for (const std::string key : {"tls_ca_file", "tls_cert_file", "tls_key_file"}) {
    const auto [error_key, message] =
        ErrorOf(Url() + key + " = \"/nonexistent/outbox-test/" + key + ".pem\"\n");
    EXPECT_EQ(error_key, "sinks.events." + key);
    EXPECT_NE(message.find("cannot read"), std::string::npos) << message;
    EXPECT_NE(message.find("/nonexistent/outbox-test/"), std::string::npos) << message;
  }
  const TempFile cert;
  EXPECT_EQ(KeyOf(Url() + "tls_cert_file = \"" + cert.path() + "\"\n"),
            "sinks.events.tls_key_file");
  EXPECT_EQ(KeyOf(Url() + "tls_key_file = \"" + cert.path() + "\"\n"),
            "sinks.events.tls_cert_file");
  // A readable CA file alone is fine.
  EXPECT_EQ(OptionsOf(ParseSink(Url() + "tls_ca_file = \"" + cert.path() + "\"\n")).tls_ca_file,
            cert.path());
}

// Whatever is wrong, an error message quotes neither a secret, nor the URL's password, nor a
// header's value.
TEST(HttpSinkTypeTest, ErrorsNeverQuoteSecrets) {
  const std::string secrets = "secrets = [\"" + kSecret + "\"]\n";
  const std::string headers = "headers = { Authorization = \"Bearer hdr-value-s3cr3t\" }\n";
  const std::string password_url = "url = \"https://relay:url-pa55word@hooks.example.com/{topic}";
  for (const std::string& body : {
           // Each with everything secret in it, and something else wrong.
           password_url + "\"\n" + secrets + headers + "max_in_flight = 0\n",
           password_url + "\"\n" + secrets + headers + "method = \"GET\"\n",
           password_url + "\"\n" + secrets + headers + "retry_statuses = [503]\n",
           password_url + "\"\n" + secrets + headers + "tls_cert_file = \"/nonexistent/c.pem\"\n",
           password_url + "\"\n" + secrets + headers + "proxy = \"socks5://p:1\"\n",
           password_url + "\"\n" + secrets + headers + "unknown = 1\n",
           password_url + "\"\n" + secrets +
               "headers = { Authorization = \"Bearer hdr-value-s3cr3t\", \"X Bad\" = \"1\" }\n",
           password_url + "\"\n" + secrets +
               "headers = { Authorization = \"Bearer hdr-value-s3cr3t\\r\\n\" }\n",
           password_url + "\"\n" + secrets +
               "headers = { Webhook-Id = \"Bearer hdr-value-s3cr3t\" }\n",
           password_url + "\"\n" + headers + "secrets = [\"whsec_hdr-value-s3cr3t\"]\n",
           // The URL itself is what is wrong.
           password_url + "#fragment\"\n" + secrets + headers,
           password_url + "/{nope}\"\n" + secrets + headers,
           password_url + "/{topic\"\n" + secrets + headers,
           password_url + "/topic}\"\n" + secrets + headers,
           "url = \"https://relay:url-pa55word@hooks.example.com:99999/{topic}\"\n" + secrets +
               headers,
           "url = \"gopher://relay:url-pa55word@hooks.example.com/{topic}\"\n" + secrets + headers,
           // A brace in the password itself.
           "url = \"https://relay:url-pa55word}@hooks.example.com/{topic}\"\n" + secrets + headers,
           "url = \"https://relay:{url-pa55word@hooks.example.com/{topic}\"\n" + secrets + headers,
       }) {
    const auto [key, message] = ErrorOf(body);
    EXPECT_FALSE(key.empty()) << body;
    EXPECT_EQ(message.find("url-pa55word"), std::string::npos) << message;
    EXPECT_EQ(message.find("hdr-value-s3cr3t"), std::string::npos) << message;
    EXPECT_EQ(message.find(kSecret.substr(6, 20)), std::string::npos) << message;
  }
  // A bad placeholder is still named, in the URL quoted with its password masked.
  const auto [key, message] = ErrorOf(password_url + "/{nope}\"\n");
  EXPECT_EQ(key, "sinks.events.url");
  EXPECT_NE(message.find("{nope}"), std::string::npos) << message;
  EXPECT_NE(message.find("https://relay:***@hooks.example.com/"), std::string::npos) << message;
  const auto [brace_key, brace] =
      ErrorOf("url = \"https://relay:url-pa55word}@hooks.example.com/{topic}\"\n");
  EXPECT_EQ(brace_key, "sinks.events.url");
  EXPECT_NE(brace.find("password"), std::string::npos) << brace;
}

TEST(HttpSinkTypeTest, DescribeMasksEverySecret) {
  const auto settings = ParseSink(
      "url = \"https://relay:url-pa55word@hooks.example.com/in/{topic}\"\n"
      "secrets = [\"" +
      kSecret + "\", \"" + kSpecSecret +
      "\"]\n"
      "headers = { Authorization = \"Bearer hdr-value-s3cr3t\", X-Api-Key = \"k3y\" }\n"
      "proxy = \"http://proxyuser:pr0xy-pass@proxy.internal:3128\"\n");
  const std::string described = Described(settings);
  EXPECT_NE(described.find("url = \"https://relay:***@hooks.example.com/in/{topic}\""),
            std::string::npos)
      << described;
  EXPECT_NE(described.find("secrets = [\"***\", \"***\"]\n"), std::string::npos) << described;
  EXPECT_NE(described.find("proxy = \"http://proxyuser:***@proxy.internal:3128\""),
            std::string::npos)
      << described;
  for (const std::string secret : {"url-pa55word", "hdr-value-s3cr3t", "k3y", "pr0xy-pass",
                                   "whsec_", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}) {
    EXPECT_EQ(described.find(secret), std::string::npos) << secret << " in\n" << described;
  }
}

// What the process's redactor gets from the table (core/secrets.h): every secret, in the forms an
// endpoint may quote it back in.
TEST(HttpSinkTypeTest, SecretsGivesEveryFormToRedact) {
  const auto settings = ParseSink(
      "url = \"https://relay:url-pa55word@hooks.example.com/in/{topic}\"\n"
      "secrets = [\"" +
      kSecret +
      "\"]\n"
      "headers = { Authorization = \"Basic YWRtaW46QkFTSUNQQVNTNTU=\", X-Api-Key = "
      "\"api-key-123456\" }\n"
      "proxy = \"http://proxyuser:pr0xy-pass@proxy.internal:3128\"\n");
  const std::vector<std::string> secrets = settings->Secrets();
  const auto has = [&secrets](const std::string& form) {
    return std::find(secrets.begin(), secrets.end(), form) != secrets.end();
  };
  for (const std::string form :
       {"url-pa55word", "relay:url-pa55word", "cmVsYXk6dXJsLXBhNTV3b3Jk", "pr0xy-pass",
        "Basic YWRtaW46QkFTSUNQQVNTNTU=", "YWRtaW46QkFTSUNQQVNTNTU=", "admin:BASICPASS55",
        "BASICPASS55", "api-key-123456"}) {
    EXPECT_TRUE(has(form)) << form;
  }
  EXPECT_TRUE(has(kSecret));
  EXPECT_TRUE(has(kSecret.substr(6)));  // the base64 after "whsec_"
}

// A placeholder's value stays inside its path segment: '/' encoded, and a value of dots only
// ("." and "..", which would be a dot segment) as %2E each.
TEST(HttpSinkTypeTest, PlaceholdersCannotLeaveTheirSegment) {
  EXPECT_EQ(EncodePlaceholder("."), "%2E");
  EXPECT_EQ(EncodePlaceholder(".."), "%2E%2E");
  EXPECT_EQ(EncodePlaceholder("..."), "%2E%2E%2E");
  EXPECT_EQ(EncodePlaceholder("a/b"), "a%2Fb");
  EXPECT_EQ(EncodePlaceholder("../x"), "..%2Fx");  // one segment, not a dot segment
  EXPECT_EQ(EncodePlaceholder("a.b"), "a.b");
  EXPECT_EQ(EncodePlaceholder(".hidden"), ".hidden");
  EXPECT_EQ(EncodePlaceholder("%2E"), "%252E");
  EXPECT_EQ(EncodePlaceholder(""), "");
}

// OpenSink checks what the parser checks, for programs that build SinkOptions themselves, and
// connects to nothing.
TEST(HttpSinkTypeTest, OpenSinkValidatesWithoutConnecting) {
  SinkOptions options;
  options.url = "http://127.0.0.1:1/hooks/{topic}";  // nobody listens: opening does not connect
  auto sink = OpenSink(options);
  ASSERT_NE(sink, nullptr);
  EXPECT_EQ(sink->Name(), "http");
  sink->Close();
  EXPECT_NO_THROW(ValidateOptions(options));

  const auto key_of = [](const SinkOptions& bad) -> std::string {
    try {
      OpenSink(bad);
    } catch (const ConfigError& error) {
      return error.key();
    }
    return "(no ConfigError)";
  };
  SinkOptions bad = options;
  bad.url = "";
  EXPECT_EQ(key_of(bad), "url");
  bad = options;
  bad.method = "DELETE";
  EXPECT_EQ(key_of(bad), "method");
  bad = options;
  bad.headers = {{"X-Ok", "1"}, {"Host", "x"}};
  EXPECT_EQ(key_of(bad), "headers");
  bad = options;
  bad.secrets = {"nope"};
  EXPECT_EQ(key_of(bad), "secrets");
  bad = options;
  bad.max_in_flight = 0;
  EXPECT_EQ(key_of(bad), "max_in_flight");
  bad = options;
  bad.connect_timeout = milliseconds{0};
  EXPECT_EQ(key_of(bad), "connect_timeout");
  bad = options;
  bad.request_timeout = milliseconds{0};
  EXPECT_EQ(key_of(bad), "request_timeout");
  bad = options;
  bad.retry_statuses = {500};
  EXPECT_EQ(key_of(bad), "retry_statuses");
  bad = options;
  bad.abandon_statuses = {429};
  EXPECT_EQ(key_of(bad), "abandon_statuses");
  bad = options;
  bad.abandon_statuses = {200};
  EXPECT_EQ(key_of(bad), "abandon_statuses");
  bad = options;
  bad.retry_statuses = {404};
  bad.abandon_statuses = {404};
  EXPECT_EQ(key_of(bad), "abandon_statuses");
  bad = options;
  bad.max_retry_after = milliseconds{999};
  EXPECT_EQ(key_of(bad), "max_retry_after");
  bad = options;
  bad.max_message_bytes = 0;
  EXPECT_EQ(key_of(bad), "max_message_bytes");
  bad = options;
  bad.tls_ca_file = "/nonexistent/ca.pem";
  EXPECT_EQ(key_of(bad), "tls_ca_file");
  bad = options;
  bad.proxy = "nope";
  EXPECT_EQ(key_of(bad), "proxy");
}

TEST(HttpSinkTypeTest, MaskUrlHidesOnlyThePassword) {
  EXPECT_EQ(MaskUrl("https://user:hunter2@hooks.example.com/x"),
            "https://user:***@hooks.example.com/x");
  EXPECT_EQ(MaskUrl("http://user:p%40ss:word@h:8080/a@b?c=d@e"),
            "http://user:***@h:8080/a@b?c=d@e");
  EXPECT_EQ(MaskUrl("https://token@hooks.example.com/x"), "https://token@hooks.example.com/x");
  EXPECT_EQ(MaskUrl("https://hooks.example.com/a:b@c"), "https://hooks.example.com/a:b@c");
  EXPECT_EQ(MaskUrl("https://hooks.example.com"), "https://hooks.example.com");
  EXPECT_EQ(MaskUrl(""), "");
}

// Standard Webhooks signatures, against values computed independently of this code.
TEST(HttpSignTest, KnownVectors) {
  // The example of the Standard Webhooks specification (and of its reference libraries):
  // secret whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, id msg_p5jXN8AQM9LWM0D4loKWxJek, timestamp
  // 1614265330, body {"test": 2432232314}. Checked with Python:
  //   python3 -c 'import base64,hmac,hashlib;
  //   k=base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
  //     print(base64.b64encode(hmac.new(k, b"msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330."
  //     b"{\"test\": 2432232314}", hashlib.sha256).digest()).decode())'
  EXPECT_EQ(
      Sign({kSpecSecret}, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, R"({"test": 2432232314})"),
      "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");

  // A body with NUL, an invalid UTF-8 byte, CR and LF, signed with kSecret (key: bytes 0..31) and
  // then both secrets (rotation: one signature per secret, in order). Computed with:
  //   python3 -c 'import base64,hmac,hashlib; m=b"01890a5d-ac96-7ab2-80e2-4536629c90de.1700000000."
  //     b"a\x00b\xff\r\n"; print(base64.b64encode(hmac.new(bytes(range(32)), m,
  //     hashlib.sha256).digest()).decode())'
  // (and the same with the key base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")).
  const std::string body{"a\0b\xff\r\n", 6};
  const std::string id = "01890a5d-ac96-7ab2-80e2-4536629c90de";
  EXPECT_EQ(Sign({kSecret}, id, 1700000000, body),
            "v1,3BFqaN2Ltt/8K5yIuYmNFpPNVrU3v3G24s2Q2pVxi0U=");
  EXPECT_EQ(Sign({kSecret, kSpecSecret}, id, 1700000000, body),
            "v1,3BFqaN2Ltt/8K5yIuYmNFpPNVrU3v3G24s2Q2pVxi0U= "
            "v1,Z6reTvY8vYuJ9vJDhsct5SC7HuDAodq1g8GsCQvRtMY=");
  // An empty body: python3 -c '...hmac.new(bytes(range(32)), b"id.0.", hashlib.sha256)...'
  EXPECT_EQ(Sign({kSecret}, "id", 0, ""), "v1,u+jM393lOM6OGACLZrm7FfUsENahWipUTYgiDCB1LxQ=");
  // No secret: no signature.
  EXPECT_EQ(Sign({}, id, 1700000000, body), "");
  // Any change to the id, the timestamp or the body changes it.
  const std::string base = Sign({kSecret}, id, 1700000000, body);
  EXPECT_NE(Sign({kSecret}, id + "x", 1700000000, body), base);
  EXPECT_NE(Sign({kSecret}, id, 1700000001, body), base);
  EXPECT_NE(Sign({kSecret}, id, 1700000000, body + " "), base);
  // The shortest and longest keys taken: 16 and 64 bytes.
  EXPECT_EQ(Sign({"whsec_AAECAwQFBgcICQoLDA0ODw=="}, "i", 1, "b").rfind("v1,", 0), 0U);
  EXPECT_EQ(Sign({"whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1"
                  "Njc4OTo7PD0+Pw=="},
                 "i", 1, "b")
                .rfind("v1,", 0),
            0U);
}

TEST(HttpSignTest, BadSecretsThrowWithoutQuotingThem) {
  for (const std::string& bad : {
           std::string{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},        // no prefix
           std::string{"WHSEC_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},  // the prefix in upper case
           std::string{"whsec_"},                                  // nothing after it
           std::string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLa"},    // not a multiple of 4
           std::string{"whsec_MfKQ9r8GKYqr$wjUPD8ILPZIo2LaLaSw"},  // not base64
           std::string{"whsec_AAECAwQFBgcICQoLDA0O"},              // 15 bytes
           std::string{"whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEy"
                       "MzQ1Njc4OTo7PD0+P0A="},  // 65 bytes
       }) {
    try {
      Sign({bad}, "id", 1, "body");
      ADD_FAILURE() << "no std::invalid_argument for " << bad;
    } catch (const std::invalid_argument& error) {
      const std::string message = error.what();
      if (bad.size() > 8) {
        EXPECT_EQ(message.find(bad.substr(bad.size() - 8)), std::string::npos) << message;
      }
    }
  }
  // A bad second secret is named by its position.
  try {
    Sign({kSecret, "whsec_AAECAwQFBgcICQoLDA0O"}, "id", 1, "body");
    ADD_FAILURE() << "no std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string{error.what()}.find("secret 2"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace outbox::webhook
