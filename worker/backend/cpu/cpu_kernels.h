// The CPU implementations of the Backend kernels (see backend.h for what each
// computes). Plain loops, single-threaded and deterministic: the same inputs
// give bit-identical outputs. Arguments are validated by Backend before these
// run; the functions that can still fail on data (ids, targets) return
// INVALID_ARGUMENT before writing anything.
#ifndef SHARDLINE_WORKER_BACKEND_CPU_CPU_KERNELS_H_
#define SHARDLINE_WORKER_BACKEND_CPU_CPU_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "worker/backend/backend_types.h"

namespace shardline::worker::cpu {

// Element-wise (cpu_elementwise.cc).
void Axpy(float alpha, const float* x, float* y, size_t n);
void Scale(float* x, size_t n, float alpha);
void Add(const float* a, const float* b, float* out, size_t n);
void BiasAdd(float* x, const float* bias, int64_t rows, int64_t cols);
void SumRows(const float* x, float* out, int64_t rows, int64_t cols);
void GeluForward(const float* x, float* y, size_t n);
void GeluBackward(const float* x, const float* dy, float* dx, size_t n);

// Normalisation and softmax (cpu_normalization.cc).
void LayerNormForward(const LayerNormShape& shape, const float* x, const float* gamma,
                      const float* beta, float* y, float* mean, float* rstd);
void LayerNormBackward(const LayerNormShape& shape, const float* x, const float* gamma,
                       const float* mean, const float* rstd, const float* dy, float* dx,
                       float* dgamma, float* dbeta);
void CausalSoftmaxForward(const SoftmaxShape& shape, const float* scores, float* probs);
void CausalSoftmaxBackward(const SoftmaxShape& shape, const float* probs, const float* dprobs,
                           float* dscores);

// Embedding and loss (cpu_lookup.cc).
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
