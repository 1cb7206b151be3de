// The claim check end to end through Kafka (librdkafka's mock cluster, claim_check_e2e.h).

#include "claim_check_e2e.h"
#include "kafka_test_support.h"

namespace outbox::testing {
namespace {

class ClaimCheckKafkaE2eTest : public ClaimCheckE2e {
 protected:
  MockCluster cluster_{1};
};

TEST_F(ClaimCheckKafkaE2eTest, AFiveMegabytePayloadGoesByReferencePastAKill) {
  cluster_.CreateTopic("orders", 1);
  Start("kafka",
        "[sinks.kafka]\ntype = \"kafka\"\nbrokers = \"" + cluster_.bootstraps() +
            "\"\ntopic = \"{topic}\"\nmax_message_bytes = 1000000\n",
        /*secret_in_env=*/true);
  if (IsSkipped() || HasFatalFailure()) return;
  Consumer consumer(cluster_.bootstraps());
  Run([&] { return consumer.Stored("orders"); },
      [&](std::size_t expected) {
        std::vector<ClaimCheckDelivery> out;
        for (const Record& record : consumer.ReadAll("orders", expected)) {
          out.push_back({record.Header("message_id").value_or(""),
                         Headers(record.headers.begin(), record.headers.end()), record.value});
        }
        return out;
      });
}

}  // namespace
}  // namespace outbox::testing
