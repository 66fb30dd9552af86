// Causal multi-head scaled-dot-product attention composed from Backend
// primitives (strided batched GEMMs and the causal softmax), so every backend
// gets it, and gets it the same way.
//
// Layout (GPT-2): qkv is [batch, t, 3·C] with Q in columns [0, C), K in
// [C, 2C), V in [2C, 3C) and head h at columns h·head_dim of each, where
// C = heads · head_dim. out and dout are [batch, t, C]. probs is
// [batch, heads, t, t]: the forward pass writes the attention weights there
// and the backward pass reads them. The softmax scale is 1/sqrt(head_dim).
#ifndef SHARDLINE_WORKER_BACKEND_ATTENTION_H_
#define SHARDLINE_WORKER_BACKEND_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "worker/backend/backend.h"

namespace shardline::worker {

struct AttentionShape {
  int64_t batch = 0;
  int64_t t = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
};

// out = softmax(QKᵀ/sqrt(d) + causal mask) · V; probs is saved for backward.
absl::Status AttentionForward(Backend& backend, const AttentionShape& shape,
                              DeviceSpan<const float> qkv, DeviceSpan<float> out,
                              DeviceSpan<float> probs);

// dqkv += the gradient of the forward pass w.r.t. qkv. scratch holds
// [batch, heads, t, t] floats and is overwritten.
absl::Status AttentionBackward(Backend& backend, const AttentionShape& shape,
                               DeviceSpan<const float> qkv, DeviceSpan<const float> probs,
                               DeviceSpan<const float> dout, DeviceSpan<float> dqkv,
                               DeviceSpan<float> scratch);

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_BACKEND_ATTENTION_H_
