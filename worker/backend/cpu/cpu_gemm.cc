#include "worker/backend/cpu/cpu_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>

namespace shardline::worker::cpu {
namespace {

// Multiply-adds below which a GEMM runs on the calling thread alone: about
// 3 µs of one core's work, the order of a pool hand-off.
constexpr double kMinParallelMacs = 1 << 18;
// Parts are multiples of this many rows or columns.
constexpr int64_t kAlign = 16;

CBLAS_TRANSPOSE Trans(bool t) { return t ? CblasTrans : CblasNoTrans; }

// One GEMM of m × n outputs on the calling thread.
void Sgemm(const GemmShape& s, int64_t m, int64_t n, const float* a, const float* b, float* c) {
  if (s.k == 0) {
    for (int64_t r = 0; r < m; ++r) {
      float* row = c + r * s.ldc;
      for (int64_t col = 0; col < n; ++col) row[col] = s.beta == 0.0f ? 0.0f : s.beta * row[col];
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, Trans(s.trans_a), Trans(s.trans_b), static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(s.k), s.alpha, a, static_cast<blasint>(s.lda), b,
              static_cast<blasint>(s.ldb), s.beta, c, static_cast<blasint>(s.ldc));
}

// Multiply-adds of the whole batch (in double: the product of valid sizes
// may pass int64).
double Macs(const GemmShape& s) {
  return static_cast<double>(s.batch) * static_cast<double>(s.m) * static_cast<double>(s.n) *
         static_cast<double>(std::max<int64_t>(s.k, 1));
}

}  // namespace

int TakeOverBlasThreads() {
  static const int before = [] {
    const int threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
    return std::max(1, threads);
  }();
  return before;
}

void Gemm(CpuThreadPool& pool, const GemmShape& s, const float* a, const float* b, float* c) {
  const int threads = pool.threads();
  auto item = [&](int64_t i) {
    Sgemm(s, s.m, s.n, a + i * s.stride_a, b + i * s.stride_b, c + i * s.stride_c);
  };
  if (threads == 1 || Macs(s) < kMinParallelMacs) {
    for (int64_t i = 0; i < s.batch; ++i) item(i);
    return;
  }
  if (s.batch >= threads) {
    pool.Run(s.batch, item);
    return;
  }
  // Each item in parts along C's longer dimension.
  const bool by_rows = s.m >= s.n;
  const int64_t extent = by_rows ? s.m : s.n;
  const int64_t aligned_parts = (extent + kAlign - 1) / kAlign;
  const int64_t parts = std::min<int64_t>(threads, aligned_parts);
  const int64_t width = (aligned_parts + parts - 1) / parts * kAlign;
  const int64_t per_item = (extent + width - 1) / width;
  pool.Run(s.batch * per_item, [&](int64_t p) {
    const int64_t i = p / per_item, begin = (p % per_item) * width, size = std::min(width, extent - begin);
    const float* ai = a + i * s.stride_a;
    const float* bi = b + i * s.stride_b;
    float* ci = c + i * s.stride_c;
    if (by_rows) {
      Sgemm(s, size, s.n, ai + (s.trans_a ? begin : begin * s.lda), bi, ci + begin * s.ldc);
    } else {
      Sgemm(s, s.m, size, ai, bi + (s.trans_b ? begin * s.ldb : begin), ci + begin);
    }
  });
}

}  // namespace shardline::worker::cpu
