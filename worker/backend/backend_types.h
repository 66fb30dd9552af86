// Plain argument structs for Backend operations (see backend.h). Each holds
// dimensions and scalars only; the data travels as DeviceSpans.
#ifndef SHARDLINE_WORKER_BACKEND_BACKEND_TYPES_H_
#define SHARDLINE_WORKER_BACKEND_BACKEND_TYPES_H_

#include <cstdint>

namespace shardline::worker {

// Row-major batched GEMM. For each i in [0, batch):
//   C_i [m×n] = alpha · op(A_i) [m×k] · op(B_i) [k×n] + beta · C_i
// op(X) is X, or Xᵀ when trans_x. A_i starts at a + i·stride_a (elements),
// likewise B_i and C_i. lda/ldb/ldc are the row strides of the matrices as
// stored (A is stored [m×k], or [k×m] when transposed); 0 means tightly
// packed. A stride of 0 repeats the same A or B for every batch entry. The C_i
// must not overlap each other. beta = 0 ignores C's old contents (NaN too).
struct GemmShape {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  int64_t lda = 0;
  int64_t ldb = 0;
  int64_t ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0;
  int64_t stride_b = 0;
  int64_t stride_c = 0;
};

// Causal multi-head attention (attention.h): qkv [batch, t, 3·heads·head_dim],
// probs [batch, heads, t, t].
struct AttentionShape {
  int64_t batch = 0;
  int64_t t = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
};

// x, y, dx, dy: [rows × cols]; gamma, beta, dgamma, dbeta: [cols];
// mean, rstd: [rows].
struct LayerNormShape {
  int64_t rows = 0;
  int64_t cols = 0;
  float eps = 1e-5f;
};

// scores, probs: [batch × t × t].
struct SoftmaxShape {
  int64_t batch = 0;
  int64_t t = 0;
  float scale = 1.0f;
};

// ids: [rows]; table: [vocab × dim]; out: [rows × dim]. A vocabulary-
// parallel rank's table holds rows [first, first + vocab) of a table of
// `total` rows (total 0: the whole table, first 0): ids must lie in
// [0, total), and an id whose row is held elsewhere reads as zeros and
// adds nothing to the gradient.
struct EmbeddingShape {
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t dim = 0;
  int64_t first = 0;
  int64_t total = 0;
  int64_t ids() const { return total > 0 ? total : vocab; }
};

// logits, dlogits: [rows × vocab]; targets, losses: [rows]. The logits may
// be classes [first, first + vocab) of `total` (a vocabulary-parallel rank's
// slice; total 0: all of them): targets lie in [0, total), or < 0 (ignored).
struct CrossEntropyShape {
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t first = 0;
  int64_t total = 0;
  int64_t classes() const { return total > 0 ? total : vocab; }
  bool whole() const { return first == 0 && classes() == vocab; }
};

// The loss of rows whose classes are split into `slices` slices:
// parts [slices × rows × 3], slice by slice (CrossEntropyParts); targets,
// losses, lse: [rows].
struct LossPartsShape {
  int64_t rows = 0;
  int64_t slices = 0;
};

// One AdamW step (decoupled weight decay, as torch.optim.AdamW):
//   m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//   p −= lr · ( (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + eps) + weight_decay · p )
// step is t, counted from 1.
struct AdamWStep {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;
};

// SGD with momentum (torch.optim.SGD, dampening 0, not Nesterov):
//   g' = g + weight_decay·p;  buf = momentum·buf + g';  p −= lr·buf
struct SgdStep {
  float lr = 1e-2f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_BACKEND_BACKEND_TYPES_H_
