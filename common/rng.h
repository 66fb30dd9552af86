// Counter-based random numbers that depend only on their key, never on
// library versions or call history elsewhere: the foundation of the
// determinism contract (initialisation from (seed, name), data from
// (seed, step, micro-batch)). SplitMix64 underneath. Not thread-safe (a value).
#ifndef SHARDLINE_COMMON_RNG_H_
#define SHARDLINE_COMMON_RNG_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace shardline::common {

uint64_t SplitMix64(uint64_t x);
// FNV-1a, 64-bit: stable across platforms and runs.
uint64_t HashString(absl::string_view s);
// Mixes several words into one key.
uint64_t MixKey(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0);

class Rng {
 public:
  explicit Rng(uint64_t key) : state_(key) {}
  uint64_t Next() { return SplitMix64(state_++); }
  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift, no modulo bias worth noting).
  uint64_t Uniform(uint64_t n);
  // Uniform double in [0, 1), 53 bits.
  double UniformDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Standard normal (Box–Muller, one draw per call).
  double Normal();

 private:
  uint64_t state_;
};

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_RNG_H_
