// Redis: outboxd's redis sink appends to a stream, examples/python/redis_inbox_consumer.py reads it
// in a consumer group and applies each entry through the SQL inbox (exactly_once_scenario.h).

#include <gtest/gtest.h>

#include <cstdlib>

#include "exactly_once_scenario.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

std::string RedisUrl() {
  const char* url = std::getenv("OUTBOX_TEST_REDIS_URL");
  return url != nullptr && url[0] != '\0' ? url : "redis://127.0.0.1:6379";
}

TEST(RedisConsumerE2eTest, PythonConsumerAppliesEveryCommittedEventOnceThroughKills) {
  TestSchema schema;
  const std::string stream = "outbox-test:consumers:" + schema.name();
  RunExactlyOnce({
      .schema = schema.name(),
      .sinks = "[sinks.default]\ntype = \"redis\"\nurl = \"" + RedisUrl() + "\"\nstream = \"" +
               stream + "\"\n",
      .writer = {"/usr/bin/python3", EXAMPLES_DIR "/python/place_orders.py", "--orders", "3000"},
      .consumer = {"/usr/bin/python3", EXAMPLES_DIR "/python/redis_inbox_consumer.py", "--redis",
                   RedisUrl(), "--stream", stream, "--db", PgUrl(), "--schema", schema.name(),
                   "--table", AppliedTable(schema.name())},
      .consumer_ready = "redis_inbox_consumer: consuming stream",
  });
  EXPECT_EQ(std::system(("redis-cli -u '" + RedisUrl() + "' DEL '" + stream + "' '" + stream +
                         ".dead-letter' >/dev/null")
                            .c_str()),
            0);
}

// Issue #44: stream_seq counts per (target, stream), so one consumer fed by two targets' copies of
// a stream (here both append to the same Redis stream) must keep its marks per target: each copy
// is applied once, and neither target's seq 1 is taken for the other's.
TEST(RedisConsumerE2eTest, CopiesFromTwoTargetsAreEachAppliedOnceThroughKills) {
  TestSchema schema;
  const std::string stream = "outbox-test:consumers:" + schema.name();
  std::string sinks;
  for (const std::string target : {"east", "west"}) {
    sinks += "[sinks." + target + "]\ntype = \"redis\"\nurl = \"" + RedisUrl() + "\"\nstream = \"" +
             stream + "\"\n";
  }
  RunExactlyOnce({
      .schema = schema.name(),
      .sinks = sinks,
      .writer = {"/usr/bin/python3", EXAMPLES_DIR "/python/place_orders.py", "--orders", "1500",
                 "--targets", "east,west"},
      .consumer = {"/usr/bin/python3", EXAMPLES_DIR "/python/redis_inbox_consumer.py", "--redis",
                   RedisUrl(), "--stream", stream, "--db", PgUrl(), "--schema", schema.name(),
                   "--table", AppliedTable(schema.name())},
      .consumer_ready = "redis_inbox_consumer: consuming stream",
      .copies = 2,
  });
  EXPECT_EQ(std::system(("redis-cli -u '" + RedisUrl() + "' DEL '" + stream + "' '" + stream +
                         ".dead-letter' >/dev/null")
                            .c_str()),
            0);
}

}  // namespace
}  // namespace outbox::testing
