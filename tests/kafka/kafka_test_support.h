#pragma once
// What the Kafka tests need besides the sink: a librdkafka mock cluster owned by the test, with
// its faults (brokers down, delayed or failed produce requests, topics that do not exist), and an
// independent librdkafka consumer that reads a topic back. Both are plain librdkafka (no outbox
// code), so that a "published" outcome is checked against what the cluster really holds. Written
// to be reused by the sink contract suite (tests/sink/).
//
// The mock cluster is librdkafka's (rdkafka_mock.h): it speaks the Kafka protocol on loopback TCP
// (ephemeral ports), keeps its log in memory, and auto-creates topics a client asks about.

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "handles.h"
#include "outbox/core/clock.h"
#include "outbox/core/message.h"

namespace outbox::testing {

struct MockClusterDeleter {
  void operator()(rd_kafka_mock_cluster_t* cluster) const {
    rd_kafka_mock_cluster_destroy(cluster);
  }
};
using MockClusterPtr = std::unique_ptr<rd_kafka_mock_cluster_t, MockClusterDeleter>;

// Kafka protocol request types (ApiKey) the tests inject faults into.
inline constexpr std::int16_t kProduceApi = 0;

// A mock cluster of `brokers` brokers (ids 1..brokers), destroyed with the object.
class MockCluster {
 public:
  explicit MockCluster(int brokers = 3);
  MockCluster(const MockCluster&) = delete;
  MockCluster& operator=(const MockCluster&) = delete;
  ~MockCluster();

  // "127.0.0.1:port,..." for bootstrap.servers.
  [[nodiscard]] std::string bootstraps() const;
  [[nodiscard]] int broker_count() const { return brokers_; }

  // A topic with `partitions` partitions, replicated on every broker, its leaders spread.
  void CreateTopic(const std::string& topic, int partitions);
  // Metadata requests about `topic` answer UNKNOWN_TOPIC_OR_PART (the mock would auto-create it).
  void MakeTopicUnknown(const std::string& topic);
  void SetLeader(const std::string& topic, int partition, int broker);
  // The leaders of several partitions of `topic` ({partition, broker} each), all set on return.
  // The calls are made at once, from a thread each: the mock cluster answers some of them only
  // at its next 1 s tick (librdkafka 2.0), and one after another 12 of them took 2 s or more.
  void SetLeaders(const std::string& topic, const std::vector<std::pair<int, int>>& leaders);

  // Broker `id` (or -1: every broker) drops its connections and refuses new ones; Up undoes it.
  // Neither moves partition leaders.
  void Down(int id);
  void Up(int id);

  // The next `errors.size()` produce requests (to any broker) fail with these errors in turn.
  void FailProduce(const std::vector<rd_kafka_resp_err_t>& errors);
  // The next `count` produce requests to broker `id` are answered after `delay`, successfully.
  void DelayProduce(int id, std::chrono::milliseconds delay, std::size_t count = 1);

  [[nodiscard]] rd_kafka_mock_cluster_t* get() const { return cluster_.get(); }

 private:
  int brokers_;
  kafka::HandlePtr handle_;  // the cluster's bookkeeping client
  MockClusterPtr cluster_;
};

// A record as a consumer received it.
struct Record {
  std::string topic;
  int partition = 0;
  std::int64_t offset = 0;
  std::optional<std::string> key;
  std::string value;
  std::int64_t timestamp_ms = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // in record order

  // The last header named `name`, if any.
  [[nodiscard]] std::optional<std::string> Header(const std::string& name) const;
};

// Reads whole topics from the beginning, every partition, without a consumer group.
class Consumer {
 public:
  explicit Consumer(const std::string& bootstraps);
  // Every record of `topic` until `expected` have arrived or `timeout` has passed, then until no
  // record has come for `quiet` (so that duplicates are seen too).
  std::vector<Record> ReadAll(const std::string& topic, std::size_t expected,
                              std::chrono::milliseconds timeout = std::chrono::seconds{20},
                              std::chrono::milliseconds quiet = std::chrono::milliseconds{300});
  // How many records `topic` holds now (its partitions' high watermarks less their low ones), in
  // all and by partition.
  std::size_t Stored(const std::string& topic);
  std::vector<std::size_t> StoredByPartition(const std::string& topic);

 private:
  // How many partitions `topic` has (throws when the cluster does not know it).
  int Partitions(const std::string& topic);

  kafka::HandlePtr handle_;
};

// An envelope with a new id, created now (each test has a cluster of its own, so topics need not
// be unique names).
Envelope MakeEnvelope(const std::string& topic, std::string payload = R"({"n":1})");
Deadline In(std::chrono::milliseconds duration);

}  // namespace outbox::testing
