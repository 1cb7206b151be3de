// Per-message CPU cost of core: UUIDv7 generation (one per enqueue) and the partition hash.
// Run: build/release/bin/outbox_core_bench

#include <benchmark/benchmark.h>

#include "outbox/core/partition.h"
#include "outbox/core/uuid.h"

namespace {

void BM_UuidV7Next(benchmark::State& state) {
  static outbox::UuidV7Generator generator;  // shared, to measure contention across threads
  for (auto _ : state) benchmark::DoNotOptimize(generator.Next());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_UuidV7Next)->Threads(1)->Threads(2)->UseRealTime();

void BM_UuidToString(benchmark::State& state) {
  const auto id = outbox::NewUuidV7();
  for (auto _ : state) benchmark::DoNotOptimize(id.ToString());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_UuidToString);

void BM_PartitionOfStreamKey(benchmark::State& state) {
  const std::string key = "order-0190f3a2-7c1e-7d40-9b1a-3f5e2d8c4b7a";
  for (auto _ : state) benchmark::DoNotOptimize(outbox::PartitionOf(key, 64));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PartitionOfStreamKey);

}  // namespace

BENCHMARK_MAIN();
