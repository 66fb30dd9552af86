#include "worker/backend/attention.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "worker/backend/backend_checks.h"

namespace shardline::worker {
namespace {

using backend_checks::CheckSpan;

// Element counts of the operands, after checking the dimensions.
struct AttentionSizes {
  int64_t c = 0;          // model width: heads · head_dim
  size_t qkv = 0;         // batch · t · 3C
  size_t out = 0;         // batch · t · C
  size_t probs = 0;       // batch · heads · t · t
  size_t qkv_batch = 0;   // t · 3C: one sequence of qkv
  size_t out_batch = 0;   // t · C
  size_t probs_batch = 0; // heads · t · t
};

absl::StatusOr<AttentionSizes> Sizes(absl::string_view op, const AttentionShape& s) {
  if (s.batch < 0 || s.t <= 0 || s.heads <= 0 || s.head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": batch must be >= 0 and t, heads, head_dim positive; got ", s.batch,
                     ", ", s.t, ", ", s.heads, ", ", s.head_dim));
  }
  AttentionSizes sizes;
  absl::StatusOr<int64_t> qkv = common::NumElements({s.batch, s.t, 3, s.heads, s.head_dim});
  absl::StatusOr<int64_t> probs = common::NumElements({s.batch, s.heads, s.t, s.t});
  if (!qkv.ok()) return absl::InvalidArgumentError(absl::StrCat(op, ": ", qkv.status().message()));
  if (!probs.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", probs.status().message()));
  }
  sizes.c = s.heads * s.head_dim;
  sizes.qkv = static_cast<size_t>(*qkv);
  sizes.out = sizes.qkv / 3;
  sizes.probs = static_cast<size_t>(*probs);
  sizes.qkv_batch = static_cast<size_t>(s.t * 3 * sizes.c);
  sizes.out_batch = static_cast<size_t>(s.t * sizes.c);
  sizes.probs_batch = static_cast<size_t>(s.heads * s.t * s.t);
  return sizes;
}

// One GEMM per sequence, batched over heads. Operands are addressed by
// (element offset of the head-0 matrix, row stride, stride between heads).
GemmShape HeadBatched(const AttentionShape& s, bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, int64_t lda, int64_t stride_a, int64_t ldb, int64_t stride_b,
                      int64_t ldc, int64_t stride_c, float beta) {
  GemmShape g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = m;
  g.n = n;
  g.k = k;
  g.beta = beta;
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  g.batch = s.heads;
  g.stride_a = stride_a;
  g.stride_b = stride_b;
  g.stride_c = stride_c;
  return g;
}

// The operands' element counts, after checking the dimensions and the spans
// (scratch only where the attention is composed).
absl::StatusOr<AttentionSizes> CheckForward(absl::string_view op, const Backend& backend, const AttentionShape& shape,
                                            DeviceSpan<const float> qkv, DeviceSpan<float> out,
                                            DeviceSpan<float> saved, bool composed) {
  ASSIGN_OR_RETURN(AttentionSizes z, Sizes(op, shape));
  RETURN_IF_ERROR(CheckSpan(op, "qkv", qkv, z.qkv));
  RETURN_IF_ERROR(CheckSpan(op, "out", out, z.out));
  const size_t saved_floats = composed ? z.probs : static_cast<size_t>(backend.AttentionKernelSavedFloats(shape));
  RETURN_IF_ERROR(CheckSpan(op, "saved", saved, saved_floats));
  return z;
}

absl::StatusOr<AttentionSizes> CheckBackward(absl::string_view op, const Backend& backend,
                                             const AttentionShape& shape, DeviceSpan<const float> qkv,
                                             DeviceSpan<const float> out, DeviceSpan<const float> saved,
                                             DeviceSpan<const float> dout, DeviceSpan<float> dqkv,
                                             DeviceSpan<float> scratch, bool composed) {
  ASSIGN_OR_RETURN(AttentionSizes z, Sizes(op, shape));
  RETURN_IF_ERROR(CheckSpan(op, "qkv", qkv, z.qkv));
  RETURN_IF_ERROR(CheckSpan(op, "out", out, z.out));
  const size_t saved_floats = composed ? z.probs : static_cast<size_t>(backend.AttentionKernelSavedFloats(shape));
  RETURN_IF_ERROR(CheckSpan(op, "saved", saved, saved_floats));
  RETURN_IF_ERROR(CheckSpan(op, "dout", dout, z.out));
  RETURN_IF_ERROR(CheckSpan(op, "dqkv", dqkv, z.qkv));
  if (composed) RETURN_IF_ERROR(CheckSpan(op, "scratch", scratch, z.probs));
  return z;
}

}  // namespace

