#include "json_line.h"

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

namespace outbox::file {
namespace {

using namespace std::chrono_literals;

TEST(JsonLineTest, Base64MatchesRfc4648Vectors) {
  EXPECT_EQ(Base64Encode(""), "");
  EXPECT_EQ(Base64Encode("f"), "Zg==");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_EQ(Base64Encode("foo"), "Zm9v");
  EXPECT_EQ(Base64Encode("foob"), "Zm9vYg==");
  EXPECT_EQ(Base64Encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(Base64Encode(std::string("\x00\xff\xfe", 3)), "AP/+");
}

TEST(JsonLineTest, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_TRUE(IsValidUtf8(std::string("nul\0inside", 10)));
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));              // truncated
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));      // overlong
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // surrogate U+D800
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe2\x82"));          // truncated at the end
  EXPECT_FALSE(IsValidUtf8("a\x80z"));            // stray continuation byte
}

TEST(JsonLineTest, JsonContentTypeRecognition) {
  EXPECT_TRUE(IsJsonContentType("application/json"));
  EXPECT_TRUE(IsJsonContentType("Application/JSON"));
  EXPECT_TRUE(IsJsonContentType("application/json; charset=utf-8"));
  EXPECT_TRUE(IsJsonContentType(" application/json ;charset=utf-8"));
  EXPECT_FALSE(IsJsonContentType("application/jsonx"));
  EXPECT_FALSE(IsJsonContentType("text/plain"));
  EXPECT_FALSE(IsJsonContentType("application/x-protobuf"));
  EXPECT_FALSE(IsJsonContentType(""));
}

TEST(JsonLineTest, EmbeddableJsonKeepsEveryValue) {
  EXPECT_TRUE(JsonPayloadIsEmbeddable(R"({"a": [1, -2, 3.25, 1e10, "x]]]{{{\"", null]})"));
  EXPECT_TRUE(JsonPayloadIsEmbeddable("18446744073709551615"));   // uint64 max
  EXPECT_TRUE(JsonPayloadIsEmbeddable("-9223372036854775808"));   // int64 min
  EXPECT_FALSE(JsonPayloadIsEmbeddable("18446744073709551616"));  // would become a double
  EXPECT_FALSE(JsonPayloadIsEmbeddable("-9223372036854775809"));
  EXPECT_FALSE(JsonPayloadIsEmbeddable("0.12345678901234567"));  // more than 15 digits
  EXPECT_TRUE(JsonPayloadIsEmbeddable("1.50000000000000000000"));
  EXPECT_FALSE(JsonPayloadIsEmbeddable("1e400"));
  EXPECT_FALSE(JsonPayloadIsEmbeddable("1e-400"));
  EXPECT_TRUE(JsonPayloadIsEmbeddable(std::string(kMaxEmbeddedJsonDepth, '[') +
                                      std::string(kMaxEmbeddedJsonDepth, ']')));
  EXPECT_FALSE(JsonPayloadIsEmbeddable(std::string(kMaxEmbeddedJsonDepth + 1, '[') +
                                       std::string(kMaxEmbeddedJsonDepth + 1, ']')));
}

Envelope Sample() {
  Envelope envelope;
  envelope.id = *Uuid::Parse("0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b");
  envelope.topic = "orders";
  envelope.partition = 7;
  envelope.created_at = TimePoint{} + 1500ms;
  return envelope;
}

nlohmann::json Render(const Envelope& envelope) {
  std::string line;
  AppendJsonLine(envelope, line);
  EXPECT_FALSE(line.empty());
  EXPECT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1) << "exactly one line";
  return nlohmann::json::parse(line);
}

TEST(JsonLineTest, KeysInDocumentedOrderWithNullsForAbsentFields) {
  std::string line;
  AppendJsonLine(Sample(), line);
  EXPECT_EQ(
      line,
      R"({"id":"0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b",)"
      R"("event_id":"0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b","topic":"orders","stream_key":null,)"
      R"("stream_seq":null,"partition":7,"target":"default","type":null,)"
      R"("content_type":"application/json","headers":{},"attempts":0,)"
      R"("created_at":"1970-01-01T00:00:01.500Z","payload":""})"
      "\n");
}

TEST(JsonLineTest, EventIdIsTheSharedIdOrTheMessagesOwn) {
  Envelope envelope = Sample();
  EXPECT_EQ(Render(envelope)["event_id"], "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b");
  envelope.event_id = *Uuid::Parse("0190a1b2-c3d4-7e5f-8a6b-000000000001");
  const nlohmann::json line = Render(envelope);
  EXPECT_EQ(line["id"], "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b");
  EXPECT_EQ(line["event_id"], "0190a1b2-c3d4-7e5f-8a6b-000000000001");
}

