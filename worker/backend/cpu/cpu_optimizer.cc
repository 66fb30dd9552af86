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

double SumOfSquares(const float* x, size_t n) {
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

}  // namespace shardline::worker::cpu
