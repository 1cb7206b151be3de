// The sink types outboxd can run: one line each (sink/registry.h says how to write a new one).

#include "config.h"
#include "outbox/sink/file_type.h"
#include "outbox/sink/kafka_type.h"
#include "outbox/sink/rabbitmq_type.h"

namespace outbox::outboxd {

const SinkRegistry& SinkTypes() {
  static const SinkRegistry registry = [] {
    SinkRegistry types;
    types.Add(rabbitmq::Type());
    types.Add(file::Type());
    types.Add(kafka::Type());
    return types;
  }();
  return registry;
}

}  // namespace outbox::outboxd
