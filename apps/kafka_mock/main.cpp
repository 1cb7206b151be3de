// outbox-kafka-mock: librdkafka's mock Kafka cluster (rdkafka_mock.h) as a program, for trying
// outbox without Kafka and for tests that run outboxd as a process. It is a protocol mock, NOT
// Kafka: it speaks the Kafka protocol on 127.0.0.1 and keeps everything in memory (see --help).
//
// It prints its bootstrap servers on the first line of standard output ("127.0.0.1:P1,..."), then
// reads commands on standard input, one per line, answering each with "ok" or "error: ...":
//   down <broker|all>                   the broker drops its connections and refuses new ones
//   up <broker|all>                     it accepts connections again
//   topic <name> <partitions>           creates a topic (otherwise topics are auto-created)
//   unknown-topic <name>                metadata answers UNKNOWN_TOPIC_OR_PART for it
//   leader <topic> <partition> <broker> moves a partition's leader
//   produce-errors <ERROR> [count]      the next produce requests fail with ERROR (a librdkafka
//                                       error name such as NOT_LEADER_FOR_PARTITION)
//   delay <broker> <ms> [count]         the broker answers its next produce requests late
// It runs until SIGTERM or SIGINT (end of input does not stop it).

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <poll.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

volatile std::sig_atomic_t stop_requested = 0;
extern "C" void OnSignal(int /*signal*/) { stop_requested = 1; }

constexpr const char* kUsage =
    "usage: outbox-kafka-mock [--brokers N]\n"
    "\n"
    "Runs librdkafka's mock Kafka cluster with N brokers (default 3, ids 1..N) on 127.0.0.1 and\n"
    "prints its bootstrap servers (\"127.0.0.1:P1,127.0.0.1:P2,...\") on the first line of\n"
    "standard output. The ports are chosen by the system: librdkafka 2.0 has no way to fix them.\n"
    "\n"
    "This is a protocol mock, NOT Kafka: it speaks enough of the Kafka protocol for producers\n"
    "(idempotent ones included) and consumers, keeps every record in memory only, forgets it all\n"
    "on exit, does not replicate, does not move leaders by itself when a broker is down, does not\n"
    "enforce message size limits, and auto-creates any topic a client asks for. Use it to try\n"
    "outbox and to inject faults in tests, never to keep data.\n"
    "\n"
    "Commands on standard input, one per line, each answered \"ok\" or \"error: ...\":\n"
    "  down <broker|all>, up <broker|all>, topic <name> <partitions>, unknown-topic <name>,\n"
    "  leader <topic> <partition> <broker>, produce-errors <ERROR_NAME> [count],\n"
    "  delay <broker> <ms> [count]\n"
    "It runs until SIGTERM or SIGINT.\n";

struct HandleDeleter {
  void operator()(rd_kafka_t* handle) const { rd_kafka_destroy(handle); }
};
struct ClusterDeleter {
  void operator()(rd_kafka_mock_cluster_t* cluster) const {
    rd_kafka_mock_cluster_destroy(cluster);
  }
};

std::optional<rd_kafka_resp_err_t> ErrorNamed(const std::string& name) {
  const rd_kafka_err_desc* descriptions = nullptr;
  std::size_t count = 0;
  rd_kafka_get_err_descs(&descriptions, &count);
  for (std::size_t i = 0; i < count; ++i) {
    if (descriptions[i].name != nullptr && name == descriptions[i].name) {
      return descriptions[i].code;
    }
  }
  return std::nullopt;
}

