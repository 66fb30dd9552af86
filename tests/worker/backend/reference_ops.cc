#include "tests/worker/backend/reference_ops.h"

#include <algorithm>
#include <cmath>

namespace shardline::worker::reference {

void Gemm(const GemmShape& s, const std::vector<double>& a, const std::vector<double>& b,
          std::vector<double>& c) {
  const int64_t lda = s.lda ? s.lda : (s.trans_a ? s.m : s.k);
  const int64_t ldb = s.ldb ? s.ldb : (s.trans_b ? s.k : s.n);
  const int64_t ldc = s.ldc ? s.ldc : s.n;
  for (int64_t bi = 0; bi < s.batch; ++bi) {
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double sum = 0.0;
        for (int64_t p = 0; p < s.k; ++p) {
          const double av = s.trans_a ? a[bi * s.stride_a + p * lda + i] : a[bi * s.stride_a + i * lda + p];
          const double bv = s.trans_b ? b[bi * s.stride_b + j * ldb + p] : b[bi * s.stride_b + p * ldb + j];
          sum += av * bv;
        }
        double& out = c[bi * s.stride_c + i * ldc + j];
        out = s.alpha * sum + (s.beta == 0.0f ? 0.0 : s.beta * out);
      }
    }
  }
}

double Gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double GeluGrad(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  const double u = k * (x + 0.044715 * x * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

void LayerNorm(const std::vector<double>& x, const std::vector<double>& gamma,
               const std::vector<double>& beta, int64_t rows, int64_t cols, double eps,
               std::vector<double>& y, std::vector<double>& mean, std::vector<double>& rstd) {
  y.assign(rows * cols, 0.0);
  mean.assign(rows, 0.0);
  rstd.assign(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0.0;
    for (int64_t c = 0; c < cols; ++c) mu += x[r * cols + c];
    mu /= cols;
    double var = 0.0;
    for (int64_t c = 0; c < cols; ++c) var += (x[r * cols + c] - mu) * (x[r * cols + c] - mu);
    var /= cols;
    const double s = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = (x[r * cols + c] - mu) * s * gamma[c] + beta[c];
    mean[r] = mu;
    rstd[r] = s;
  }
}

std::vector<double> CausalSoftmax(const std::vector<double>& scores, int64_t batch, int64_t t,
                                  double scale) {
  std::vector<double> p(batch * t * t, 0.0);
  for (int64_t row = 0; row < batch * t; ++row) {
    const int64_t i = row % t;
    double max = -INFINITY;
    for (int64_t j = 0; j <= i; ++j) max = std::max(max, scale * scores[row * t + j]);
    double sum = 0.0;
    for (int64_t j = 0; j <= i; ++j) sum += std::exp(scale * scores[row * t + j] - max);
    for (int64_t j = 0; j <= i; ++j) p[row * t + j] = std::exp(scale * scores[row * t + j] - max) / sum;
  }
  return p;
}

std::vector<double> CrossEntropy(const std::vector<double>& logits,
                                 const std::vector<int32_t>& targets, int64_t rows, int64_t vocab) {
  std::vector<double> loss(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    double max = -INFINITY;
    for (int64_t j = 0; j < vocab; ++j) max = std::max<double>(max, logits[r * vocab + j]);
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(logits[r * vocab + j] - max);
    loss[r] = max + std::log(sum) - logits[r * vocab + targets[r]];
  }
  return loss;
}

std::vector<double> Attention(const AttentionShape& s, const std::vector<double>& qkv) {
  const int64_t c = s.heads * s.head_dim, t = s.t, d = s.head_dim;
  std::vector<double> out(s.batch * t * c, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      auto q = [&](int64_t i, int64_t x) { return static_cast<double>(qkv[(b * t + i) * 3 * c + h * d + x]); };
      auto k = [&](int64_t i, int64_t x) { return static_cast<double>(qkv[(b * t + i) * 3 * c + c + h * d + x]); };
      auto v = [&](int64_t i, int64_t x) { return static_cast<double>(qkv[(b * t + i) * 3 * c + 2 * c + h * d + x]); };
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> w(i + 1);
        double max = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t x = 0; x < d; ++x) dot += q(i, x) * k(j, x);
          w[j] = dot * scale;
          max = std::max(max, w[j]);
        }
        double sum = 0.0;
        for (double& wj : w) sum += (wj = std::exp(wj - max));
        for (int64_t x = 0; x < d; ++x) {
          double acc = 0.0;
          for (int64_t j = 0; j <= i; ++j) acc += w[j] / sum * v(j, x);
          out[(b * t + i) * c + h * d + x] = acc;
        }
      }
    }
  }
  return out;
}

}  // namespace shardline::worker::reference
