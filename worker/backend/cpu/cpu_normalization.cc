#include <algorithm>
#include <cmath>
#include <limits>

#include "worker/backend/cpu/cpu_kernels.h"
#include "worker/backend/cpu/cpu_math.h"

namespace shardline::worker::cpu {

SHARDLINE_CPU_CLONES void LayerNormForward(const LayerNormShape& shape, const float* x, const float* gamma,
                      const float* beta, float* y, float* mean, float* rstd) {
  const int64_t cols = shape.cols;
  for (int64_t r = 0; r < shape.rows; ++r) {
    const float* xr = x + r * cols;
    const double mu = LaneSum(cols, [xr](int64_t c) { return static_cast<double>(xr[c]); }) /
                      static_cast<double>(cols);
    const double sq = LaneSum(cols, [xr, mu](int64_t c) {
      const double d = xr[c] - mu;
      return d * d;
    });
    const float s = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(cols) + shape.eps));
    const float m = static_cast<float>(mu);
    float* yr = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) * s * gamma[c] + beta[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

SHARDLINE_CPU_CLONES void LayerNormBackwardInput(const LayerNormShape& shape, const float* x, const float* gamma,
                            const float* mean, const float* rstd, const float* dy, float* dx) {
  const int64_t cols = shape.cols;
  for (int64_t r = 0; r < shape.rows; ++r) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    const float m = mean[r], s = rstd[r];
    // dx = s · (dn − mean(dn) − x̂ · mean(dn · x̂)) with dn = dy · γ, x̂ = (x − μ)·s.
    const double dn_sum =
        LaneSum(cols, [dyr, gamma](int64_t c) { return static_cast<double>(dyr[c] * gamma[c]); });
    const double dn_xhat_sum = LaneSum(cols, [xr, dyr, gamma, m, s](int64_t c) {
      const float xhat = (xr[c] - m) * s;
      return static_cast<double>(dyr[c] * gamma[c]) * xhat;
    });
    const float dn_mean = static_cast<float>(dn_sum / static_cast<double>(cols));
    const float dn_xhat_mean = static_cast<float>(dn_xhat_sum / static_cast<double>(cols));
    for (int64_t c = 0; c < cols; ++c) {
      const float xhat = (xr[c] - m) * s;
      const float dn = dyr[c] * gamma[c];
      dxr[c] += (dn - dn_mean - xhat * dn_xhat_mean) * s;
    }
  }
}

SHARDLINE_CPU_CLONES void LayerNormBackwardParams(const LayerNormShape& shape, int64_t first_col, int64_t end_col,
                             const float* x, const float* mean, const float* rstd, const float* dy,
                             float* dgamma, float* dbeta) {
  const int64_t cols = shape.cols;
  for (int64_t r = 0; r < shape.rows; ++r) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    const float m = mean[r], s = rstd[r];
    for (int64_t c = first_col; c < end_col; ++c) {
      const float xhat = (xr[c] - m) * s;
      dgamma[c] += dyr[c] * xhat;
      dbeta[c] += dyr[c];
    }
  }
}

SHARDLINE_CPU_CLONES void CausalSoftmaxForward(const SoftmaxShape& shape, const float* scores, float* probs) {
  const int64_t t = shape.t;
  for (int64_t row = 0; row < shape.batch * t; ++row) {
    const int64_t i = row % t;  // query position: keys 0..i are visible
    const float* s = scores + row * t;
    float* p = probs + row * t;
    const float scale = shape.scale;
    const int64_t seen = i + 1;
    const float max = ScaledMax(s, seen, scale);
    for (int64_t j = 0; j < seen; ++j) p[j] = ExpNonPositive(scale * s[j] - max);
    const double sum = LaneSum(i + 1, [p](int64_t j) { return static_cast<double>(p[j]); });
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j <= i; ++j) p[j] *= inv;
    for (int64_t j = i + 1; j < t; ++j) p[j] = 0.0f;
  }
}

SHARDLINE_CPU_CLONES void CausalSoftmaxBackward(const SoftmaxShape& shape, const float* probs, const float* dprobs,
                           float* dscores) {
  const int64_t t = shape.t;
  for (int64_t row = 0; row < shape.batch * t; ++row) {
    const int64_t i = row % t;
    const float* p = probs + row * t;
    const float* dp = dprobs + row * t;
    float* ds = dscores + row * t;
    const float d = static_cast<float>(
        LaneSum(i + 1, [dp, p](int64_t j) { return static_cast<double>(dp[j]) * p[j]; }));
    for (int64_t j = 0; j <= i; ++j) ds[j] = shape.scale * p[j] * (dp[j] - d);
    for (int64_t j = i + 1; j < t; ++j) ds[j] = 0.0f;
  }
}

}  // namespace shardline::worker::cpu
