// Branch-free float math for the CPU kernels' loops, written so GCC
// vectorises them (libm's expf and tanhf are calls it cannot), and helpers
// for sums in a fixed order that still vectorise. Inline: each kernel file
// compiles them into its own clones (SHARDLINE_CPU_CLONES).
#ifndef SHARDLINE_WORKER_BACKEND_CPU_CPU_MATH_H_
#define SHARDLINE_WORKER_BACKEND_CPU_CPU_MATH_H_

#include <cstdint>
#include <cstring>

namespace shardline::worker::cpu {

// e^x for x <= 0, within a few ulp of expf; below −87 it returns e^−87 (about
// 1.6e-38) instead of a denormal or 0. Range reduction x = n·ln2 + r,
// |r| <= ln2/2, a degree-7 polynomial for e^r, then 2^n from the exponent bits.
inline float ExpNonPositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  // Round to nearest through the 1.5·2^23 trick (vectorises; |x·log2 e| < 2^22).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = 1.0f / 720.0f + r * p;
  p = 1.0f / 120.0f + r * p;
  p = 1.0f / 24.0f + r * p;
  p = 1.0f / 6.0f + r * p;
  p = 0.5f + r * p;
  p = 1.0f + r * p;
  p = 1.0f + r * p;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// Σ_{j<n} term(j) in double, over eight running sums (term j into sum
// j mod 8) added in order at the end: a fixed order (the same bits on every
// CPU and clone, wherever the caller's range starts) that vectorises, where
// one running sum cannot. term(j) returns a double.
template <typename Term>
inline double LaneSum(int64_t n, Term term) {
  constexpr int64_t kLanes = 8;
  double lanes[kLanes] = {};
  const int64_t whole = n / kLanes * kLanes;
  for (int64_t j = 0; j < whole; j += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) lanes[k] += term(j + k);
  }
  for (int64_t j = whole; j < n; ++j) lanes[j - whole] += term(j);
  double total = 0.0;
  for (double lane : lanes) total += lane;
  return total;
}

// max_{j<n} x[j]·scale for n >= 1, over eight running maxima (the same value
// as one: max is exact), so it vectorises.
inline float ScaledMax(const float* x, int64_t n, float scale) {
  constexpr int64_t kLanes = 8;
  float lanes[kLanes];
  for (int64_t k = 0; k < kLanes; ++k) lanes[k] = scale * x[0];
  const int64_t whole = n / kLanes * kLanes;
  for (int64_t j = 0; j < whole; j += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) {
      const float v = scale * x[j + k];
      lanes[k] = lanes[k] < v ? v : lanes[k];
    }
  }
  float max = lanes[0];
  for (int64_t k = 1; k < kLanes; ++k) max = max < lanes[k] ? lanes[k] : max;
  for (int64_t j = whole; j < n; ++j) max = max < scale * x[j] ? scale * x[j] : max;
  return max;
}

}  // namespace shardline::worker::cpu

#endif  // SHARDLINE_WORKER_BACKEND_CPU_CPU_MATH_H_
