#pragma once
// The burst drains into NATS JetStream (nats_drain.cpp) and Redis Streams (redis_drain.cpp),
// each next to a raw client's ceiling on the same server, measured in the same run.

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

}  // namespace outbox::bench
