#pragma once
// The burst drains into NATS JetStream (nats_drain.cpp), Redis Streams (redis_drain.cpp) and an
// HTTP webhook endpoint (http_drain.cpp), each next to a raw client's ceiling on the same server,
// measured in the same run.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bench_support.h"

namespace outbox::bench {

void NatsDrainBench(Env& env, const BrokerDrainOptions& options,
                    const std::vector<std::int64_t>& counts,
                    const std::vector<std::size_t>& payloads, int streams,
                    std::int64_t store_messages);

void RedisDrainBench(Env& env, const BrokerDrainOptions& options,
                     const std::vector<std::int64_t>& counts,
                     const std::vector<std::size_t>& payloads, int streams,
                     std::int64_t store_messages);

// The HTTP drain's: the endpoint is this process's own (bench_endpoint.h).
struct HttpDrainOptions {
  int batch_size = 500;      // outboxd's relay.batch_size
  int window = 0;            // requests in flight (max_in_flight); 0: the sink's default (64)
  int repeat = 1;            // rounds of each case
  int endpoint_threads = 1;  // the endpoint's I/O threads
};

void HttpDrainBench(Env& env, const HttpDrainOptions& options,
                    const std::vector<std::int64_t>& counts,
                    const std::vector<std::size_t>& payloads, int streams,
                    std::int64_t store_messages);

}  // namespace outbox::bench
