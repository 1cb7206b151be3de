#include "outbox/core/message.h"

#include <gtest/gtest.h>

#include "support/header_limits.h"

namespace outbox {
namespace {

using testing::HeadersAtTheLimits;

NewMessage Valid() {
  NewMessage message;
  message.topic = "orders";
  message.payload = R"({"id":42})";
  message.stream_key = "order-42";
  message.type = "OrderPlaced";
  message.headers = {{"correlation_id", "c-1"}, {"traceparent", "00-abc-def-01"}};
  return message;
}

void ExpectError(const NewMessage& message, std::string_view expected_fragment,
                 const MessageLimits& limits = {}) {
  const std::string error = ValidateMessage(message, limits);
  EXPECT_NE(error.find(expected_fragment), std::string::npos)
      << "error was '" << error << "', expected it to contain '" << expected_fragment << "'";
}

TEST(MessageTest, ValidMessagePasses) {
  EXPECT_EQ(ValidateMessage(Valid()), "");
  NewMessage minimal;
  minimal.topic = "t";
  EXPECT_EQ(ValidateMessage(minimal), "");  // an empty payload is allowed
}

TEST(MessageTest, RejectsBadTopics) {
  auto message = Valid();
  message.topic = "";
  ExpectError(message, "topic must not be empty");
  message.topic = "orders\n";
  ExpectError(message, "topic contains a control character (0x0a)");
  message.topic = std::string(256, 't');
  ExpectError(message, "topic is 256 bytes, over the limit of 255");
}

TEST(MessageTest, RejectsBadStreamKeysTargetsAndTypes) {
  auto message = Valid();
  message.stream_key = "";
  ExpectError(message, "stream_key must not be empty");
  message = Valid();
  message.targets = {""};
  ExpectError(message, "target must not be empty");
  message.targets = {"default", "partner", "default"};
  ExpectError(message, "targets: 'default' is named twice");
  message.targets = {"default", "bad\ttarget"};
  ExpectError(message, "target contains a control character (0x09)");
  message.targets.clear();
  for (std::size_t i = 0; i <= kMaxTargets; ++i) message.targets.push_back("t" + std::to_string(i));
  ExpectError(message, "targets: 33 targets, over the limit of 32");
  message.targets.pop_back();
  EXPECT_EQ(ValidateMessage(message), "");
  message = Valid();
  message.type = std::string{"a\x7f"};
  ExpectError(message, "type contains a control character (0x7f)");
  message = Valid();
  message.content_type = "";
  ExpectError(message, "content_type must not be empty");
}

TEST(MessageTest, RejectsPayloadOverTheLimit) {
  auto message = Valid();
  MessageLimits limits;
  limits.max_payload_bytes = 8;
  message.payload = "123456789";
  ExpectError(message, "payload is 9 bytes, over the limit of 8", limits);
  message.payload = "12345678";
  EXPECT_EQ(ValidateMessage(message, limits), "");
}

TEST(MessageTest, RejectsBadHeaders) {
  auto message = Valid();
  message.headers = {{"", "v"}};
  ExpectError(message, "header name must not be empty");
  message.headers = {{"x-a", "line\nbreak"}};
  ExpectError(message, "header 'x-a': value contains a control character (0x0a)");
  message.headers = {{"x\tb", "v"}};
  ExpectError(message, "header name contains a control character (0x09)");
  message.headers = {{"message_id", "forged"}};
  ExpectError(message, "header 'message_id' is reserved");
  message.headers = {{"Outbox-Stream-Seq", "1"}};
  ExpectError(message, "header 'Outbox-Stream-Seq' is reserved");
  message.headers = {{"Event_ID", "forged"}};
  ExpectError(message, "header 'Event_ID' is reserved");
  MessageLimits limits;
  limits.max_header_count = 1;
  message.headers = {{"a", "1"}, {"b", "2"}};
  ExpectError(message, "headers: 2 headers, over the limit of 1", limits);
}

// The PostgreSQL settings have the same defaults (tests/postgres/pg_sql_test.cpp); the reasons
// are in docs/writing-messages.md.
TEST(MessageTest, HeaderLimitsDefaultToWhatEverySinkCarries) {
  const MessageLimits limits;
  EXPECT_EQ(limits.max_header_count, 64U);
  EXPECT_EQ(limits.max_header_name_bytes, 128U);
  EXPECT_EQ(limits.max_header_value_bytes, 4096U);
  EXPECT_EQ(limits.max_headers_bytes, 8192U);
}

TEST(MessageTest, HeadersAtTheLimitsPassAndOneMoreIsRefusedNamingTheLimit) {
  auto message = Valid();
  message.headers = HeadersAtTheLimits();
  ASSERT_EQ(message.headers.size(), 64U);
  EXPECT_EQ(ValidateMessage(message), "");
  const std::string longest(128, 'n');
  ASSERT_EQ(message.headers.at(longest).size(), 4096U);

  auto more = message;
  more.headers["x-one-more"] = "";
  ExpectError(more, "headers: 65 headers, over the limit of 64 (max_header_count)");
  more = message;
  more.headers.at("x-010") += 'h';
  ExpectError(more,
              "headers: 8193 bytes of names and values, over the limit of 8192 "
              "(max_headers_bytes)");
  // A name or a value one byte over, the total kept.
  more = message;
  more.headers.erase(longest);
  more.headers[longest + 'n'] = std::string(4095, 'v');
  ExpectError(more, "header name is 129 bytes, over the limit of 128 (max_header_name_bytes)");
  more = message;
  more.headers.at(longest) += 'v';
  more.headers.at("x-010").pop_back();
  ExpectError(more, "': value is 4097 bytes, over the limit of 4096 (max_header_value_bytes)");
}

TEST(MessageTest, HeaderLimitsCanBeChanged) {
  const MessageLimits limits{.max_header_count = 3,
                             .max_header_name_bytes = 16,
                             .max_header_value_bytes = 20,
                             .max_headers_bytes = 60};
  auto message = Valid();
  message.headers = HeadersAtTheLimits(limits);
  EXPECT_EQ(ValidateMessage(message, limits), "");
  message.headers.begin()->second += 'x';
  ExpectError(message, "(max_headers_bytes)", limits);
  EXPECT_EQ(ValidateMessage(message), "");
}

TEST(MessageTest, HeaderValuesMayBeEmptyAndUnicode) {
  auto message = Valid();
  message.headers = {{"x-empty", ""}, {"x-name", "Grüße"}};
  EXPECT_EQ(ValidateMessage(message), "");
}

}  // namespace
}  // namespace outbox
