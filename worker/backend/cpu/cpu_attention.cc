// Causal attention for one sequence and head at a time, in tiles
// (FlashAttention's scheme, Dao et al. 2022, on the CPU): CpuBackend runs one
// part per (sequence, head) on its threads, each GEMM on one thread. Queries
// go in tiles of kQueryTile rows, each against only the keys it can see, in
// tiles of up to kAttentionKeyTile keys: the masked upper triangle is
// (mostly) never computed.
//
// A sequence of one key tile (t <= 256) keeps its weights, as the composed
// attention does: t² floats per head, small beside the block's other
// activations at such lengths, and recomputing them would cost the backward
// pass a fifth more GEMM work (measured 2.7 -> 3.5 ms at the large model's
// t = 128). A longer sequence keeps only each query's log-sum-exp: the
// forward pass runs a maximum and sum per query row over the key tiles
// (rescaling the output when the maximum grows), and the backward pass
// recomputes the weights tile by tile from Q, K and the log-sum-exp, with
// D = rowsum(dO ⊙ O) in place of the softmax backward's rowsum(dP ⊙ P). Its
// scores live in a 32 KB tile per thread whatever t is.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/cost_model.h"
#include "worker/backend/cpu/cpu_kernels.h"
#include "worker/backend/cpu/cpu_math.h"

namespace shardline::worker::cpu {
namespace {

constexpr int64_t kQueryTile = 32;
static_assert(kAttentionKeyTile == common::kCpuAttentionKeyTile, "the planner counts this kernel's memory");

// Row-major single-precision GEMM: C = op(A)·op(B) + beta·C.
void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// Where one (sequence, head) part's operands are.
struct HeadView {
  int64_t t, d, ld, c;  // sequence length, head width, qkv row stride (3C), out row stride (C)
  int64_t qkv_offset, out_offset, lse_offset;
  float scale;
};

HeadView View(const AttentionShape& s, int64_t part) {
  const int64_t b = part / s.heads, h = part % s.heads, c = s.heads * s.head_dim;
  return {s.t, s.head_dim, 3 * c, c, b * s.t * 3 * c + h * s.head_dim, b * s.t * c + h * s.head_dim,
          part * s.t, 1.0f / std::sqrt(static_cast<float>(s.head_dim))};
}

// Keys of [j0, j0 + width) that query i sees: none, some, or all.
int64_t Visible(int64_t i, int64_t j0, int64_t width) { return std::clamp<int64_t>(i + 1 - j0, 0, width); }

// One query row of a forward key tile: scores s[0, width) become the
// weights exp(scale·s − new max) (0 where masked, the first `seen` visible);
// the row's running max and sum are updated. Returns the factor by which
// the row's output so far must be scaled (0 on the first tile).
SHARDLINE_CPU_CLONES float ForwardRow(float* s, int64_t width, int64_t seen, float scale, bool first, float& max,
                                      float& sum) {
  if (seen == 0) {  // a row above this tile's keys (not with the tile sizes here)
    std::fill(s, s + width, 0.0f);
    if (first) {
      sum = 0.0f;
      max = -std::numeric_limits<float>::max();
    }
    return first ? 0.0f : 1.0f;
  }
  const float tile_max = ScaledMax(s, seen, scale);
  const float new_max = first || tile_max > max ? tile_max : max;
  for (int64_t j = 0; j < seen; ++j) s[j] = ExpNonPositive(scale * s[j] - new_max);
  std::fill(s + seen, s + width, 0.0f);
  const float tile_sum = static_cast<float>(LaneSum(seen, [s](int64_t j) { return static_cast<double>(s[j]); }));
  if (first) {  // max and sum hold nothing yet
    sum = tile_sum;
    max = new_max;
    return 0.0f;
  }
  const float rescale = ExpNonPositive(max - new_max);
  sum = sum * rescale + tile_sum;
  max = new_max;
  return rescale;
}

// One query row of a backward key tile: the scores s[0, width) become the
// weights exp(scale·s − lse) (0 where masked).
SHARDLINE_CPU_CLONES void RecomputeRow(float* s, int64_t width, int64_t seen, float scale, float lse) {
  for (int64_t j = 0; j < seen; ++j) {
    const float x = scale * s[j] - lse;
    s[j] = ExpNonPositive(x < 0.0f ? x : 0.0f);
  }
  std::fill(s + seen, s + width, 0.0f);
}

// dp (dO·Vᵀ) becomes the scores' gradient scale · p ⊙ (dp − d), d =
// rowsum(dO ⊙ O); 0 where masked.
SHARDLINE_CPU_CLONES void ScoreGradientRow(const float* p, float* dp, int64_t width, int64_t seen, float scale,
                                           float d) {
  for (int64_t j = 0; j < seen; ++j) dp[j] = scale * p[j] * (dp[j] - d);
  std::fill(dp + seen, dp + width, 0.0f);
}

SHARDLINE_CPU_CLONES void ScaleRow(float* x, int64_t n, float factor) {
  for (int64_t j = 0; j < n; ++j) x[j] *= factor;
}

SHARDLINE_CPU_CLONES float Dot(const float* x, const float* y, int64_t n) {
  return static_cast<float>(LaneSum(n, [x, y](int64_t j) { return static_cast<double>(x[j]) * y[j]; }));
}

bool KeepsWeights(int64_t t) { return t <= kAttentionKeyTile; }

}  // namespace

int64_t CausalAttentionSavedFloats(const AttentionShape& s) {
  return s.batch * s.heads * s.t * (KeepsWeights(s.t) ? s.t : 1);
}

void CausalAttentionForward(const AttentionShape& shape, int64_t part, const float* qkv, float* out, float* saved) {
  const HeadView v = View(shape, part);
  const float* q = qkv + v.qkv_offset;
  const float* k = q + v.c;
  const float* val = q + 2 * v.c;
  float* o = out + v.out_offset;
  const bool keep = KeepsWeights(v.t);
  alignas(64) float tile[kQueryTile * kAttentionKeyTile];
  float max[kQueryTile], sum[kQueryTile];
  for (int64_t i0 = 0; i0 < v.t; i0 += kQueryTile) {
    const int64_t i1 = std::min(v.t, i0 + kQueryTile), rows = i1 - i0;
    // The scores, then weights, of these queries: in `saved` where kept.
    float* s = keep ? saved + part * v.t * v.t + i0 * v.t : tile;
    const int64_t lds = keep ? v.t : kAttentionKeyTile;
    for (int64_t j0 = 0; j0 < i1; j0 += kAttentionKeyTile) {
      const int64_t width = std::min(kAttentionKeyTile, i1 - j0);
      const bool first = j0 == 0;
      Sgemm(false, true, rows, width, v.d, q + i0 * v.ld, v.ld, k + j0 * v.ld, v.ld, 0.0f, s, lds);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = s + r * lds;
        const float rescale = ForwardRow(row, width, Visible(i0 + r, j0, width), v.scale, first, max[r], sum[r]);
        if (keep) {
          ScaleRow(row, width, static_cast<float>(1.0 / sum[r]));  // one key tile: the sum is whole
        } else if (!first && rescale != 1.0f) {
          ScaleRow(o + (i0 + r) * v.c, v.d, rescale);
        }
      }
      Sgemm(false, false, rows, v.d, width, s, lds, val + j0 * v.ld, v.ld, first ? 0.0f : 1.0f, o + i0 * v.c,
            v.c);
    }
    if (keep) continue;
    for (int64_t r = 0; r < rows; ++r) {
      ScaleRow(o + (i0 + r) * v.c, v.d, 1.0f / sum[r]);
      saved[v.lse_offset + i0 + r] = max[r] + std::log(sum[r]);
    }
  }
}

