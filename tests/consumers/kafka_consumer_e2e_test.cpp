// Kafka: outboxd's kafka sink produces to librdkafka's mock cluster, run inside this test process
// (tests/kafka/kafka_test_support.h), and examples/python/kafka_inbox_consumer.py
// (confluent-kafka) reads every partition and applies each record through the SQL inbox
// (exactly_once_scenario.h). Both header styles: each carries the id in message_id.

#include <gtest/gtest.h>

#include "exactly_once_scenario.h"
#include "kafka_test_support.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

class KafkaConsumerE2eTest : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(HeaderStyles, KafkaConsumerE2eTest,
                         ::testing::Values("outbox", "debezium"),
                         [](const auto& style) { return style.param; });

TEST_P(KafkaConsumerE2eTest, PythonConsumerAppliesEveryCommittedEventOnceThroughKills) {
  TestSchema schema;
  MockCluster cluster(3);
  const std::string topic = "orders-" + schema.name();
  cluster.CreateTopic(topic, 4);
  RunExactlyOnce({
      .schema = schema.name(),
      .sinks = "[sinks.default]\ntype = \"kafka\"\nbrokers = \"" + cluster.bootstraps() +
               "\"\ntopic = \"" + topic + "\"\nheader_style = \"" + GetParam() + "\"\n",
      .writer = {"/usr/bin/python3", EXAMPLES_DIR "/python/place_orders.py", "--orders", "3000"},
      .consumer = {"/usr/bin/python3", EXAMPLES_DIR "/python/kafka_inbox_consumer.py", "--brokers",
                   cluster.bootstraps(), "--topic", topic, "--db", PgUrl(), "--schema",
                   schema.name(), "--table", AppliedTable(schema.name())},
      .consumer_ready = "kafka_inbox_consumer: consuming topic",
  });
}

}  // namespace
}  // namespace outbox::testing
