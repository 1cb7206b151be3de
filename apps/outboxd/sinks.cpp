// The sink types outboxd can run: one entry each (sink/registry.h says how to write a new one).

#include "config.h"
#include "outbox/sink/amqp10_type.h"
#include "outbox/sink/file_type.h"
#include "outbox/sink/http_type.h"
#include "outbox/sink/kafka_type.h"
#include "outbox/sink/nats_type.h"
#include "outbox/sink/rabbitmq_type.h"
#include "outbox/sink/redis_type.h"

namespace outbox::outboxd {

const SinkRegistry& SinkTypes() {
  static const SinkRegistry registry{rabbitmq::Type(), file::Type(),    kafka::Type(), nats::Type(),
                                     redis::Type(),    webhook::Type(), amqp10::Type()};
  return registry;
}

}  // namespace outbox::outboxd
