#pragma once
// The webhook endpoint of the HTTP drain (http_drain.cpp), in this process: HTTP/1.1 on
// 127.0.0.1 (a free port), keep-alive, every POST or PUT answered 200 with an empty body as soon
// as it is read (nothing verified: a real receiver's cost is not the sink's), other methods 405.
// It counts what it accepted, for an ArrivalWatcher; Boost.Beast stays in bench_endpoint.cpp.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace outbox::bench {

struct EndpointCounts {
  std::int64_t requests = 0;    // POST/PUT answered 200
  std::int64_t distinct = 0;    // of those, distinct messages (the payload's sequence number)
  std::int64_t without_id = 0;  // without webhook-id (should be 0)
  std::int64_t without_signature = 0;  // without webhook-signature (0 when a secret is set)
  std::int64_t expect_continue = 0;    // with Expect: 100-continue (answered 100, then read)
  std::int64_t connections = 0;        // connections accepted
  double cpu_seconds = 0;              // the I/O threads' CPU time
};

class BenchEndpoint {
 public:
  // `threads` I/O threads (1 or more); `messages`: the payload sequence numbers 0..messages-1
  // whose first arrival distinct() counts (Payload(), Preinsert(): a JSON string starting with
  // 12 digits). `secret`, when set ("whsec_..."): the first request's signature is checked, once
  // (first_signature_ok()), so that a bad signer shows without costing every request.
  // `on_body`, when set, is called with the body of every POST or PUT it accepts, on an I/O
  // thread, before the answer (the chaos ledger's record of deliveries, bench/chaos.cpp).
  BenchEndpoint(int threads, std::int64_t messages, std::string secret = {},
                std::function<void(std::string_view body)> on_body = {});
  ~BenchEndpoint();
  BenchEndpoint(const BenchEndpoint&) = delete;
  BenchEndpoint& operator=(const BenchEndpoint&) = delete;

  [[nodiscard]] int port() const;
  // The first arrivals of messages 0..messages-1 so far (what the drains' watchers read).
  [[nodiscard]] std::int64_t distinct() const;
  [[nodiscard]] EndpointCounts counts() const;
  // "ok", "no secret", "not received yet", or what was wrong with the first signed request.
  [[nodiscard]] std::string first_signature() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Standard Webhooks: "v1," + base64(HMAC-SHA256(key, id + "." + timestamp + "." + body)), the key
// being the secret's bytes after "whsec_", base64-decoded. OpenSSL, not the sink's code.
std::string WebhookSignature(const std::string& secret, std::string_view id, std::int64_t timestamp,
                             std::string_view body);

// A new secret: "whsec_" + base64 of 32 random bytes.
std::string NewWebhookSecret();

}  // namespace outbox::bench