absl::StatusOr<int64_t> AttentionSavedFloats(const Backend& backend, const AttentionShape& shape) {
  ASSIGN_OR_RETURN(AttentionSizes z, Sizes("AttentionSavedFloats", shape));
  return backend.has_attention_kernel() ? backend.AttentionKernelSavedFloats(shape) : static_cast<int64_t>(z.probs);
}

absl::StatusOr<int64_t> AttentionScratchFloats(const Backend& backend, const AttentionShape& shape) {
  ASSIGN_OR_RETURN(AttentionSizes z, Sizes("AttentionScratchFloats", shape));
  return backend.has_attention_kernel() ? 0 : static_cast<int64_t>(z.probs);
}

absl::Status AttentionForward(Backend& backend, const AttentionShape& shape, DeviceSpan<const float> qkv,
                              DeviceSpan<float> out, DeviceSpan<float> saved) {
  if (!backend.has_attention_kernel()) return ComposedAttentionForward(backend, shape, qkv, out, saved);
  RETURN_IF_ERROR(CheckForward("AttentionForward", backend, shape, qkv, out, saved, false).status());
  if (shape.batch == 0) return absl::OkStatus();
  return backend.AttentionForwardKernel(shape, qkv.data(), out.data(), saved.data());
}

absl::Status AttentionBackward(Backend& backend, const AttentionShape& shape, DeviceSpan<const float> qkv,
                               DeviceSpan<const float> out, DeviceSpan<const float> saved,
                               DeviceSpan<const float> dout, DeviceSpan<float> dqkv, DeviceSpan<float> scratch) {
  if (!backend.has_attention_kernel()) {
    return ComposedAttentionBackward(backend, shape, qkv, out, saved, dout, dqkv, scratch);
  }
  RETURN_IF_ERROR(
      CheckBackward("AttentionBackward", backend, shape, qkv, out, saved, dout, dqkv, scratch, false).status());
  if (shape.batch == 0) return absl::OkStatus();
  return backend.AttentionBackwardKernel(shape, qkv.data(), out.data(), saved.data(), dout.data(), dqkv.data());
}

absl::Status ComposedAttentionForward(Backend& backend, const AttentionShape& shape, DeviceSpan<const float> qkv,
                                      DeviceSpan<float> out, DeviceSpan<float> probs) {
  ASSIGN_OR_RETURN(AttentionSizes z, CheckForward("AttentionForward", backend, shape, qkv, out, probs, true));
  const int64_t t = shape.t, d = shape.head_dim, c = z.c, tt = t * t;

  // scores = Q · Kᵀ, one [t × t] matrix per head, written into probs.
  const GemmShape scores = HeadBatched(shape, false, true, t, t, d, 3 * c, d, 3 * c, d, t, tt, 0.0f);
  // out = P · V, written straight into the [t, C] layout.
  const GemmShape mix = HeadBatched(shape, false, false, t, d, t, t, tt, 3 * c, d, c, d, 0.0f);
  for (int64_t b = 0; b < shape.batch; ++b) {
    DeviceSpan<const float> qkv_b = qkv.subspan(b * z.qkv_batch, z.qkv_batch);
    DeviceSpan<float> probs_b = probs.subspan(b * z.probs_batch, z.probs_batch);
    RETURN_IF_ERROR(backend.Gemm(scores, qkv_b, qkv_b.subspan(c), probs_b));
  }
  const SoftmaxShape softmax{shape.batch * shape.heads, t, 1.0f / std::sqrt(static_cast<float>(d))};
  RETURN_IF_ERROR(backend.CausalSoftmaxForward(softmax, probs.subspan(0, z.probs), probs.subspan(0, z.probs)));
  for (int64_t b = 0; b < shape.batch; ++b) {
    DeviceSpan<const float> qkv_b = qkv.subspan(b * z.qkv_batch, z.qkv_batch);
    DeviceSpan<const float> probs_b = probs.subspan(b * z.probs_batch, z.probs_batch);
    RETURN_IF_ERROR(
        backend.Gemm(mix, probs_b, qkv_b.subspan(2 * c), out.subspan(b * z.out_batch, z.out_batch)));
  }
  return absl::OkStatus();
}

