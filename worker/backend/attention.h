// Causal multi-head scaled-dot-product attention.
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

// AttentionShape is in backend_types.h.
//
// AttentionForward and AttentionBackward validate their arguments and run
// the backend's own attention kernel where it has one (the CPU's: one part
// per sequence and head on its threads, the masked blocks skipped), else
// the composed version below. Either way probs holds the same weights.

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

// The same two, composed from strided batched GEMMs over heads and the causal
// softmax whatever the backend: what backends without a kernel of their own
// run, and the oracle the kernels are tested against.
absl::Status ComposedAttentionForward(Backend& backend, const AttentionShape& shape,
                                      DeviceSpan<const float> qkv, DeviceSpan<float> out,
                                      DeviceSpan<float> probs);
absl::Status ComposedAttentionBackward(Backend& backend, const AttentionShape& shape,
                                       DeviceSpan<const float> qkv, DeviceSpan<const float> probs,
                                       DeviceSpan<const float> dout, DeviceSpan<float> dqkv,
                                       DeviceSpan<float> scratch);

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_BACKEND_ATTENTION_H_
