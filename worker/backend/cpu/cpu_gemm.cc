#include "worker/backend/cpu/cpu_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>

namespace shardline::worker::cpu {
namespace {

// Multiply-adds below which a GEMM runs on the calling thread alone: about
// 3 µs of one core's work, the order of a pool hand-off.
constexpr double kMinParallelMacs = 1 << 18;
// Pieces of C are multiples of this many rows and columns.
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

// How C is cut: rows in pieces of row_width (the last one shorter), columns
// in pieces of col_width.
struct Cut {
  int64_t row_width, col_width, row_pieces, col_pieces;
};

// Width of `pieces` pieces of `extent`, a multiple of kAlign.
int64_t Width(int64_t extent, int64_t pieces) {
  const int64_t aligned = (extent + kAlign - 1) / kAlign;
  return (aligned + pieces - 1) / pieces * kAlign;
}

int64_t Pieces(int64_t extent, int64_t width) { return (extent + width - 1) / width; }

// Cuts m × n into a grid of pm × pn pieces with pm · pn = threads (fewer
// where a side is too short), the grid that keeps the most threads busy and
// then packs the fewest operand elements: each piece packs its rows of A
// and its columns of B, pn·m + pm·n elements per unit of k, so near-square
// pieces; on two threads, the longer side in halves (rows on a tie).
Cut Plan(int64_t m, int64_t n, int threads) {
  Cut best{m, n, 1, 1};
  double best_cost = 0.0;
  for (int pm = threads; pm >= 1; --pm) {
    if (threads % pm != 0) continue;
    Cut cut;
    cut.row_width = Width(m, pm);
    cut.col_width = Width(n, threads / pm);
    cut.row_pieces = Pieces(m, cut.row_width);
    cut.col_pieces = Pieces(n, cut.col_width);
    const int64_t busy = cut.row_pieces * cut.col_pieces, best_busy = best.row_pieces * best.col_pieces;
    const double cost = static_cast<double>(cut.col_pieces) * m + static_cast<double>(cut.row_pieces) * n;
    if (busy > best_busy || (busy == best_busy && cost < best_cost)) {
      best = cut;
      best_cost = cost;
    }
  }
  return best;
}

// A batched GEMM cut into pieces of C for `threads` threads: each piece one
// single-threaded call. A batch of at least as many items as threads is cut
// into its items; otherwise every item's C is cut by Plan.
class GemmPieces {
 public:
  GemmPieces(const GemmOperands& g, int threads) : g_(g) {
    const GemmShape& s = g.shape;
    cut_ = threads == 1 || s.batch >= threads ? Cut{s.m, s.n, 1, 1} : Plan(s.m, s.n, threads);
    per_item_ = cut_.row_pieces * cut_.col_pieces;
  }

  int64_t count() const { return g_.shape.batch * per_item_; }

  void Run(int64_t p) const {
    const GemmShape& s = g_.shape;
    const int64_t i = p / per_item_, row = (p % per_item_) / cut_.col_pieces, col = p % cut_.col_pieces;
    const int64_t r0 = row * cut_.row_width, rows = std::min(cut_.row_width, s.m - r0);
    const int64_t c0 = col * cut_.col_width, cols = std::min(cut_.col_width, s.n - c0);
    const float* a = g_.a + i * s.stride_a + (s.trans_a ? r0 : r0 * s.lda);
    const float* b = g_.b + i * s.stride_b + (s.trans_b ? c0 * s.ldb : c0);
    Sgemm(s, rows, cols, a, b, g_.c + i * s.stride_c + r0 * s.ldc + c0);
  }

 private:
  GemmOperands g_;
  Cut cut_;
  int64_t per_item_;
};

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
  const int threads = Macs(s) < kMinParallelMacs ? 1 : pool.threads();
  const GemmPieces pieces({s, a, b, c}, threads);
  if (threads == 1) {
    for (int64_t p = 0; p < pieces.count(); ++p) pieces.Run(p);
    return;
  }
  pool.Run(pieces.count(), [&](int64_t p) { pieces.Run(p); });
}

bool PairRunsSplit(int threads, const GemmShape& first, const GemmShape& second) {
  return threads % 2 == 0 && std::min(Macs(first), Macs(second)) >= kMinParallelMacs;
}

void GemmPair(CpuThreadPool& pool, const GemmOperands& first, const GemmOperands& second) {
  const int threads = pool.threads();
  if (!PairRunsSplit(threads, first.shape, second.shape)) {
    Gemm(pool, first.shape, first.a, first.b, first.c);
    Gemm(pool, second.shape, second.a, second.b, second.c);
    return;
  }
  const GemmPieces one(first, threads / 2), two(second, threads / 2);
  pool.Run(one.count() + two.count(), [&](int64_t p) {
    if (p < one.count()) {
      one.Run(p);
    } else {
      two.Run(p - one.count());
    }
  });
}

}  // namespace shardline::worker::cpu
