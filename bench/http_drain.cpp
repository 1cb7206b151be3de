// outbox-bench drain --sink http: N pending messages, then outboxd with an HTTP webhook sink
// (sink/http.h) POSTing them to an endpoint in this process (bench_endpoint.h), next to the
// ceiling measured just before against a fresh endpoint of the same kind: a plain libcurl multi
// loop sending the same requests (URL shape, the sink's headers with a Standard Webhooks
// signature computed with OpenSSL, payloads) with as many transfers in flight as the sink's
// max_in_flight, over kept-alive HTTP/1.1 connections. Both rates are read the same way: the
// endpoint's count of messages received, every ~2 ms.

#include <curl/curl.h>
#include <time.h>

#include <boost/version.hpp>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "bench_endpoint.h"
#include "drains.h"
#include "outbox/core/percent_decode.h"
#include "outbox/core/uuid.h"
#include "outbox/core/wire_names.h"

namespace outbox::bench {
namespace {

// The requests in flight the sink allows unless told otherwise (sink/http.h, max_in_flight).
constexpr int kDefaultWindow = 64;

double ThreadCpuSeconds() {
  timespec spent{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &spent);
  return static_cast<double>(spent.tv_sec) + static_cast<double>(spent.tv_nsec) / 1e9;
}

void CheckCurl(CURLcode code, const char* what) {
  if (code != CURLE_OK) {
    throw std::runtime_error(std::string{"curl: "} + what + ": " + curl_easy_strerror(code));
  }
}
void CheckMulti(CURLMcode code, const char* what) {
  if (code != CURLM_OK) {
    throw std::runtime_error(std::string{"curl multi: "} + what + ": " + curl_multi_strerror(code));
  }
}

std::size_t Discard(char* /*data*/, std::size_t size, std::size_t count, void* /*closure*/) {
  return size * count;
}

struct MultiDeleter {
  void operator()(CURLM* multi) const { curl_multi_cleanup(multi); }
};

// One transfer slot: an easy handle reused request after request (its connection stays in the
// multi handle's cache), with the request it is sending.
struct Transfer {
  Transfer() : easy(curl_easy_init()) {
    if (easy == nullptr) throw std::runtime_error("curl_easy_init failed");
  }
  ~Transfer() {
    curl_easy_cleanup(easy);
    curl_slist_free_all(headers);
  }
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;

