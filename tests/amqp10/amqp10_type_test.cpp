// The AMQP 1.0 sink type for outboxd: [sinks.<name>] type = "amqp10" read from TOML, every input
// path's bad value refused by its key, secrets masked, and the classification of the broker's
// answers (classify.h). No broker: runs in the unit tier.
#include "outbox/sink/amqp10_type.h"

#include <gtest/gtest.h>

#include <string>

#include "classify.h"
#include "outbox/core/failure.h"
#include "support/sink_type_test.h"

namespace outbox::amqp10 {
namespace {

const std::string kUrl = "url = \"amqp://guest:guest@127.0.0.1:5672\"\n";

const SinkOptions& Options(const outbox::SinkSettings& settings) {
  return dynamic_cast<const SinkSettings&>(settings).options();
}

TEST(Amqp10SinkTypeTest, ReadsEveryKey) {
  const auto settings =
      testing::ParseSinkTable(Type(), kUrl +
                                          "address = \"/exchange/events/{topic}\"\n"
                                          "sasl_mechanisms = \"PLAIN ANONYMOUS\"\n"
                                          "max_in_flight = 50\n"
                                          "connect_timeout = \"2s\"\n"
                                          "idle_timeout = \"0s\"\n"
                                          "max_message_bytes = 262144\n"
                                          "durable = false\n");
  const SinkOptions& options = Options(*settings);
  EXPECT_EQ(options.address, "/exchange/events/{topic}");
  EXPECT_EQ(options.sasl_mechanisms, "PLAIN ANONYMOUS");
  EXPECT_EQ(options.max_in_flight, 50U);
  EXPECT_EQ(options.connect_timeout, std::chrono::seconds{2});
  EXPECT_EQ(options.idle_timeout, std::chrono::milliseconds{0});
  EXPECT_EQ(options.max_message_bytes, 262144U);
  EXPECT_FALSE(options.durable);
  // --check-config's text is a valid table that reads back the same.
  const std::string described = testing::DescribeSink(settings);
  EXPECT_EQ(testing::DescribeSink(testing::ParseSinkTable(Type(), described)), described);
}

TEST(Amqp10SinkTypeTest, EnvelopeIsFullOrExternal) {
  testing::ExpectEnvelopeKey(Type(), kUrl, [](const outbox::SinkSettings& settings) {
    return Options(settings).envelope;
  });
}

TEST(Amqp10SinkTypeTest, CloudEventsKeys) {
  testing::ExpectCloudEventsKeys(
      Type(), kUrl,
      [](const outbox::SinkSettings& settings) { return Options(settings).cloudevents; },
      {"binary", "structured"});
}

// Service Bus as it is: a SAS key name and key (base64, with '/', '+' and '=') as SASL PLAIN.
TEST(Amqp10SinkTypeTest, ServiceBusShapeWorksAndItsKeyIsMasked) {
  const std::string key = "Zm9v%2Fbar%2Bbaz%3D";  // "foo/bar+baz=" percent-encoded
  const auto settings = testing::ParseSinkTable(
      Type(), "url = \"amqps://RootManageSharedAccessKey:" + key +
                  "@contoso.servicebus.windows.net\"\naddress = \"orders\"\n");
  const Endpoint endpoint = ParseUrl(Options(*settings).url);
  EXPECT_TRUE(endpoint.tls);
  EXPECT_EQ(endpoint.port, 5671);
  EXPECT_EQ(endpoint.user, "RootManageSharedAccessKey");
  EXPECT_EQ(endpoint.password, "Zm9v/bar+baz=");
  const std::string described = testing::DescribeSink(settings);
  EXPECT_EQ(described.find(key), std::string::npos) << described;
  EXPECT_NE(described.find("amqps://RootManageSharedAccessKey:***@contoso.servicebus.windows.net"),
            std::string::npos)
      << described;
  ASSERT_TRUE(settings->Endpoint());
  EXPECT_EQ(settings->Endpoint()->host, "contoso.servicebus.windows.net");
  EXPECT_EQ(settings->Endpoint()->port, 5671);
  bool found = false;
  for (const std::string& secret : settings->Secrets()) found |= secret == "Zm9v/bar+baz=";
  EXPECT_TRUE(found) << "the decoded key is not among the secrets to redact";
}

TEST(Amqp10SinkTypeTest, PasswordFromTheEnvironmentWins) {
  const auto settings =
      testing::ParseSinkTable(Type(), kUrl, {{"OUTBOX_SINK_EVENTS_URL", "amqp://u:s3cret@h:1234"}});
  EXPECT_EQ(ParseUrl(Options(*settings).url).password, "s3cret");
  EXPECT_EQ(testing::DescribeSink(settings).find("s3cret"), std::string::npos);
}

struct BadInput {
  std::string body;
  std::string key;
  std::string says;
};

TEST(Amqp10SinkTypeTest, BadInputIsRefusedByItsKey) {
  const std::vector<BadInput> cases{
      {"", "sinks.events.url", "required"},
      {"url = \"http://h:5672\"\n", "sinks.events.url", "amqp://"},
      {"url = \"amqp://h:99999\"\n", "sinks.events.url", "port"},
      {"url = \"amqp://u:pw@h:5672/orders\"\n", "sinks.events.url", "path"},
      {"url = \"amqp://u:p%zz@h\"\n", "sinks.events.url", "hex"},
      {"url = \"amqp://h\"\ntls_ca_file = \"/etc/hostname\"\n", "sinks.events.url", "amqps"},
      {kUrl + "address = \"/queue/{topic\"\n", "sinks.events.address", "{"},
      {kUrl + "address = \"/queue/{stream}\"\n", "sinks.events.address", "{"},
      {kUrl + "address = \"\"\n", "sinks.events.address", "empty"},
      {kUrl + "sasl_mechanisms = \"GSSAPI\"\n", "sinks.events.sasl_mechanisms", "GSSAPI"},
      {"url = \"amqp://h\"\nsasl_mechanisms = \"PLAIN\"\n", "sinks.events.sasl_mechanisms", "user"},
      {kUrl + "max_in_flight = 0\n", "sinks.events.max_in_flight", ""},
      {kUrl + "max_in_flight = 100001\n", "sinks.events.max_in_flight", ""},
      {kUrl + "connect_timeout = \"0s\"\n", "sinks.events.connect_timeout", ""},
      {kUrl + "idle_timeout = \"10ms\"\n", "sinks.events.idle_timeout", "100ms"},
      {kUrl + "idle_timeout = \"2h\"\n", "sinks.events.idle_timeout", ""},
      {kUrl + "max_message_bytes = 0\n", "sinks.events.max_message_bytes", ""},
      {kUrl + "durable = \"yes\"\n", "sinks.events.durable", ""},
      {kUrl + "exchange = \"x\"\n", "sinks.events.exchange", ""},
      {"url = \"amqps://h\"\ntls_ca_file = \"/no/such/ca.pem\"\n", "sinks.events.tls_ca_file",
       "readable"},
      {"url = \"amqps://h\"\ntls_cert_file = \"/etc/hostname\"\n", "sinks.events.tls_key_file",
       "together"},
  };
  for (const BadInput& input : cases) {
    const auto [key, message] = testing::SinkTableError(Type(), input.body);
    EXPECT_EQ(key, input.key) << input.body << " -> " << message;
    EXPECT_NE(message.find(input.says), std::string::npos) << input.body << " -> " << message;
  }
}

// A bad URL's message never quotes the password.
TEST(Amqp10SinkTypeTest, UrlErrorsDoNotQuoteThePassword) {
  const auto [key, message] =
      testing::SinkTableError(Type(), "url = \"amqp://u:hunter2@h:70000\"\n");
  EXPECT_EQ(key, "sinks.events.url");
  EXPECT_EQ(message.find("hunter2"), std::string::npos) << message;
}

TEST(Amqp10UrlTest, MasksOnlyThePassword) {
  EXPECT_EQ(MaskUrl("amqp://u:p@h:1"), "amqp://u:***@h:1");
  EXPECT_EQ(MaskUrl("amqps://u:p@ss@h"), "amqps://u:***@h");
  EXPECT_EQ(MaskUrl("amqp://u@h"), "amqp://u@h");
  EXPECT_EQ(MaskUrl("amqp://h:5672"), "amqp://h:5672");
  EXPECT_EQ(ParseUrl("amqp://[::1]:5673").Describe(), "amqp://[::1]:5673");
  EXPECT_EQ(ParseUrl("amqps://h").Describe(), "amqps://h:5671");
}

// The table of sink/amqp10.h, row by row.
TEST(Amqp10ClassifyTest, Dispositions) {
  EXPECT_FALSE(ClassifyDisposition(Disposition::kAccepted, "", ""));
  const auto rejected = ClassifyDisposition(Disposition::kRejected, "amqp:precondition-failed",
                                            "queue full (reject-publish)");
  ASSERT_TRUE(rejected);
  EXPECT_EQ(rejected->kind, FailureKind::kRejected);
  EXPECT_NE(rejected->reason.find("amqp:precondition-failed: queue full"), std::string::npos);
  EXPECT_EQ(ClassifyDisposition(Disposition::kRejected, "", "")->kind, FailureKind::kRejected);
  EXPECT_EQ(ClassifyDisposition(Disposition::kReleased, "", "")->kind, FailureKind::kRejected);
  EXPECT_EQ(ClassifyDisposition(Disposition::kModified, "", "")->kind, FailureKind::kRejected);
  EXPECT_EQ(ClassifyDisposition(Disposition::kRejected, "amqp:unauthorized-access", "no")->kind,
            FailureKind::kUnavailable);
  EXPECT_EQ(ClassifyDisposition(Disposition::kRejected, "amqp:resource-limit-exceeded", "")->kind,
            FailureKind::kUnavailable);
  EXPECT_EQ(
      ClassifyDisposition(Disposition::kRejected, "amqp:link:message-size-exceeded", "")->kind,
      FailureKind::kPermanent);
}

TEST(Amqp10ClassifyTest, LinkRefusals) {
  const Failure missing = ClassifyLinkRefusal("/exchange/x/k", "amqp:not-found", "no exchange 'x'");
  EXPECT_EQ(missing.kind, FailureKind::kRejected);
  EXPECT_NE(missing.reason.find("'/exchange/x/k'"), std::string::npos) << missing.reason;
  EXPECT_NE(missing.reason.find("amqp:not-found: no exchange 'x'"), std::string::npos);
  EXPECT_EQ(ClassifyLinkRefusal("q", "amqp:unauthorized-access", "").kind,
            FailureKind::kUnavailable);
  EXPECT_EQ(ClassifyLinkRefusal("q", "", "").kind, FailureKind::kRejected);
}

}  // namespace
}  // namespace outbox::amqp10
