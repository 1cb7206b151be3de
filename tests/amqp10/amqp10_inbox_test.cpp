// The inbox's reading of AMQP 1.0 messages (inbox/amqp10.h): what the sink sends, foreign and
// altered messages. No broker: runs in the unit tier (the round trip through RabbitMQ's plugin
// is in amqp10_sink_test.cpp).
#include <gtest/gtest.h>

#include <proton/message.hpp>
#include <proton/message_id.hpp>
#include <string>

#include "outbox/core/uuid.h"
#include "outbox/inbox/amqp10.h"

namespace outbox::inbox {
namespace {

proton::message Message(const std::string& id) {
  proton::message message;
  if (!id.empty()) message.id(proton::message_id(id));
  return message;
}

TEST(Amqp10InboxTest, ReadsWhatTheSinkSends) {
  const MessageId id = NewUuidV7();
  proton::message message = Message(id.ToString());
  message.properties().put("outbox-stream-key", std::string{"order-7"});
  message.properties().put("outbox-stream-seq", std::int64_t{42});
  message.properties().put("outbox-stream-prev-seq", std::int64_t{40});
  message.properties().put("traceparent", std::string{"00-abc-def-01"});
  const auto delivery = FromAmqp10(message);
  ASSERT_TRUE(delivery);
  EXPECT_EQ(delivery->id, id);
  EXPECT_EQ(delivery->stream_key, "order-7");
  EXPECT_EQ(delivery->stream_seq, 42);
  EXPECT_EQ(delivery->stream_prev_seq, 40);
  EXPECT_TRUE(delivery->malformed.empty());
}

TEST(Amqp10InboxTest, IntegersOfAnyTypeOrDecimalStrings) {
  proton::message message = Message(NewUuidV7().ToString());
  message.properties().put("outbox-stream-key", std::string{"k"});
  message.properties().put("outbox-stream-seq", std::string{"7"});
  message.properties().put("outbox-stream-prev-seq", std::int32_t{5});
  const auto delivery = FromAmqp10(message);
  ASSERT_TRUE(delivery);
  EXPECT_EQ(delivery->stream_seq, 7);
  EXPECT_EQ(delivery->stream_prev_seq, 5);
}

TEST(Amqp10InboxTest, WithoutAStreamOnlyTheId) {
  const auto delivery = FromAmqp10(Message(NewUuidV7().ToString()));
  ASSERT_TRUE(delivery);
  EXPECT_FALSE(delivery->stream_key);
  EXPECT_FALSE(delivery->stream_seq);
}

TEST(Amqp10InboxTest, ForeignMessagesAreRefusedWithAReason) {
  std::string error;
  EXPECT_FALSE(FromAmqp10(Message(""), &error));
  EXPECT_NE(error.find("no message-id"), std::string::npos) << error;
  EXPECT_FALSE(FromAmqp10(Message("not-a-uuid"), &error));
  EXPECT_NE(error.find("not a UUID"), std::string::npos) << error;
  proton::message numeric;
  numeric.id(proton::message_id(std::uint64_t{7}));
  EXPECT_FALSE(FromAmqp10(numeric, &error));
  EXPECT_NE(error.find("not the outbox's string id"), std::string::npos) << error;
}

TEST(Amqp10InboxTest, UnreadableOutboxPropertiesAreMalformed) {
  proton::message message = Message(NewUuidV7().ToString());
  message.properties().put("outbox-stream-key", std::int64_t{3});
  message.properties().put("outbox-stream-seq", std::string{"seven"});
  const auto delivery = FromAmqp10(message);
  ASSERT_TRUE(delivery);
  EXPECT_FALSE(delivery->malformed.empty());
}

}  // namespace
}  // namespace outbox::inbox
