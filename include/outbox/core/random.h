#pragma once
// An injectable source of uniform random numbers, so that jittered delays are reproducible in
// tests. A source is not thread-safe: give each thread its own.

#include <cstdint>
#include <functional>

namespace outbox {

// Returns a double uniformly distributed in [0, 1).
using UniformRandom = std::function<double()>;

// A deterministic source: the same seed yields the same sequence on every platform.
UniformRandom SeededRandom(std::uint64_t seed);

// A source seeded from std::random_device.
UniformRandom DefaultRandom();

}  // namespace outbox
