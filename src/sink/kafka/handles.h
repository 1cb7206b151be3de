#pragma once
// One deleter and one owning alias per librdkafka handle type (STYLE.md point 3), for the sink
// and for the tests' own consumers and mock clusters. librdkafka's header stays under src/.

#include <librdkafka/rdkafka.h>

#include <memory>

namespace outbox::kafka {

struct ConfDeleter {
  void operator()(rd_kafka_conf_t* conf) const { rd_kafka_conf_destroy(conf); }
};
// A configuration not yet handed to rd_kafka_new (which takes it over only when it succeeds).
using ConfPtr = std::unique_ptr<rd_kafka_conf_t, ConfDeleter>;

struct HandleDeleter {
  void operator()(rd_kafka_t* handle) const { rd_kafka_destroy(handle); }
};
// A producer or consumer. Destroying a producer does not wait for its messages: flush or purge
// first.
using HandlePtr = std::unique_ptr<rd_kafka_t, HandleDeleter>;

struct TopicDeleter {
  void operator()(rd_kafka_topic_t* topic) const { rd_kafka_topic_destroy(topic); }
};
// A topic handle; it must not outlive the rd_kafka_t it came from.
using TopicPtr = std::unique_ptr<rd_kafka_topic_t, TopicDeleter>;

struct HeadersDeleter {
  void operator()(rd_kafka_headers_t* headers) const { rd_kafka_headers_destroy(headers); }
};
// Headers not yet handed to rd_kafka_producev (which takes them over only when it succeeds).
using HeadersPtr = std::unique_ptr<rd_kafka_headers_t, HeadersDeleter>;

struct ErrorDeleter {
  void operator()(rd_kafka_error_t* error) const { rd_kafka_error_destroy(error); }
};
// An error object (rd_kafka_produceva and the newer APIs return one; null means success).
using ErrorPtr = std::unique_ptr<rd_kafka_error_t, ErrorDeleter>;

struct MessageDeleter {
  void operator()(rd_kafka_message_t* message) const { rd_kafka_message_destroy(message); }
};
// A message returned by a consumer poll.
using MessagePtr = std::unique_ptr<rd_kafka_message_t, MessageDeleter>;

}  // namespace outbox::kafka
