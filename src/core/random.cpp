#include "outbox/core/random.h"

#include <random>

namespace outbox {
namespace {

// SplitMix64: tiny, fast, and its output is defined bit for bit, unlike the standard
// distributions, so seeded sequences match on every platform.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  double operator()() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30U)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27U)) * 0x94D049BB133111EBULL;
    z ^= z >> 31U;
    // The top 53 bits as a double in [0, 1).
    return static_cast<double>(z >> 11U) * 0x1.0p-53;
  }

 private:
  std::uint64_t state_;
};

}  // namespace

UniformRandom SeededRandom(std::uint64_t seed) { return SplitMix64(seed); }

UniformRandom DefaultRandom() {
  std::random_device device;
  const std::uint64_t seed = (std::uint64_t{device()} << 32U) | device();
  return SplitMix64(seed);
}

}  // namespace outbox
