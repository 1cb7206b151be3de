// The confirmed-publish ceiling of this RabbitMQ broker, through the outbox sink and naively.
// Prints its conditions first, then one line per case:
//   sink, batches     Sink::Publish of `--batch` messages at a time, window `--window` (what the
//                     relay does: each call waits for all its confirms)
//   sink, one call    one Sink::Publish of all the messages (the window streams)
//   naive             raw rabbitmq-c: publish one, wait for its confirm, repeat
// each against a fresh durable classic queue and then a quorum queue (x-queue-type=quorum).
//
//   outbox_rabbitmq_bench [--url URL] [--messages N] [--naive-messages N] [--payload BYTES]
//                         [--window N] [--batch N] [--queue-types classic,quorum]
//
// The queues are named "outbox-bench-<type>-<pid>" and deleted afterwards.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "connection.h"  // the sink's own RAII layer, for the admin and naive connections
#include "outbox/core/uuid.h"
#include "outbox/sink/rabbitmq.h"

namespace {

using SteadyClock = std::chrono::steady_clock;
using outbox::rabbitmq::Bytes;

std::vector<outbox::Envelope> MakeEnvelopes(const std::string& queue, std::size_t count,
                                            std::size_t payload_bytes) {
  std::vector<outbox::Envelope> envelopes(count);
  for (auto& envelope : envelopes) {
    envelope.id = outbox::NewUuidV7();
    envelope.topic = queue;
    envelope.payload.assign(payload_bytes, 'x');
    envelope.stream_key = "bench";
    envelope.created_at = std::chrono::system_clock::now();
  }
  return envelopes;
}

double Seconds(SteadyClock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

class Admin {
 public:
  explicit Admin(const std::string& url)
      : connection_(outbox::rabbitmq::ParseUrl(url), std::chrono::milliseconds{5000},
                    std::chrono::seconds{0}) {
    connection_.OpenChannel(1, false);
  }
  std::string ServerVersion() const { return connection_.ServerVersion(); }
  void Declare(const std::string& queue, const std::string& type) {
    amqp_table_entry_t entry{};
    entry.key = amqp_cstring_bytes("x-queue-type");
    entry.value.kind = AMQP_FIELD_KIND_UTF8;
    entry.value.value.bytes = Bytes(type);
    const amqp_table_t arguments{.num_entries = 1, .entries = &entry};
    amqp_queue_declare(connection_.get(), 1, Bytes(queue), 0, /*durable=*/1, 0, 0, arguments);
    connection_.CheckLastRpc(1, "queue.declare " + queue);
  }
  std::uint32_t Count(const std::string& queue) {
    const auto* ok =
        amqp_queue_declare(connection_.get(), 1, Bytes(queue), 1, 0, 0, 0, amqp_empty_table);
    connection_.CheckLastRpc(1, "passive queue.declare");
    return ok->message_count;
  }
  void Delete(const std::string& queue) {
    amqp_queue_delete(connection_.get(), 1, Bytes(queue), 0, 0);
    connection_.CheckLastRpc(1, "queue.delete");
  }

 private:
  outbox::rabbitmq::Connection connection_;
};

struct Result {
  std::size_t published = 0;
  double seconds = 0;
};

Result RunSink(const std::string& url, const std::string& queue, std::size_t messages,
               std::size_t payload, std::size_t window, std::size_t batch_size) {
  outbox::rabbitmq::SinkOptions options;
  options.url = url;
  options.confirm_window = window;
  auto sink = outbox::rabbitmq::OpenSink(options);
  // Connect outside the timed part.
  const auto warmup = MakeEnvelopes(queue, 1, payload);
  sink->Publish(warmup, SteadyClock::now() + std::chrono::seconds{10});
  const auto envelopes = MakeEnvelopes(queue, messages, payload);

  Result result;
  bool reported = false;
  const auto started = SteadyClock::now();
  for (std::size_t at = 0; at < envelopes.size(); at += batch_size) {
    const std::size_t count = std::min(batch_size, envelopes.size() - at);
    const auto outcomes = sink->Publish(std::span{envelopes}.subspan(at, count),
                                        SteadyClock::now() + std::chrono::seconds{60});
    for (const auto& outcome : outcomes) {
      if (outcome.published()) {
        ++result.published;
      } else if (!reported) {
        std::fprintf(stderr, "  first failure: %s\n", outcome.failure->Describe().c_str());
        reported = true;
      }
    }
  }
  result.seconds = Seconds(SteadyClock::now() - started);
  sink->Close();
  return result;
}

// Publish, wait for that message's confirm, repeat.
Result RunNaive(const std::string& url, const std::string& queue, std::size_t messages,
                std::size_t payload) {
  outbox::rabbitmq::Connection connection(outbox::rabbitmq::ParseUrl(url),
                                          std::chrono::milliseconds{5000}, std::chrono::seconds{0});
  connection.OpenChannel(1, /*confirms=*/true);
  const std::string body(payload, 'x');
  amqp_basic_properties_t properties{};
  properties._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG;
  properties.delivery_mode = AMQP_DELIVERY_PERSISTENT;

  Result result;
  const auto started = SteadyClock::now();
  for (std::size_t i = 0; i < messages; ++i) {
    const std::string id = outbox::NewUuidV7().ToString();
    properties.message_id = Bytes(id);
    if (amqp_basic_publish(connection.get(), 1, amqp_empty_bytes, Bytes(queue), 1, 0, &properties,
                           Bytes(body)) != AMQP_STATUS_OK) {
      throw std::runtime_error("naive publish failed");
    }
    for (;;) {
      amqp_frame_t frame{};
      if (amqp_simple_wait_frame(connection.get(), &frame) != AMQP_STATUS_OK) {
        throw std::runtime_error("naive: connection lost");
      }
      if (frame.frame_type == AMQP_FRAME_METHOD &&
          frame.payload.method.id == AMQP_BASIC_ACK_METHOD) {
        ++result.published;
        break;
      }
      if (frame.frame_type == AMQP_FRAME_METHOD &&
          frame.payload.method.id == AMQP_BASIC_NACK_METHOD) {
        break;
      }
    }
    amqp_maybe_release_buffers(connection.get());
  }
  result.seconds = Seconds(SteadyClock::now() - started);
  return result;
}

void Print(const char* queue_type, const std::string& name, std::size_t messages,
           const Result& result) {
  std::printf("%-8s  %-34s %8zu  %8zu  %7.2f s  %9.0f msgs/s\n", queue_type, name.c_str(), messages,
              result.published, result.seconds,
              static_cast<double>(result.published) / result.seconds);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"outbox RabbitMQ sink benchmark: confirmed-publish rates"};
  const char* env_url = std::getenv("OUTBOX_TEST_AMQP_URL");
  std::string url =
      env_url != nullptr && env_url[0] != '\0' ? env_url : "amqp://guest:guest@127.0.0.1:5672/";
  std::size_t messages = 100000;
  std::size_t naive_messages = 2000;
  std::size_t payload = 200;
  std::size_t window = 1000;
  std::size_t batch = 1000;
  std::vector<std::string> queue_types{"classic", "quorum"};
  app.add_option("--url", url, "AMQP URL (default: $OUTBOX_TEST_AMQP_URL or local guest)");
  app.add_option("--messages", messages, "messages per sink case")->check(CLI::PositiveNumber);
  app.add_option("--naive-messages", naive_messages, "messages for the naive case")
      ->check(CLI::PositiveNumber);
  app.add_option("--payload", payload, "payload bytes")->check(CLI::PositiveNumber);
  app.add_option("--window", window, "sink confirm_window")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "messages per Publish call in the batched case")
      ->check(CLI::PositiveNumber);
  app.add_option("--queue-types", queue_types, "queue types to run")->delimiter(',');
  CLI11_PARSE(app, argc, argv);

