// The CloudEvents mapping shared by every sink (sink/cloudevents.h, issue #43): the attributes of
// an envelope, which user headers become extensions, the structured JSON event, the HTTP
// binding's percent-encoding and the checks of the options. No server.
#include "outbox/sink/cloudevents.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "outbox/core/error.h"

namespace outbox::cloudevents {
namespace {

Envelope MakeEnvelope() {
  Envelope envelope;
  envelope.id = Uuid::Parse("0191f2a0-0000-7000-8000-000000000001").value();
  envelope.topic = "orders";
  envelope.target = "billing";
  envelope.payload = R"({"n":1})";
  envelope.created_at =
      std::chrono::system_clock::time_point{std::chrono::milliseconds{1700000000123}};
  return envelope;
}

std::map<std::string, std::string> AttributesOf(const Envelope& envelope,
                                                const Options& options = {}) {
  std::vector<Attribute> list;
  const Mapper mapper{options};
  EXPECT_FALSE(mapper.Attributes(envelope, list).has_value());
  std::map<std::string, std::string> by_name;
  for (const Attribute& attribute : list) {
    EXPECT_TRUE(by_name.emplace(attribute.name, attribute.value).second) << attribute.name;
    EXPECT_TRUE(IsLegalName(attribute.name)) << attribute.name;
  }
  return by_name;
}

TEST(CloudEventsTest, MinimalEnvelope) {
  const Envelope envelope = MakeEnvelope();
  const std::map<std::string, std::string> expected = {
      {"specversion", "1.0"},
      {"id", "0191f2a0-0000-7000-8000-000000000001"},
      {"source", "/outbox/billing"},
      {"type", "orders"},  // no type: the topic
      {"time", "2023-11-14T22:13:20.123Z"},
      {"datacontenttype", "application/json"},
      {"eventid", "0191f2a0-0000-7000-8000-000000000001"},
      {"partition", "0"},
  };
  EXPECT_EQ(AttributesOf(envelope), expected);
}

TEST(CloudEventsTest, FullEnvelopeAndTheHeaderRule) {
  Envelope envelope = MakeEnvelope();
  envelope.event_id = Uuid::Parse("0191f2a0-0000-7000-8000-0000000000ff").value();
  envelope.type = "OrderPlaced";
  envelope.stream_key = "order-9";
  envelope.stream_seq = 5000000000;  // over 32 bits: a string
  envelope.stream_prev_seq = 4;
  envelope.partition = 7;
  envelope.database = "tenant-7";  // a relay serving several databases
  envelope.content_type.clear();
  envelope.headers = {
      {"traceparent", "00-ab-cd-01"},   // legal: as it is
      {"correlation_id", "c1"},         // well-known: correlationid
      {"correlationid", "shadowed"},    // its name is taken by correlation_id
      {"causation_id", "c0"},           // causationid
      {"tenant_id", "t1"},              // tenantid
      {"X-Trace-Id", "x"},              // upper case and '-': left out
      {"user_agent", "x"},              // '_': left out
      {"averyveryverylongname1", "x"},  // over 20 characters: left out
      {"id", "x"},                      // an attribute's name: left out
      {"source", "x"},                  // the same
      {"data", "x"},                    // reserved by the spec
      {"partition", "x"},               // an extension the mapping sets
      {"outboxdatabase", "forged"},     // the same
      {"region2", "eu"},                // legal
  };
  Options options;
  options.source = "urn:shop:{topic}:{type}";
  const std::map<std::string, std::string> expected = {
      {"specversion", "1.0"},
      {"id", "0191f2a0-0000-7000-8000-000000000001"},
      {"source", "urn:shop:orders:OrderPlaced"},
      {"type", "OrderPlaced"},
      {"time", "2023-11-14T22:13:20.123Z"},
      {"subject", "order-9"},
      {"eventid", "0191f2a0-0000-7000-8000-0000000000ff"},
      {"streamseq", "5000000000"},
      {"streamprevseq", "4"},
      {"outboxdatabase", "tenant-7"},
      {"partition", "7"},
      {"traceparent", "00-ab-cd-01"},
      {"correlationid", "c1"},
      {"causationid", "c0"},
      {"tenantid", "t1"},
      {"region2", "eu"},
  };
  EXPECT_EQ(AttributesOf(envelope, options), expected);
}

TEST(CloudEventsTest, ExtensionNames) {
  EXPECT_EQ(ExtensionName("traceparent"), "traceparent");
  EXPECT_EQ(ExtensionName("tracestate"), "tracestate");
  EXPECT_EQ(ExtensionName("correlation_id"), "correlationid");
  EXPECT_EQ(ExtensionName("X-Trace-Id"), std::nullopt);
  EXPECT_EQ(ExtensionName("Traceparent"), std::nullopt);
  EXPECT_EQ(ExtensionName("message_id"), std::nullopt);
  EXPECT_EQ(ExtensionName("outbox-topic"), std::nullopt);
  EXPECT_EQ(ExtensionName("specversion"), std::nullopt);
  EXPECT_EQ(ExtensionName("streamprevseq"), std::nullopt);
  EXPECT_EQ(ExtensionName("outboxdatabase"), std::nullopt);
  EXPECT_EQ(ExtensionName("a2345678901234567890"), "a2345678901234567890");  // 20: legal
  EXPECT_EQ(ExtensionName("a23456789012345678901"), std::nullopt);
  EXPECT_EQ(ExtensionName(""), std::nullopt);
}

TEST(CloudEventsTest, StructuredJsonEmbedsJsonElseTextElseBase64) {
  Envelope envelope = MakeEnvelope();
  envelope.headers = {{"traceparent", "00-ab-cd-01"}};
  const Mapper mapper{Options{.mode = Mode::kStructured, .source = "/s"}};
  std::string out;
  ASSERT_FALSE(mapper.StructuredJson(envelope, out).has_value());
  EXPECT_EQ(out,
            R"({"specversion":"1.0","id":"0191f2a0-0000-7000-8000-000000000001","source":"/s",)"
            R"("type":"orders","time":"2023-11-14T22:13:20.123Z",)"
            R"("datacontenttype":"application/json",)"
            R"("eventid":"0191f2a0-0000-7000-8000-000000000001","partition":"0",)"
            R"("traceparent":"00-ab-cd-01","data":{"n":1}})");
  // From a relay serving several databases: after the stream extensions, before partition.
  envelope.database = "tenant-7";
  ASSERT_FALSE(mapper.StructuredJson(envelope, out).has_value());
  EXPECT_NE(out.find(R"("eventid":"0191f2a0-0000-7000-8000-000000000001",)"
                     R"("outboxdatabase":"tenant-7","partition":"0",)"),
            std::string::npos)
      << out;
  envelope.database.clear();
  envelope.payload = "{not json";
  ASSERT_FALSE(mapper.StructuredJson(envelope, out).has_value());
  EXPECT_NE(out.find(R"("data":"{not json")"), std::string::npos) << out;
  envelope.content_type = "application/octet-stream";
  envelope.payload = std::string("\x00\xff", 2);
  ASSERT_FALSE(mapper.StructuredJson(envelope, out).has_value());
  EXPECT_NE(out.find(R"("data_base64":"AP8=")"), std::string::npos) << out;
}

TEST(CloudEventsTest, EmptySourceIsAReasonNotAnEvent) {
  const Mapper mapper{Options{.mode = Mode::kBinary, .source = "{type}"}};
  std::vector<Attribute> list;
  const auto error = mapper.Attributes(MakeEnvelope(), list);
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("empty source"), std::string::npos) << *error;
  std::string out;
  EXPECT_TRUE(mapper.StructuredJson(MakeEnvelope(), out).has_value());
}

TEST(CloudEventsTest, BadOptionsThrowConfigErrorNamingTheKey) {
  for (const std::string& source : std::vector<std::string>{"", "/a/{nope}", "/a}", "/a\nb"}) {
    try {
      ValidateOptions(Options{.mode = Mode::kBinary, .source = source});
      ADD_FAILURE() << "accepted source '" << source << "'";
    } catch (const ConfigError& error) {
      EXPECT_EQ(error.key(), "cloudevents_source") << error.what();
    }
  }
  EXPECT_NO_THROW(ValidateOptions(Options{}));
}

TEST(CloudEventsTest, PercentEncodingOfTheHttpBinding) {
  EXPECT_EQ(PercentEncodeHeaderValue("Euro \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "Euro%20%E2%82%AC%20%F0%9F%98%80");  // the binding's own example
  EXPECT_EQ(PercentEncodeHeaderValue(R"(a"b%c)"), "a%22b%25c");
  EXPECT_EQ(PercentEncodeHeaderValue("00-ab-cd-01:/?=&"), "00-ab-cd-01:/?=&");
}

}  // namespace
}  // namespace outbox::cloudevents
