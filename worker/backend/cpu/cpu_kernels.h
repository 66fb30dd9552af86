// The CPU implementations of the Backend kernels (see backend.h for what each
// computes). Plain loops, single-threaded and deterministic: the same inputs
// give bit-identical outputs. CpuBackend runs them over parts of their rows,
// columns or elements on its thread pool; none of them lets a split change
// the order of a sum. Arguments are validated by Backend before these
// run; the functions that can still fail on data (ids, targets) return
// INVALID_ARGUMENT before writing anything.
#ifndef SHARDLINE_WORKER_BACKEND_CPU_CPU_KERNELS_H_
#define SHARDLINE_WORKER_BACKEND_CPU_CPU_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "worker/backend/backend_types.h"

// Compiles a loop for AVX-512 and AVX2 besides the baseline, picked at load
// time by what the CPU has: the same arithmetic in wider vectors.
#define SHARDLINE_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace shardline::worker::cpu {

// Element-wise (cpu_elementwise.cc).
void Axpy(float alpha, const float* x, float* y, size_t n);
void Scale(float* x, size_t n, float alpha);
void Add(const float* a, const float* b, float* out, size_t n);
void BiasAdd(float* x, const float* bias, int64_t rows, int64_t cols);
// out[c] += Σ_r x[r, c] for c in [0, cols); x's rows are `stride` apart.
void SumRows(const float* x, float* out, int64_t rows, int64_t cols, int64_t stride);
void GeluForward(const float* x, float* y, size_t n);
void GeluBackward(const float* x, const float* dy, float* dx, size_t n);

// Normalisation and softmax (cpu_normalization.cc).
void LayerNormForward(const LayerNormShape& shape, const float* x, const float* gamma,
                      const float* beta, float* y, float* mean, float* rstd);
// LayerNorm's backward pass in two halves that split differently over
// threads: dx row by row, dgamma and dbeta column by column (each column's
// sum over rows in row order, whatever the split).
void LayerNormBackwardInput(const LayerNormShape& shape, const float* x, const float* gamma,
                            const float* mean, const float* rstd, const float* dy, float* dx);
// Columns [first_col, end_col) of dgamma and dbeta.
void LayerNormBackwardParams(const LayerNormShape& shape, int64_t first_col, int64_t end_col,
                             const float* x, const float* mean, const float* rstd, const float* dy,
                             float* dgamma, float* dbeta);
void CausalSoftmaxForward(const SoftmaxShape& shape, const float* scores, float* probs);
void CausalSoftmaxBackward(const SoftmaxShape& shape, const float* probs, const float* dprobs,
                           float* dscores);

// Causal attention of one (sequence, head) part, part = b·heads + h, as
// attention.h computes it, in tiles (cpu_attention.cc). `saved` holds
// CausalAttentionSavedFloats: the weights [batch, heads, t, t] for
// sequences of at most kAttentionKeyTile keys, else each query's
// log-sum-exp [batch, heads, t] (the backward pass recomputes the weights
// from it). Calls BLAS: the caller decides its threads.
inline constexpr int64_t kAttentionKeyTile = 256;
int64_t CausalAttentionSavedFloats(const AttentionShape& shape);
void CausalAttentionForward(const AttentionShape& shape, int64_t part, const float* qkv, float* out, float* saved);
void CausalAttentionBackward(const AttentionShape& shape, int64_t part, const float* qkv, const float* out,
                             const float* saved, const float* dout, float* dqkv);

// Embedding and loss (cpu_lookup.cc). CheckTargets: INVALID_ARGUMENT, as the
// loss kernels report it, where a target lies outside [-∞, classes) (below
// 0: ignored); for checking all rows before parts of them run.
absl::Status CheckTargets(const char* op, const int32_t* targets, int64_t rows, int64_t classes);
absl::Status EmbeddingForward(const EmbeddingShape& shape, const int32_t* ids, const float* table,
                              float* out, bool accumulate);
absl::Status EmbeddingBackward(const EmbeddingShape& shape, const int32_t* ids, const float* dout,
                               float* dtable);
absl::Status CrossEntropyForward(const CrossEntropyShape& shape, const float* logits,
                                 const int32_t* targets, float* losses);
absl::Status CrossEntropyBackward(const CrossEntropyShape& shape, const float* logits,
                                  const int32_t* targets, const float* lse, float grad_scale,
                                  float* dlogits);
absl::Status CrossEntropyParts(const CrossEntropyShape& shape, const float* logits, const int32_t* targets,
                               float* parts);
void CrossEntropyCombine(const LossPartsShape& shape, const float* parts, const int32_t* targets,
                         float* losses, float* lse);

// Optimizers and reductions (cpu_optimizer.cc).
void AdamWUpdate(const AdamWStep& step, float* params, const float* grads, float* m, float* v,
                 size_t n);
void SgdMomentumUpdate(const SgdStep& step, float* params, const float* grads, float* momentum,
                       size_t n);
double SumOfSquares(const float* x, size_t n);

}  // namespace shardline::worker::cpu

#endif  // SHARDLINE_WORKER_BACKEND_CPU_CPU_KERNELS_H_