absl::Status ComposedAttentionBackward(Backend& backend, const AttentionShape& shape, DeviceSpan<const float> qkv,
                                       DeviceSpan<const float> out, DeviceSpan<const float> probs,
                                       DeviceSpan<const float> dout, DeviceSpan<float> dqkv,
                                       DeviceSpan<float> scratch) {
  ASSIGN_OR_RETURN(AttentionSizes z,
                   CheckBackward("AttentionBackward", backend, shape, qkv, out, probs, dout, dqkv, scratch, true));
  const int64_t t = shape.t, d = shape.head_dim, c = z.c, tt = t * t;

  // dP = dO · Vᵀ (into scratch); dV += Pᵀ · dO.
  const GemmShape dprobs = HeadBatched(shape, false, true, t, t, d, c, d, 3 * c, d, t, tt, 0.0f);
  const GemmShape dv = HeadBatched(shape, true, false, t, d, t, t, tt, c, d, 3 * c, d, 1.0f);
  for (int64_t b = 0; b < shape.batch; ++b) {
    DeviceSpan<const float> qkv_b = qkv.subspan(b * z.qkv_batch, z.qkv_batch);
    DeviceSpan<const float> dout_b = dout.subspan(b * z.out_batch, z.out_batch);
    DeviceSpan<float> dqkv_b = dqkv.subspan(b * z.qkv_batch, z.qkv_batch);
    RETURN_IF_ERROR(backend.Gemm(dprobs, dout_b, qkv_b.subspan(2 * c),
                                 scratch.subspan(b * z.probs_batch, z.probs_batch)));
    RETURN_IF_ERROR(backend.Gemm(dv, probs.subspan(b * z.probs_batch, z.probs_batch), dout_b,
                                 dqkv_b.subspan(2 * c)));
  }
  // dS = scale · P ⊙ (dP − rowsum(dP ⊙ P)), in place in scratch.
  const SoftmaxShape softmax{shape.batch * shape.heads, t, 1.0f / std::sqrt(static_cast<float>(d))};
  RETURN_IF_ERROR(backend.CausalSoftmaxBackward(softmax, probs.subspan(0, z.probs), scratch.subspan(0, z.probs),
                                                scratch.subspan(0, z.probs)));
  // dQ += dS · K; dK += dSᵀ · Q.
  const GemmShape dq = HeadBatched(shape, false, false, t, d, t, t, tt, 3 * c, d, 3 * c, d, 1.0f);
  const GemmShape dk = HeadBatched(shape, true, false, t, d, t, t, tt, 3 * c, d, 3 * c, d, 1.0f);
  for (int64_t b = 0; b < shape.batch; ++b) {
    DeviceSpan<const float> qkv_b = qkv.subspan(b * z.qkv_batch, z.qkv_batch);
    DeviceSpan<const float> ds_b = scratch.subspan(b * z.probs_batch, z.probs_batch);
    DeviceSpan<float> dqkv_b = dqkv.subspan(b * z.qkv_batch, z.qkv_batch);
    RETURN_IF_ERROR(backend.Gemm(dq, ds_b, qkv_b.subspan(c), dqkv_b));
    RETURN_IF_ERROR(backend.Gemm(dk, ds_b, qkv_b, dqkv_b.subspan(c)));
  }
  return absl::OkStatus();
}

}  // namespace shardline::worker
