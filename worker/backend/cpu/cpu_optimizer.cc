#include <cmath>

#include "worker/backend/cpu/cpu_kernels.h"

namespace shardline::worker::cpu {

SHARDLINE_CPU_CLONES void AdamWUpdate(const AdamWStep& step, float* params, const float* grads, float* m, float* v,
                 size_t n) {
  const float b1 = step.beta1, b2 = step.beta2;
  const float bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), step.step));
  const float bias2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), step.step));
  for (size_t i = 0; i < n; ++i) {
    const float g = grads[i];
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    const float m_hat = m[i] / bias1;
    const float v_hat = v[i] / bias2;
    params[i] -= step.lr * (m_hat / (std::sqrt(v_hat) + step.eps) + step.weight_decay * params[i]);
  }
}

SHARDLINE_CPU_CLONES void SgdMomentumUpdate(const SgdStep& step, float* params, const float* grads, float* momentum,
                       size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = grads[i] + step.weight_decay * params[i];
    momentum[i] = step.momentum * momentum[i] + g;
    params[i] -= step.lr * momentum[i];
  }
}

// Eight running sums, element i in sum i mod 8, then added in order: a fixed
// order (the same bits on every CPU: x² of a float is exact in double, so a
// fused multiply-add rounds as the separate add does) that vectorises.
SHARDLINE_CPU_CLONES double SumOfSquares(const float* x, size_t n) {
  constexpr size_t kLanes = 8;
  double lanes[kLanes] = {};
  const size_t whole = n / kLanes * kLanes;
  for (size_t i = 0; i < whole; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) lanes[k] += static_cast<double>(x[i + k]) * x[i + k];
  }
  for (size_t i = whole; i < n; ++i) lanes[i - whole] += static_cast<double>(x[i]) * x[i];
  double sum = 0.0;
  for (double lane : lanes) sum += lane;
  return sum;
}

}  // namespace shardline::worker::cpu
