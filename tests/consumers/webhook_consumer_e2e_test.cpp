// Webhooks: outboxd's http sink POSTs each event, signed (Standard Webhooks), to
// examples/python/webhook_inbox_consumer.py, which checks the signature and applies it through the
// SQL inbox before it answers (exactly_once_scenario.h). While the consumer is down the relay's
// requests are refused and sent again once it is back.

#include <gtest/gtest.h>

#include "exactly_once_scenario.h"
#include "support/free_port.h"
#include "support/pg_test_support.h"

namespace outbox::testing {
namespace {

TEST(WebhookConsumerE2eTest, PythonConsumerAppliesEveryCommittedEventOnceThroughKills) {
  TestSchema schema;
  const std::string listen = "127.0.0.1:" + std::to_string(FreePort());
  const std::string secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
  RunExactlyOnce({
      .schema = schema.name(),
      .sinks = "[sinks.default]\ntype = \"http\"\nurl = \"http://" + listen +
               "/hooks/orders\"\nsecrets = [\"" + secret +
               "\"]\nmax_in_flight = 8\nconnect_timeout = \"1s\"\nrequest_timeout = \"3s\"\n"
               "[retry]\ninitial_delay = \"50ms\"\nmax_delay = \"200ms\"\n",
      .writer = {"/usr/bin/python3", EXAMPLES_DIR "/python/place_orders.py", "--orders", "3000"},
      .consumer = {"/usr/bin/python3", EXAMPLES_DIR "/python/webhook_inbox_consumer.py", "--listen",
                   listen, "--secret", secret, "--db", PgUrl(), "--schema", schema.name(),
                   "--table", AppliedTable(schema.name())},
      .consumer_ready = "webhook_inbox_consumer: listening",
  });
}

}  // namespace
}  // namespace outbox::testing
