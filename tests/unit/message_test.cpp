#include "outbox/core/message.h"

#include <gtest/gtest.h>

namespace outbox {
namespace {

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
  message.target = "";
  ExpectError(message, "target must not be empty");
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
  MessageLimits limits;
  limits.max_header_count = 1;
  message.headers = {{"a", "1"}, {"b", "2"}};
  ExpectError(message, "headers: 2 headers, over the limit of 1", limits);
}

TEST(MessageTest, HeaderValuesMayBeEmptyAndUnicode) {
  auto message = Valid();
  message.headers = {{"x-empty", ""}, {"x-name", "Grüße"}};
  EXPECT_EQ(ValidateMessage(message), "");
}

}  // namespace
}  // namespace outbox