  try {
    Admin admin(url);
    std::printf("RabbitMQ %s at %s; %u CPUs on this host (shared with the broker)\n",
                admin.ServerVersion().c_str(), outbox::rabbitmq::ParseUrl(url).Describe().c_str(),
                std::thread::hardware_concurrency());
    std::printf(
        "messages: %zu B payload, persistent (delivery_mode 2), mandatory, headers as "
        "the sink sends them; durable queues, no consumer; confirm_window %zu\n\n",
        payload, window);
    std::printf("%-8s  %-34s %8s  %8s  %9s  %16s\n", "queue", "case", "sent", "confirmed", "time",
                "rate");

    for (const std::string& type : queue_types) {
      const std::string queue = "outbox-bench-" + type + "-" + std::to_string(getpid());
      const auto fresh = [&] {
        admin.Delete(queue);
        admin.Declare(queue, type);
      };
      fresh();
      Print(type.c_str(), "sink, Publish batches of " + std::to_string(batch), messages,
            RunSink(url, queue, messages, payload, window, batch));
      fresh();
      Print(type.c_str(), "sink, one Publish of all", messages,
            RunSink(url, queue, messages, payload, window, messages));
      fresh();
      Print(type.c_str(), "naive: publish, wait for confirm", naive_messages,
            RunNaive(url, queue, naive_messages, payload));
      admin.Delete(queue);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rabbitmq bench: %s\n", error.what());
    return 1;
  }
  return 0;
}