void CausalAttentionBackward(const AttentionShape& shape, int64_t part, const float* qkv, const float* out,
                             const float* saved, const float* dout, float* dqkv) {
  const HeadView v = View(shape, part);
  const float* q = qkv + v.qkv_offset;
  const float* k = q + v.c;
  const float* val = q + 2 * v.c;
  const float* o = out + v.out_offset;
  const float* dout_h = dout + v.out_offset;
  float* dq = dqkv + v.qkv_offset;
  float* dk = dq + v.c;
  float* dv = dq + 2 * v.c;
  const bool keep = KeepsWeights(v.t);
  alignas(64) float tile[kQueryTile * kAttentionKeyTile];
  alignas(64) float dp[kQueryTile * kAttentionKeyTile];
  float d[kQueryTile];
  for (int64_t i0 = 0; i0 < v.t; i0 += kQueryTile) {
    const int64_t i1 = std::min(v.t, i0 + kQueryTile), rows = i1 - i0;
    const float* q_i = q + i0 * v.ld;
    const float* dout_i = dout_h + i0 * v.c;
    // The weights of these queries: kept, or recomputed into `tile`.
    const float* p = keep ? saved + part * v.t * v.t + i0 * v.t : tile;
    const int64_t ldp = keep ? v.t : kAttentionKeyTile;
    for (int64_t r = 0; r < rows; ++r) d[r] = Dot(dout_i + r * v.c, o + (i0 + r) * v.c, v.d);
    for (int64_t j0 = 0; j0 < i1; j0 += kAttentionKeyTile) {
      const int64_t width = std::min(kAttentionKeyTile, i1 - j0);
      // dP = dO_i V_jᵀ; where not kept, P = exp(scale · Q_i K_jᵀ − lse).
      Sgemm(false, true, rows, width, v.d, dout_i, v.c, val + j0 * v.ld, v.ld, 0.0f, dp, kAttentionKeyTile);
      if (!keep) Sgemm(false, true, rows, width, v.d, q_i, v.ld, k + j0 * v.ld, v.ld, 0.0f, tile, kAttentionKeyTile);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t seen = Visible(i0 + r, j0, width);
        if (!keep) RecomputeRow(tile + r * kAttentionKeyTile, width, seen, v.scale, saved[v.lse_offset + i0 + r]);
        ScoreGradientRow(p + r * ldp, dp + r * kAttentionKeyTile, width, seen, v.scale, d[r]);
      }
      // dV_j += Pᵀ dO_i; dQ_i += dS K_j; dK_j += dSᵀ Q_i.
      Sgemm(true, false, width, v.d, rows, p, ldp, dout_i, v.c, 1.0f, dv + j0 * v.ld, v.ld);
      Sgemm(false, false, rows, v.d, width, dp, kAttentionKeyTile, k + j0 * v.ld, v.ld, 1.0f, dq + i0 * v.ld, v.ld);
      Sgemm(true, false, width, v.d, rows, dp, kAttentionKeyTile, q_i, v.ld, 1.0f, dk + j0 * v.ld, v.ld);
    }
  }
}

}  // namespace shardline::worker::cpu