std::optional<int> Number(const std::string& text) {
  try {
    std::size_t used = 0;
    const int value = std::stoi(text, &used);
    if (used == text.size() && value >= 0) return value;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

std::string Result(rd_kafka_resp_err_t error) {
  return error == RD_KAFKA_RESP_ERR_NO_ERROR ? "ok"
                                             : std::string{"error: "} + rd_kafka_err2str(error);
}

// One command line; the answer to print.
std::string Run(rd_kafka_mock_cluster_t* cluster, const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  if (words.empty()) return "error: empty command";
  const std::string& command = words[0];
  const auto broker = [](const std::string& text) -> std::optional<int> {
    if (text == "all") return -1;
    return Number(text);
  };
  if ((command == "down" || command == "up") && words.size() == 2) {
    const auto id = broker(words[1]);
    if (!id) return "error: expected a broker id or all";
    return Result(command == "down" ? rd_kafka_mock_broker_set_down(cluster, *id)
                                    : rd_kafka_mock_broker_set_up(cluster, *id));
  }
  if (command == "topic" && words.size() == 3) {
    const auto partitions = Number(words[2]);
    if (!partitions || *partitions < 1) return "error: expected a partition count";
    return Result(rd_kafka_mock_topic_create(cluster, words[1].c_str(), *partitions, 1));
  }
  if (command == "unknown-topic" && words.size() == 2) {
    rd_kafka_mock_topic_set_error(cluster, words[1].c_str(),
                                  RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
    return "ok";
  }
  if (command == "leader" && words.size() == 4) {
    const auto partition = Number(words[2]);
    const auto id = Number(words[3]);
    if (!partition || !id) return "error: expected leader <topic> <partition> <broker>";
    return Result(rd_kafka_mock_partition_set_leader(cluster, words[1].c_str(), *partition, *id));
  }
  if (command == "produce-errors" && (words.size() == 2 || words.size() == 3)) {
    const auto error = ErrorNamed(words[1]);
    const auto count = words.size() == 3 ? Number(words[2]) : std::optional<int>{1};
    if (!error) return "error: unknown error name " + words[1];
    if (!count || *count < 1) return "error: expected a count";
    const std::vector<rd_kafka_resp_err_t> errors(static_cast<std::size_t>(*count), *error);
    rd_kafka_mock_push_request_errors_array(cluster, /*ProduceRequest=*/0, errors.size(),
                                            errors.data());
    return "ok";
  }
  if (command == "delay" && (words.size() == 3 || words.size() == 4)) {
    const auto id = Number(words[1]);
    const auto ms = Number(words[2]);
    const auto count = words.size() == 4 ? Number(words[3]) : std::optional<int>{1};
    if (!id || !ms || !count || *count < 1) return "error: expected delay <broker> <ms> [count]";
    for (int i = 0; i < *count; ++i) {
      const rd_kafka_resp_err_t error = rd_kafka_mock_broker_push_request_error_rtts(
          cluster, *id, /*ProduceRequest=*/0, 1, RD_KAFKA_RESP_ERR_NO_ERROR, *ms);
      if (error != RD_KAFKA_RESP_ERR_NO_ERROR) return Result(error);
    }
    return "ok";
  }
  return "error: unknown command (see --help)";
}

}  // namespace

int main(int argc, char** argv) {
  int brokers = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      return 0;
    }
    if (arg == "--brokers" && i + 1 < argc) {
      const auto count = Number(argv[++i]);
      if (!count || *count < 1 || *count > 64) {
        std::cerr << "outbox-kafka-mock: --brokers wants 1 to 64\n";
        return 2;
      }
      brokers = *count;
      continue;
    }
    if (arg == "--port") {
      std::cerr << "outbox-kafka-mock: --port is not supported: librdkafka 2.0's mock cluster "
                   "chooses its ports; read them from the first line of output\n";
      return 2;
    }
    std::cerr << kUsage;
    return 2;
  }

  std::array<char, 512> error{};
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "log_level", "3", error.data(), error.size());
  // The mock's broker sockets take this handle's settings: without TCP_NODELAY a broker's second
  // reply in a round waits for the client's delayed ACK, about 40 ms per produce batch (real
  // brokers set TCP_NODELAY).
  rd_kafka_conf_set(conf, "socket.nagle.disable", "true", error.data(), error.size());
  std::unique_ptr<rd_kafka_t, HandleDeleter> handle{
      rd_kafka_new(RD_KAFKA_PRODUCER, conf, error.data(), error.size())};
  if (!handle) {
    rd_kafka_conf_destroy(conf);
    std::cerr << "outbox-kafka-mock: " << error.data() << "\n";
    return 1;
  }
  std::unique_ptr<rd_kafka_mock_cluster_t, ClusterDeleter> cluster{
      rd_kafka_mock_cluster_new(handle.get(), brokers)};
  if (!cluster) {
    std::cerr << "outbox-kafka-mock: cannot create the mock cluster\n";
    return 1;
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::cout << rd_kafka_mock_cluster_bootstraps(cluster.get()) << std::endl;

  bool input_open = true;
  std::string pending;
  while (stop_requested == 0) {
    pollfd fd{.fd = STDIN_FILENO, .events = POLLIN, .revents = 0};
    if (!input_open || poll(&fd, 1, 200) <= 0) {
      if (!input_open) poll(nullptr, 0, 200);
      continue;
    }
    std::array<char, 4096> buffer{};
    const ssize_t got = read(STDIN_FILENO, buffer.data(), buffer.size());
    if (got <= 0) {
      input_open = false;
      continue;
    }
    pending.append(buffer.data(), static_cast<std::size_t>(got));
    for (std::size_t end; (end = pending.find('\n')) != std::string::npos;) {
      const std::string line = pending.substr(0, end);
      pending.erase(0, end + 1);
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      std::cout << Run(cluster.get(), line) << std::endl;
    }
  }
  cluster.reset();  // before the client it belongs to
  return 0;
}
