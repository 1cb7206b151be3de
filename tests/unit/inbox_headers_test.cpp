// inbox::FromHeaders: the delivery from text headers as the Kafka, NATS, Redis and webhook sinks
// write them, and every way such a message can be unusable. (What the sinks really send is read
// through it by each broker's sink contract suite.)
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "outbox/core/wire_names.h"
#include "outbox/inbox/headers.h"

namespace outbox {
namespace {

using Headers = std::map<std::string, std::string, std::less<>>;

std::optional<inbox::Delivery> Read(const Headers& headers, std::string* error = nullptr,
                                    std::string_view id_name = inbox::kKafkaIdHeader) {
  return inbox::FromHeaders(
      [&](std::string_view name) -> std::optional<std::string_view> {
        const auto found = headers.find(name);
        if (found == headers.end()) return std::nullopt;
        return found->second;
      },
      id_name, error);
}

TEST(InboxHeadersTest, ReadsEveryOutboxField) {
  const std::string id = NewUuidV7().ToString();
  const auto delivery = Read({{"message_id", id},
                              {std::string{wire::kStreamKeyHeader}, "order-42"},
                              {std::string{wire::kStreamSeqHeader}, "7"},
                              {std::string{wire::kStreamPrevSeqHeader}, "4"},
                              {std::string{wire::kTargetHeader}, "partner"},
                              {std::string{wire::kDatabaseHeader}, "tenant-7"},
                              {"traceparent", "00-ab-cd-01"}});
  ASSERT_TRUE(delivery.has_value());
  EXPECT_EQ(delivery->id.ToString(), id);
  EXPECT_EQ(delivery->stream_key, "order-42");
  EXPECT_EQ(delivery->stream_seq, 7);
  EXPECT_EQ(delivery->stream_prev_seq, 4);
  EXPECT_EQ(delivery->target, "partner");
  EXPECT_EQ(delivery->origin, "tenant-7");
  EXPECT_EQ(delivery->malformed, "");
  EXPECT_EQ(inbox::Validate(*delivery), "");
  // Only the id: a message without a stream.
  const auto plain = Read({{"message_id", id}});
  ASSERT_TRUE(plain.has_value());
  EXPECT_FALSE(plain->stream_key || plain->stream_seq || plain->stream_prev_seq || plain->target ||
               plain->origin);
  // The id header per broker.
  EXPECT_TRUE(Read({{"id", id}}, nullptr, inbox::kRedisIdField).has_value());
  EXPECT_TRUE(Read({{"webhook-id", id}}, nullptr, inbox::kWebhookIdHeader).has_value());
}

TEST(InboxHeadersTest, AMessageNotFromAnOutboxIsRefusedWithTheReason) {
  std::string error;
  EXPECT_FALSE(Read({}, &error).has_value());
  EXPECT_EQ(error, "the message has no message_id header");
  EXPECT_FALSE(Read({{"message_id", "order-42"}}, &error).has_value());
  EXPECT_EQ(error, "message_id 'order-42' is not a UUID");
  EXPECT_FALSE(Read({{"message_id", ""}}, &error).has_value());
  EXPECT_EQ(error, "message_id '' is not a UUID");
  EXPECT_FALSE(Read({{"message_id", NewUuidV7().ToString()}}, &error, "webhook-id").has_value());
  EXPECT_EQ(error, "the message has no webhook-id header");
}

// Present but unreadable: a delivery (its id is fine) that is malformed, so Process says
// kInvalid; a readable number out of range is left to Validate.
TEST(InboxHeadersTest, AnUnreadableNumberMakesTheDeliveryMalformed) {
  const std::string id = NewUuidV7().ToString();
  for (const char* text : {"7x", "", "+7", " 7", "7.0", "9223372036854775808", "0x10"}) {
    const auto bad = Read({{"message_id", id},
                           {std::string{wire::kStreamKeyHeader}, "s"},
                           {std::string{wire::kStreamSeqHeader}, text}});
    ASSERT_TRUE(bad.has_value()) << text;
    EXPECT_EQ(bad->malformed, "header outbox-stream-seq is not an integer") << text;
    EXPECT_EQ(inbox::Validate(*bad), bad->malformed) << text;
  }
  const auto bad_prev = Read({{"message_id", id},
                              {std::string{wire::kStreamSeqHeader}, "5"},
                              {std::string{wire::kStreamPrevSeqHeader}, "four"}});
  EXPECT_EQ(bad_prev->malformed, "header outbox-stream-prev-seq is not an integer");
  const auto negative = Read({{"message_id", id},
                              {std::string{wire::kStreamKeyHeader}, "s"},
                              {std::string{wire::kStreamSeqHeader}, "-1"}});
  EXPECT_EQ(negative->stream_seq, -1);
  EXPECT_EQ(negative->malformed, "");
  EXPECT_EQ(inbox::Validate(*negative), "stream_seq -1 is out of range (1 to 4611686018427387904)");
}

}  // namespace
}  // namespace outbox
