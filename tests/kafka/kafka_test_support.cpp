#include "kafka_test_support.h"

#include <array>
#include <future>
#include <stdexcept>
#include <utility>

#include "outbox/core/uuid.h"

namespace outbox::testing {
namespace {

using SteadyClock = std::chrono::steady_clock;

kafka::HandlePtr NewHandle(rd_kafka_type_t type,
                           const std::vector<std::pair<std::string, std::string>>& properties) {
  kafka::ConfPtr conf{rd_kafka_conf_new()};
  std::array<char, 512> error{};
  for (const auto& [name, value] : properties) {
    if (rd_kafka_conf_set(conf.get(), name.c_str(), value.c_str(), error.data(), error.size()) !=
        RD_KAFKA_CONF_OK) {
      throw std::runtime_error(name + ": " + error.data());
    }
  }
  rd_kafka_t* handle = rd_kafka_new(type, conf.get(), error.data(), error.size());
  if (handle == nullptr) throw std::runtime_error(std::string{"rd_kafka_new: "} + error.data());
  conf.release();  // rd_kafka_new took it over
  return kafka::HandlePtr{handle};
}

void Check(rd_kafka_resp_err_t error, const std::string& what) {
  if (error != RD_KAFKA_RESP_ERR_NO_ERROR) {
    throw std::runtime_error(what + ": " + rd_kafka_err2str(error));
  }
}

}  // namespace

MockCluster::MockCluster(int brokers)
    : brokers_(brokers),
      // The cluster needs a client for its bookkeeping; it never connects anywhere (log_level 3
      // keeps its "no bootstrap.servers" notice quiet).
      handle_(NewHandle(RD_KAFKA_PRODUCER, {{"log_level", "3"}})),
      cluster_(rd_kafka_mock_cluster_new(handle_.get(), brokers)) {
  if (!cluster_) throw std::runtime_error("rd_kafka_mock_cluster_new failed");
}

MockCluster::~MockCluster() {
  cluster_.reset();  // before the client it belongs to
}

std::string MockCluster::bootstraps() const {
  return rd_kafka_mock_cluster_bootstraps(cluster_.get());
}

void MockCluster::CreateTopic(const std::string& topic, int partitions) {
  Check(rd_kafka_mock_topic_create(cluster_.get(), topic.c_str(), partitions, brokers_),
        "creating topic " + topic);
}

void MockCluster::MakeTopicUnknown(const std::string& topic) {
  rd_kafka_mock_topic_set_error(cluster_.get(), topic.c_str(),
                                RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
}

void MockCluster::SetLeader(const std::string& topic, int partition, int broker) {
  Check(rd_kafka_mock_partition_set_leader(cluster_.get(), topic.c_str(), partition, broker),
        "setting the leader of " + topic);
}

void MockCluster::SetLeaders(const std::string& topic,
                             const std::vector<std::pair<int, int>>& leaders) {
  std::vector<std::future<rd_kafka_resp_err_t>> calls;
  calls.reserve(leaders.size());
  for (const auto& [partition, broker] : leaders) {
    calls.push_back(std::async(std::launch::async, [this, &topic, partition, broker] {
      return rd_kafka_mock_partition_set_leader(cluster_.get(), topic.c_str(), partition, broker);
    }));
  }
  for (auto& call : calls) Check(call.get(), "setting the leader of " + topic);
}

void MockCluster::Down(int id) {
  Check(rd_kafka_mock_broker_set_down(cluster_.get(), id), "taking a broker down");
}

void MockCluster::Up(int id) {
  Check(rd_kafka_mock_broker_set_up(cluster_.get(), id), "bringing a broker up");
}

void MockCluster::FailProduce(const std::vector<rd_kafka_resp_err_t>& errors) {
  rd_kafka_mock_push_request_errors_array(cluster_.get(), kProduceApi, errors.size(),
                                          errors.data());
}

void MockCluster::DelayProduce(int id, std::chrono::milliseconds delay, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    Check(rd_kafka_mock_broker_push_request_error_rtts(cluster_.get(), id, kProduceApi, 1,
                                                       RD_KAFKA_RESP_ERR_NO_ERROR,
                                                       static_cast<int>(delay.count())),
          "delaying produce requests");
  }
}

std::optional<std::string> Record::Header(const std::string& name) const {
  std::optional<std::string> found;
  for (const auto& header : headers) {
    if (header.first == name) found = header.second;
  }
  return found;
}

Consumer::Consumer(const std::string& bootstraps)
    : handle_(NewHandle(RD_KAFKA_CONSUMER, {{"bootstrap.servers", bootstraps},
                                            {"group.id", "outbox-test-reader"},
                                            {"enable.auto.commit", "false"},
                                            {"enable.partition.eof", "false"},
                                            {"log_level", "3"}})) {}

int Consumer::Partitions(const std::string& topic) {
  const rd_kafka_metadata_t* metadata = nullptr;
  kafka::TopicPtr handle{rd_kafka_topic_new(handle_.get(), topic.c_str(), nullptr)};
  Check(rd_kafka_metadata(handle_.get(), 0, handle.get(), &metadata, 10000),
        "metadata of " + topic);
  std::unique_ptr<const rd_kafka_metadata_t, void (*)(const rd_kafka_metadata_t*)> owned{
      metadata, rd_kafka_metadata_destroy};
  if (metadata->topic_cnt != 1 || metadata->topics[0].err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    throw std::runtime_error("no metadata for topic " + topic);
  }
  return metadata->topics[0].partition_cnt;
}

std::vector<std::size_t> Consumer::StoredByPartition(const std::string& topic) {
  std::vector<std::size_t> stored;
  for (int partition = 0, partitions = Partitions(topic); partition < partitions; ++partition) {
    std::int64_t low = 0;
    std::int64_t high = 0;
    Check(rd_kafka_query_watermark_offsets(handle_.get(), topic.c_str(), partition, &low, &high,
                                           10000),
          "watermarks of " + topic);
    stored.push_back(static_cast<std::size_t>(high - low));
  }
  return stored;
}

std::size_t Consumer::Stored(const std::string& topic) {
  std::size_t stored = 0;
  for (const std::size_t count : StoredByPartition(topic)) stored += count;
  return stored;
}

std::vector<Record> Consumer::ReadAll(const std::string& topic, std::size_t expected,
                                      std::chrono::milliseconds timeout,
                                      std::chrono::milliseconds quiet) {
  // Every partition of the topic, from its first offset.
  const int partitions = Partitions(topic);
  std::unique_ptr<rd_kafka_topic_partition_list_t, void (*)(rd_kafka_topic_partition_list_t*)>
      assignment{rd_kafka_topic_partition_list_new(partitions),
                 rd_kafka_topic_partition_list_destroy};
  for (int partition = 0; partition < partitions; ++partition) {
    rd_kafka_topic_partition_list_add(assignment.get(), topic.c_str(), partition)->offset =
        RD_KAFKA_OFFSET_BEGINNING;
  }
  Check(rd_kafka_assign(handle_.get(), assignment.get()), "assigning " + topic);

  std::vector<Record> records;
  const auto end = SteadyClock::now() + timeout;
  auto quiet_end = SteadyClock::time_point::max();
  for (;;) {
    const auto now = SteadyClock::now();
    if (records.size() >= expected && quiet_end == SteadyClock::time_point::max()) {
      quiet_end = now + quiet;
    }
    if (now >= std::min(end, quiet_end)) break;
    kafka::MessagePtr message{rd_kafka_consumer_poll(handle_.get(), 100)};
    if (!message) continue;
    if (message->err != RD_KAFKA_RESP_ERR_NO_ERROR) continue;  // e.g. a transient fetch error
    Record record;
    record.topic = rd_kafka_topic_name(message->rkt);
    record.partition = message->partition;
    record.offset = message->offset;
    if (message->key != nullptr) {
      record.key = std::string{static_cast<const char*>(message->key), message->key_len};
    }
    if (message->payload != nullptr) {
      record.value = std::string{static_cast<const char*>(message->payload), message->len};
    }
    rd_kafka_timestamp_type_t type{};
    record.timestamp_ms = rd_kafka_message_timestamp(message.get(), &type);
    rd_kafka_headers_t* headers = nullptr;
    if (rd_kafka_message_headers(message.get(), &headers) == RD_KAFKA_RESP_ERR_NO_ERROR) {
      const char* name = nullptr;
      const void* value = nullptr;
      std::size_t size = 0;
      for (std::size_t i = 0;
           rd_kafka_header_get_all(headers, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR;
           ++i) {
        record.headers.emplace_back(name, value == nullptr
                                              ? std::string{}
                                              : std::string{static_cast<const char*>(value), size});
      }
    }
    records.push_back(std::move(record));
  }
  rd_kafka_assign(handle_.get(), nullptr);
  return records;
}

Envelope MakeEnvelope(const std::string& topic, std::string payload) {
  return Envelope{.id = NewUuidV7(),
                  .topic = topic,
                  .payload = std::move(payload),
                  .created_at = std::chrono::system_clock::now()};
}

Deadline In(std::chrono::milliseconds duration) { return SteadyClock::now() + duration; }

}  // namespace outbox::testing
