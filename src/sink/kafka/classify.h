#pragma once
// How a librdkafka delivery report becomes an outcome (outbox/core/failure.h), in one function so
// that each row of the table in sink/kafka.h has its test (tests/kafka).

#include <librdkafka/rdkafka.h>

#include <optional>
#include <string_view>

#include "outbox/core/failure.h"

namespace outbox::kafka {

// The verdict for a report with error `error` and persistence `status` (rd_kafka_message_status).
// `fatal` is the producer's fatal error text when it has one (rd_kafka_fatal_error), else empty.
std::optional<Failure> ClassifyDelivery(rd_kafka_resp_err_t error, rd_kafka_msg_status_t status,
                                        std::string_view fatal = {});

// The verdict for a message that rd_kafka_produceva refused before queueing it (never sent).
Failure ClassifyProduceError(rd_kafka_resp_err_t error, std::string_view detail);

}  // namespace outbox::kafka
