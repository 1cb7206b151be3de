// The RabbitMQ sink type for outboxd: the `envelope` key of [sinks.<name>] type = "rabbitmq" read
// from TOML and shown by --check-config (the other keys: tests/outboxd/config_test.cpp). No
// broker: runs in the unit tier.
#include "outbox/sink/rabbitmq_type.h"

#include <gtest/gtest.h>

#include <string>

#include "support/sink_type_test.h"

namespace outbox::rabbitmq {
namespace {

const std::string kUrl = "url = \"amqp://guest:guest@127.0.0.1:5672/\"\n";

TEST(RabbitSinkTypeTest, EnvelopeIsFullOrExternal) {
  testing::ExpectEnvelopeKey(Type(), kUrl, [](const outbox::SinkSettings& settings) {
    return dynamic_cast<const SinkSettings&>(settings).options().envelope;
  });
  // The key comes last in --check-config, after the broker's own keys.
  const std::string described =
      testing::DescribeSink(testing::ParseSinkTable(Type(), kUrl + "envelope = \"external\"\n"));
  EXPECT_TRUE(described.ends_with("max_message_bytes = 16777216\nenvelope = \"external\"\n"))
      << described;
}

TEST(RabbitSinkTypeTest, CloudEventsKeys) {
  testing::ExpectCloudEventsKeys(
      Type(), kUrl,
      [](const outbox::SinkSettings& settings) {
        return dynamic_cast<const SinkSettings&>(settings).options().cloudevents;
      },
      {"binary", "structured"});
}

}  // namespace
}  // namespace outbox::rabbitmq
