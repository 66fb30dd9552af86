// Causal multi-head scaled-dot-product attention.
//
// Layout (GPT-2): qkv is [batch, t, 3·C] with Q in columns [0, C), K in
// [C, 2C), V in [2C, 3C) and head h at columns h·head_dim of each, where
// C = heads · head_dim. out and dout are [batch, t, C]. The softmax scale is
// 1/sqrt(head_dim).
//
// What the forward pass keeps for the backward pass besides qkv and out
// (which the caller keeps anyway) is `saved`, AttentionSavedFloats of it:
// the [batch, heads, t, t] attention weights, or where the backend's kernel
// recomputes them in the backward pass (the CPU's, for sequences longer
// than its 256-key tiles), [batch, heads, t] floats: each query's
// log-sum-exp of its scaled scores.
#ifndef SHARDLINE_WORKER_BACKEND_ATTENTION_H_
#define SHARDLINE_WORKER_BACKEND_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backend/backend.h"

namespace shardline::worker {

// AttentionShape is in backend_types.h.
//
// AttentionForward and AttentionBackward validate their arguments and run
// the backend's own attention kernel where it has one (the CPU's: tiled, one
// part per sequence and head on its threads, the masked tiles skipped),
// else the composed version below, which needs `scratch` in the backward pass.

// Floats of `saved` on `backend`; of the backward pass's `scratch`
// (batch · heads · t² for the composed version, 0 for a kernel).
absl::StatusOr<int64_t> AttentionSavedFloats(const Backend& backend, const AttentionShape& shape);
absl::StatusOr<int64_t> AttentionScratchFloats(const Backend& backend, const AttentionShape& shape);

// out = softmax(QKᵀ/sqrt(d) + causal mask) · V; saved is kept for backward.
absl::Status AttentionForward(Backend& backend, const AttentionShape& shape, DeviceSpan<const float> qkv,
                              DeviceSpan<float> out, DeviceSpan<float> saved);

// dqkv += the gradient of the forward pass w.r.t. qkv, given that pass's
// out and saved. scratch is overwritten.
absl::Status AttentionBackward(Backend& backend, const AttentionShape& shape, DeviceSpan<const float> qkv,
                               DeviceSpan<const float> out, DeviceSpan<const float> saved,
                               DeviceSpan<const float> dout, DeviceSpan<float> dqkv, DeviceSpan<float> scratch);

// The same two, composed from strided batched GEMMs over heads and the causal
// softmax whatever the backend, keeping the weights (probs, [batch, heads,
// t, t]); scratch holds as many floats: what backends without a kernel of
// their own run, and the oracle the kernels are tested against.
absl::Status ComposedAttentionForward(Backend& backend, const AttentionShape& shape, DeviceSpan<const float> qkv,
                                      DeviceSpan<float> out, DeviceSpan<float> probs);
absl::Status ComposedAttentionBackward(Backend& backend, const AttentionShape& shape, DeviceSpan<const float> qkv,
                                       DeviceSpan<const float> out, DeviceSpan<const float> probs,
                                       DeviceSpan<const float> dout, DeviceSpan<float> dqkv,
                                       DeviceSpan<float> scratch);

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_BACKEND_ATTENTION_H_