  CURL* easy;
  curl_slist* headers = nullptr;
  std::string body;
};

struct CeilingResult {
  double rate = 0;
  double client_cpu = 0;  // the loop's thread
  EndpointCounts endpoint;
  std::string first_signature;
};

// The ceiling: messages 0..count-1 as Preinsert makes them, POSTed to `url` with the headers the
// sink sets (sink/http.h), `window` transfers in flight.
CeilingResult HttpCeiling(const HttpDrainOptions& options, const std::string& topic,
                          std::int64_t count, std::size_t payload, int streams, int window,
                          const std::string& secret) {
  BenchEndpoint endpoint(options.endpoint_threads, count, secret);
  ArrivalWatcher watcher([&endpoint] { return endpoint.distinct(); }, count);
  const std::string url =
      "http://127.0.0.1:" + std::to_string(endpoint.port()) + "/hooks/" + PercentEncode(topic);
  const std::unique_ptr<CURLM, MultiDeleter> multi{curl_multi_init()};
  if (!multi) throw std::runtime_error("curl_multi_init failed");
  const long connections = window;
  CheckMulti(curl_multi_setopt(multi.get(), CURLMOPT_MAXCONNECTS, connections), "maxconnects");
  CheckMulti(curl_multi_setopt(multi.get(), CURLMOPT_MAX_HOST_CONNECTIONS, connections),
             "max host connections");
  std::vector<std::unique_ptr<Transfer>> transfers;
  for (int i = 0; i < window; ++i) {
    auto transfer = std::make_unique<Transfer>();
    CURL* easy = transfer->easy;
    CheckCurl(curl_easy_setopt(easy, CURLOPT_URL, url.c_str()), "url");
    CheckCurl(curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, long{CURL_HTTP_VERSION_1_1}), "version");
    CheckCurl(curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L), "nosignal");
    CheckCurl(curl_easy_setopt(easy, CURLOPT_PROXY, ""), "proxy");
    CheckCurl(curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, 5000L), "connect timeout");
    CheckCurl(curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, 30000L), "timeout");
    CheckCurl(curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, Discard), "write function");
    CheckCurl(curl_easy_setopt(easy, CURLOPT_PRIVATE, transfer.get()), "private");
    transfers.push_back(std::move(transfer));
  }

  const std::string content_type = "content-type: application/json";
  const std::string attempts = std::string{wire::kAttemptsHeader} + ": 0";
  const std::string topic_header = std::string{wire::kTopicHeader} + ": " + topic;
  std::int64_t next = 0;
  const auto start = [&](Transfer& transfer) {
    const std::int64_t i = next++;
    transfer.body = Payload(i, payload);
    const std::string id = NewUuidV7().ToString();
    const auto timestamp = static_cast<std::int64_t>(std::time(nullptr));
    curl_slist_free_all(transfer.headers);
    transfer.headers = nullptr;
    for (const std::string& header :
         {content_type, "webhook-id: " + id, "webhook-timestamp: " + std::to_string(timestamp),
          "webhook-signature: " + WebhookSignature(secret, id, timestamp, transfer.body),
          topic_header, std::string{wire::kStreamKeyHeader} + ": s" + std::to_string(i % streams),
          std::string{wire::kStreamSeqHeader} + ": " + std::to_string(i / streams + 1),
          std::string{wire::kPartitionHeader} + ": " + std::to_string((i % streams) % 64), attempts,
          std::string{"Expect:"}}) {
      curl_slist* appended = curl_slist_append(transfer.headers, header.c_str());
      if (appended == nullptr) throw std::runtime_error("curl_slist_append failed");
      transfer.headers = appended;
    }
    CURL* easy = transfer.easy;
    CheckCurl(curl_easy_setopt(easy, CURLOPT_HTTPHEADER, transfer.headers), "headers");
    CheckCurl(curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE,
                               static_cast<curl_off_t>(transfer.body.size())),
              "body size");
    CheckCurl(curl_easy_setopt(easy, CURLOPT_POSTFIELDS, transfer.body.data()), "body");
    CheckMulti(curl_multi_add_handle(multi.get(), easy), "add handle");
  };

  const double cpu_before = ThreadCpuSeconds();
  for (auto& transfer : transfers) {
    if (next < count) start(*transfer);
  }
  std::int64_t done = 0;
  std::int64_t failed = 0;
  std::string first_error;
  const auto deadline = Clock::now() + std::chrono::minutes{10};
  while (done < count) {
    if (Clock::now() > deadline) throw std::runtime_error("http ceiling: not done in 10 min");
    int running = 0;
    CheckMulti(curl_multi_perform(multi.get(), &running), "perform");
    int left = 0;
    while (CURLMsg* message = curl_multi_info_read(multi.get(), &left)) {
      if (message->msg != CURLMSG_DONE) continue;
      CURL* easy = message->easy_handle;
      long status = 0;
      curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
      if (message->data.result != CURLE_OK || status != 200) {
        if (failed++ == 0) {
          first_error = message->data.result != CURLE_OK ? curl_easy_strerror(message->data.result)
                                                         : "status " + std::to_string(status);
        }
      }
      ++done;
      void* transfer = nullptr;
      curl_easy_getinfo(easy, CURLINFO_PRIVATE, &transfer);
      CheckMulti(curl_multi_remove_handle(multi.get(), easy), "remove handle");
      if (next < count) start(*static_cast<Transfer*>(transfer));
    }
    if (done < count) CheckMulti(curl_multi_poll(multi.get(), nullptr, 0, 100, nullptr), "poll");
  }
  CeilingResult result;
  result.client_cpu = ThreadCpuSeconds() - cpu_before;
  if (failed > 0) {
    throw std::runtime_error("http ceiling: " + std::to_string(failed) + " of " +
                             std::to_string(count) + " requests failed; first: " + first_error);
  }
  if (!watcher.Wait(std::chrono::seconds{60})) {
    throw std::runtime_error("http ceiling: the endpoint did not receive every message");
  }
  result.rate = watcher.Rate();
  result.endpoint = endpoint.counts();
  result.first_signature = endpoint.first_signature();
  return result;
}

struct HttpDrainResult : OutboxdDrain {
  EndpointCounts endpoint;
  std::string first_signature;
};

HttpDrainResult HttpDrain(Env& env, const HttpDrainOptions& options, const std::string& topic,
                          std::int64_t count, std::size_t payload, int streams, int window,
                          const std::string& secret) {
  Schema schema(env);
  Preinsert(env, schema, topic, 0, count, payload, streams);
  BenchEndpoint endpoint(options.endpoint_threads, count, secret);
  ArrivalWatcher watcher([&endpoint] { return endpoint.distinct(); }, count);
  const std::string sink =
      "type = \"http\"\nurl = \"http://127.0.0.1:" + std::to_string(endpoint.port()) +
      "/hooks/{topic}\"\nsecrets = [\"" + secret +
      "\"]\nmax_in_flight = " + std::to_string(window) + "\n";
  HttpDrainResult result;
  static_cast<OutboxdDrain&>(result) =
      RunOutboxdDrain(env, schema, sink, options.batch_size, watcher, "http drain");
  result.endpoint = endpoint.counts();
  result.first_signature = endpoint.first_signature();
  return result;
}

std::string PerHundredK(double seconds, std::int64_t count) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f s", seconds / static_cast<double>(count) * 1e5);
  return text;
}

}  // namespace