TEST(JsonLineTest, ReservedHeaderNamesAreLeftOut) {
  Envelope envelope = Sample();
  envelope.headers = {{"event_id", "forged"},       {"Event_Id", "forged"},
                      {"message_id", "forged"},     {"outbox-topic", "forged"},
                      {"Outbox-Attempts", "9"},     {"correlation_id", "corr-1"},
                      {"event_idx", "not reserved"}};
  const nlohmann::json line = Render(envelope);
  const nlohmann::json expected = {{"correlation_id", "corr-1"}, {"event_idx", "not reserved"}};
  EXPECT_EQ(line["headers"], expected);
  EXPECT_EQ(line["event_id"], "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b");
}

TEST(JsonLineTest, ExternalStyleLeavesOutTheInternalKeys) {
  Envelope envelope = Sample();
  envelope.event_id = *Uuid::Parse("0190a1b2-c3d4-7e5f-8a6b-000000000001");
  envelope.stream_key = "order-42";
  envelope.stream_seq = 7;
  envelope.stream_prev_seq = 4;
  envelope.target = "audit";
  envelope.database = "tenant-7";
  envelope.attempts = 3;
  envelope.type = "OrderPlaced";
  envelope.headers = {{"correlation_id", "corr-1"}, {"outbox-partition", "forged"}};
  envelope.payload = R"({"n":1})";
  std::string line;
  AppendJsonLine(envelope, line, EnvelopeStyle::kExternal);
  EXPECT_EQ(line, R"({"id":"0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b",)"
                  R"("event_id":"0190a1b2-c3d4-7e5f-8a6b-000000000001","type":"OrderPlaced",)"
                  R"("content_type":"application/json","headers":{"correlation_id":"corr-1"},)"
                  R"("created_at":"1970-01-01T00:00:01.500Z","payload":{"n":1}})"
                  "\n");
  // The full style (the default) has them all.
  line.clear();
  AppendJsonLine(envelope, line, EnvelopeStyle::kFull);
  const nlohmann::json full = nlohmann::json::parse(line);
  for (const char* key : {"topic", "stream_key", "stream_seq", "stream_prev_seq", "partition",
                          "target", "database", "attempts"}) {
    EXPECT_TRUE(full.contains(key)) << key;
  }
}

TEST(JsonLineTest, StreamPrevSeqOnlyWhenSet) {
  Envelope envelope = Sample();
  envelope.stream_key = "order-42";
  envelope.stream_seq = 7;
  EXPECT_FALSE(Render(envelope).contains("stream_prev_seq"));
  envelope.stream_prev_seq = 4;
  std::string line;
  AppendJsonLine(envelope, line);
  EXPECT_NE(line.find(R"("stream_seq":7,"stream_prev_seq":4,"partition":7,)"), std::string::npos)
      << line;
  envelope.stream_prev_seq = 0;  // every earlier message of the stream was abandoned
  EXPECT_EQ(Render(envelope).at("stream_prev_seq"), 0);
}

// The database a message was read from: only from a relay serving several databases (an empty
// name is no key at all), right after the target.
TEST(JsonLineTest, DatabaseOnlyWhenSet) {
  Envelope envelope = Sample();
  EXPECT_FALSE(Render(envelope).contains("database"));
  envelope.database = "tenant-7";
  std::string line;
  AppendJsonLine(envelope, line);
  EXPECT_NE(line.find(R"("target":"default","database":"tenant-7","type":null,)"),
            std::string::npos)
      << line;
}

TEST(JsonLineTest, PayloadEmbeddedOnlyWhenItIsExactJson) {
  Envelope envelope = Sample();
  envelope.payload = R"({"b": 1, "a": [true, 2.5]})";
  EXPECT_EQ(Render(envelope)["payload"], nlohmann::json::parse(envelope.payload));
  std::string line;
  AppendJsonLine(envelope, line);
  EXPECT_NE(line.find(R"("payload":{"b":1,"a":[true,2.5]})"), std::string::npos)
      << "object key order is kept: " << line;

  envelope.payload = "{not json";
  EXPECT_EQ(Render(envelope)["payload"], "{not json");

  envelope.payload = R"({"big": 123456789012345678901234567890})";
  EXPECT_EQ(Render(envelope)["payload"], envelope.payload) << "kept as text, not rounded";

  envelope.payload = R"({"a": 1})";
  envelope.content_type = "text/plain";
  EXPECT_EQ(Render(envelope)["payload"], R"({"a": 1})");
}

TEST(JsonLineTest, InvalidUtf8InMetadataIsReplacedNotThrown) {
  Envelope envelope = Sample();
  envelope.topic = "bad\xff";
  envelope.headers["h"] = "\xc3";
  const nlohmann::json line = Render(envelope);
  EXPECT_EQ(line["topic"], "bad\xef\xbf\xbd");
  EXPECT_EQ(line["headers"]["h"], "\xef\xbf\xbd");
}

TEST(JsonLineTest, ControlCharactersStayOnOneLine) {
  Envelope envelope = Sample();
  envelope.content_type = "text/plain";
  envelope.payload = std::string("line1\nline2\r\0end", 16);
  EXPECT_EQ(Render(envelope)["payload"], envelope.payload);
}

}  // namespace
}  // namespace outbox::file
