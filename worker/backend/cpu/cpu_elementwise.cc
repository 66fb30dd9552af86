#include <cmath>

#include "worker/backend/cpu/cpu_kernels.h"

namespace shardline::worker::cpu {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/π)
constexpr float kGeluCubic = 0.044715f;

}  // namespace

void Axpy(float alpha, const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void Scale(float* x, size_t n, float alpha) {
  for (size_t i = 0; i < n; ++i) x[i] *= alpha;
}

void Add(const float* a, const float* b, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void BiasAdd(float* x, const float* bias, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

void SumRows(const float* x, float* out, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) out[c] += row[c];
  }
}

void GeluForward(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kGeluScale * (v + kGeluCubic * v * v * v);
    y[i] = 0.5f * v * (1.0f + std::tanh(u));
  }
}

void GeluBackward(const float* x, const float* dy, float* dx, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kGeluScale * (v + kGeluCubic * v * v * v);
    const float th = std::tanh(u);
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    const float grad = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du;
    dx[i] += dy[i] * grad;
  }
}

}  // namespace shardline::worker::cpu