void HttpDrainBench(Env& env, const HttpDrainOptions& options,
                    const std::vector<std::int64_t>& counts,
                    const std::vector<std::size_t>& payloads, int streams,
                    std::int64_t store_messages) {
  const int window = options.window > 0 ? options.window : kDefaultWindow;
  CheckCurl(curl_global_init(CURL_GLOBAL_DEFAULT), "global init");
  const std::string secret = NewWebhookSecret();
  std::printf(
      "== burst drain into an HTTP endpoint: pre-inserted pending messages over %d streams, then "
      "outboxd starts;\n   next to the ceiling, a plain libcurl %s multi loop POSTing the same "
      "requests to an endpoint of the same kind just before\n",
      streams, curl_version_info(CURLVERSION_NOW)->version);
  PrintRelayConditions(env);
  std::printf(
      "relay.batch_size %d; sink: http, url = http://127.0.0.1:<port>/hooks/{topic}, one secret "
      "(signed), max_in_flight %d, the sink's other defaults (http_version auto: HTTP/1.1 on "
      "http://)\n"
      "ceiling: curl_multi with %d transfers in flight (HTTP/1.1, at most %d connections, kept "
      "alive), POST with the sink's headers (content-type, webhook-id, webhook-timestamp, "
      "webhook-signature: HMAC-SHA256 with OpenSSL per request, outbox-topic, -stream-key, "
      "-stream-seq, -partition, -attempts; no Expect: 100-continue), keys s0..s%d\n"
      "endpoint: in this process, Boost.Beast (Boost %d.%d), HTTP/1.1 on 127.0.0.1, %d I/O "
      "thread%s, answers every POST at once with 200 and an empty body, verifies nothing but the "
      "first request's signature; a new one per run\n"
      "rate (both): the endpoint's count of distinct messages received, read every ~2 ms, from the "
      "first reading above 0 to the first at N; also: outboxd start -> N at the endpoint and -> "
      "the outbox table empty; CPU per 100k messages: the ceiling's loop thread, outboxd (all its "
      "threads), the endpoint's I/O threads\n\n",
      options.batch_size, window, window, window, streams - 1, BOOST_VERSION / 100000,
      BOOST_VERSION / 100 % 1000, options.endpoint_threads,
      options.endpoint_threads == 1 ? "" : "s");
  Flush();
  for (const std::size_t payload : payloads) {
    const double store = StoreClaimComplete(env, store_messages, payload, options.batch_size);
    std::printf(
        "payload %zu B: store claim+complete (batch %d, no broker, %s messages): %s msgs/s\n",
        payload, options.batch_size, Thousands(static_cast<double>(store_messages)).c_str(),
        Thousands(store).c_str());
    Flush();
    for (const std::int64_t count : counts) {
      for (int round = 1; round <= options.repeat; ++round) {
        const auto ceiling = HttpCeiling(options, "outbox-bench." + env.NewName("ceiling"), count,
                                         payload, streams, window, secret);
        const auto drain = HttpDrain(env, options, "outbox-bench." + env.NewName("drain"), count,
                                     payload, streams, window, secret);
        const auto& c = ceiling.endpoint;
        const auto& d = drain.endpoint;
        std::printf(
            "  %s x %zu B%s: ceiling %s msgs/s; drain %s msgs/s = %.0f %% of the ceiling (target "
            ">= 90 %%; %.0f %% of store claim+complete)\n"
            "    ceiling: requests %lld, connections %lld, loop CPU %s, endpoint CPU %s per 100k "
            "messages; first signature: %s\n"
            "    drain: all at the endpoint %.2f s after outboxd started, table empty after %.2f "
            "s; requests beyond N: %lld; without webhook-id: %lld, without webhook-signature: "
            "%lld, with Expect: 100-continue: %lld; connections %lld; first signature: %s; "
            "outboxd CPU %s, endpoint CPU %s per 100k messages, peak RSS %s, %.4f "
            "statements/message; memory available %s\n",
            Thousands(static_cast<double>(count)).c_str(), payload,
            options.repeat > 1 ? (" (round " + std::to_string(round) + ")").c_str() : "",
            Thousands(ceiling.rate).c_str(), Thousands(drain.rate).c_str(),
            100.0 * drain.rate / ceiling.rate, 100.0 * drain.rate / store,
            static_cast<long long>(c.requests), static_cast<long long>(c.connections),
            PerHundredK(ceiling.client_cpu, count).c_str(),
            PerHundredK(c.cpu_seconds, count).c_str(), ceiling.first_signature.c_str(),
            drain.filled, drain.emptied, static_cast<long long>(d.requests - count),
            static_cast<long long>(d.without_id), static_cast<long long>(d.without_signature),
            static_cast<long long>(d.expect_continue), static_cast<long long>(d.connections),
            drain.first_signature.c_str(), PerHundredK(drain.process.cpu_seconds, count).c_str(),
            PerHundredK(d.cpu_seconds, count).c_str(), Mib(drain.process.hwm_kib).c_str(),
            drain.statements / static_cast<double>(count), Mib(AvailableKib()).c_str());
        Flush();
      }
    }
  }
  std::printf("\n");
}

}  // namespace outbox::bench
