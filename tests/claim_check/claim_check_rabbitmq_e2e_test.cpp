// The claim check end to end through RabbitMQ (claim_check_e2e.h).

#include "claim_check_e2e.h"
#include "support/amqp_test_client.h"

namespace outbox::testing {
namespace {

class ClaimCheckRabbitMqE2eTest : public ClaimCheckE2e {
 protected:
  void TearDown() override {
    if (!queue_.empty()) DeleteQueue(queue_);
    ClaimCheckE2e::TearDown();
  }
  std::string queue_;
};

TEST_F(ClaimCheckRabbitMqE2eTest, AFiveMegabytePayloadGoesByReferencePastAKill) {
  queue_ = "claim_check_" + schema_.name();
  DeclareQueue(queue_);
  Start("rabbit",
        "[sinks.rabbit]\ntype = \"rabbitmq\"\nurl = \"" + AmqpUrl() + "\"\nrouting_key = \"" +
            queue_ + "\"\nmax_message_bytes = 1048576\n",
        /*secret_in_env=*/false);
  if (IsSkipped() || HasFatalFailure()) return;
  Consumer consumer(queue_);
  Run([&] { return consumer.count(); },
      [&](std::size_t expected) {
        WaitUntil([&] { return consumer.count() >= expected; }, std::chrono::seconds{10});
        consumer.Stop();
        std::vector<ClaimCheckDelivery> out;
        for (const Delivery& delivery : consumer.deliveries()) {
          out.push_back({delivery.message_id,
                         Headers(delivery.headers.begin(), delivery.headers.end()), delivery.body});
        }
        return out;
      });
}

}  // namespace
}  // namespace outbox::testing
