#include "worker/backend/backend.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backend/backend_checks.h"

namespace shardline::worker {
namespace {

using backend_checks::CheckSpan;
using backend_checks::Invalid;

// rows × cols as an element count; rejects negative or overflowing sizes.
absl::StatusOr<uint64_t> Count(absl::string_view op, int64_t rows, int64_t cols) {
  absl::StatusOr<int64_t> n = common::NumElements({rows, cols});
  if (!n.ok()) return Invalid(op, n.status().message());
  return static_cast<uint64_t>(*n);
}

absl::Status CheckPositive(absl::string_view op, absl::string_view name, int64_t value) {
  if (value <= 0) return Invalid(op, absl::StrCat(name, " must be positive, got ", value));
  return absl::OkStatus();
}

// A slice [first, first + held) of `total` (0: the whole, first 0).
absl::Status CheckSlice(absl::string_view op, int64_t first, int64_t held, int64_t total) {
  if (first < 0 || total < 0 || (total == 0 && first != 0) || (total > 0 && first > total - held)) {
    return Invalid(op, absl::StrCat("slice [", first, ", ", first + held, ") is not inside [0, ",
                                    total > 0 ? total : held, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckHalfDType(absl::string_view op, common::DType dtype) {
  if (dtype != common::DType::kBF16 && dtype != common::DType::kF16) {
    return Invalid(op, absl::StrCat("dtype must be bf16 or f16, got ", common::DTypeName(dtype)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeviceBuffer> Backend::AllocateZeros(size_t count) {
  if (count > static_cast<size_t>(common::kMaxElements)) {
    return Invalid("AllocateZeros", absl::StrCat(count, " elements is more than 2^48"));
  }
  ASSIGN_OR_RETURN(DeviceBuffer buffer, Allocate(count * sizeof(float)));
  RETURN_IF_ERROR(Fill(buffer.span<float>(), 0.0f));
  return buffer;
}

absl::Status Backend::Fill(DeviceSpan<float> x, float value) {
  if (x.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan("Fill", "x", x, x.size()));
  return FillImpl(x.data(), x.size(), value);
}

absl::Status Backend::Axpy(float alpha, DeviceSpan<const float> x, DeviceSpan<float> y) {
  if (x.size() != y.size()) {
    return Invalid("Axpy", absl::StrCat("x has ", x.size(), " elements, y ", y.size()));
  }
  if (x.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan("Axpy", "x", x, x.size()));
  RETURN_IF_ERROR(CheckSpan("Axpy", "y", y, y.size()));
  return AxpyImpl(alpha, x.data(), y.data(), x.size());
}

absl::Status Backend::Scale(DeviceSpan<float> x, float alpha) {
  if (x.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan("Scale", "x", x, x.size()));
  return ScaleImpl(x.data(), x.size(), alpha);
}

absl::Status Backend::Add(DeviceSpan<const float> a, DeviceSpan<const float> b,
                          DeviceSpan<float> out) {
  if (a.size() != b.size() || out.size() < a.size()) {
    return Invalid("Add", absl::StrCat("sizes a=", a.size(), " b=", b.size(), " out=", out.size()));
  }
  if (a.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan("Add", "a", a, a.size()));
  RETURN_IF_ERROR(CheckSpan("Add", "b", b, a.size()));
  RETURN_IF_ERROR(CheckSpan("Add", "out", out, a.size()));
  return AddImpl(a.data(), b.data(), out.data(), a.size());
}

absl::Status Backend::BiasAdd(DeviceSpan<float> x, DeviceSpan<const float> bias, int64_t rows,
                              int64_t cols) {
  ASSIGN_OR_RETURN(uint64_t n, Count("BiasAdd", rows, cols));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan("BiasAdd", "x", x, n));
  RETURN_IF_ERROR(CheckSpan("BiasAdd", "bias", bias, cols));
  return BiasAddImpl(x.data(), bias.data(), rows, cols);
}

absl::Status Backend::SumRows(DeviceSpan<const float> x, DeviceSpan<float> out, int64_t rows,
                              int64_t cols) {
  ASSIGN_OR_RETURN(uint64_t n, Count("SumRows", rows, cols));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan("SumRows", "x", x, n));
  RETURN_IF_ERROR(CheckSpan("SumRows", "out", out, cols));
  return SumRowsImpl(x.data(), out.data(), rows, cols);
}

absl::Status Backend::GeluForward(DeviceSpan<const float> x, DeviceSpan<float> y) {
  if (x.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan("GeluForward", "x", x, x.size()));
  RETURN_IF_ERROR(CheckSpan("GeluForward", "y", y, x.size()));
  return GeluForwardImpl(x.data(), y.data(), x.size());
}

absl::Status Backend::GeluBackward(DeviceSpan<const float> x, DeviceSpan<const float> dy,
                                   DeviceSpan<float> dx) {
  if (x.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan("GeluBackward", "x", x, x.size()));
  RETURN_IF_ERROR(CheckSpan("GeluBackward", "dy", dy, x.size()));
  RETURN_IF_ERROR(CheckSpan("GeluBackward", "dx", dx, x.size()));
  return GeluBackwardImpl(x.data(), dy.data(), dx.data(), x.size());
}

absl::Status Backend::LayerNormForward(const LayerNormShape& shape, DeviceSpan<const float> x,
                                       DeviceSpan<const float> gamma, DeviceSpan<const float> beta,
                                       DeviceSpan<float> y, DeviceSpan<float> mean,
                                       DeviceSpan<float> rstd) {
  constexpr absl::string_view op = "LayerNormForward";
  RETURN_IF_ERROR(CheckPositive(op, "cols", shape.cols));
  if (!(shape.eps > 0.0f)) return Invalid(op, "eps must be positive");
  ASSIGN_OR_RETURN(uint64_t n, Count(op, shape.rows, shape.cols));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan(op, "x", x, n));
  RETURN_IF_ERROR(CheckSpan(op, "gamma", gamma, shape.cols));
  RETURN_IF_ERROR(CheckSpan(op, "beta", beta, shape.cols));
  RETURN_IF_ERROR(CheckSpan(op, "y", y, n));
  RETURN_IF_ERROR(CheckSpan(op, "mean", mean, shape.rows));
  RETURN_IF_ERROR(CheckSpan(op, "rstd", rstd, shape.rows));
  return LayerNormForwardImpl(shape, x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                              rstd.data());
}

absl::Status Backend::LayerNormBackward(const LayerNormShape& shape, DeviceSpan<const float> x,
                                        DeviceSpan<const float> gamma,
                                        DeviceSpan<const float> mean, DeviceSpan<const float> rstd,
                                        DeviceSpan<const float> dy, DeviceSpan<float> dx,
                                        DeviceSpan<float> dgamma, DeviceSpan<float> dbeta) {
  constexpr absl::string_view op = "LayerNormBackward";
  RETURN_IF_ERROR(CheckPositive(op, "cols", shape.cols));
  ASSIGN_OR_RETURN(uint64_t n, Count(op, shape.rows, shape.cols));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan(op, "x", x, n));
  RETURN_IF_ERROR(CheckSpan(op, "gamma", gamma, shape.cols));
  RETURN_IF_ERROR(CheckSpan(op, "mean", mean, shape.rows));
  RETURN_IF_ERROR(CheckSpan(op, "rstd", rstd, shape.rows));
  RETURN_IF_ERROR(CheckSpan(op, "dy", dy, n));
  RETURN_IF_ERROR(CheckSpan(op, "dx", dx, n));
  RETURN_IF_ERROR(CheckSpan(op, "dgamma", dgamma, shape.cols));
  RETURN_IF_ERROR(CheckSpan(op, "dbeta", dbeta, shape.cols));
  return LayerNormBackwardImpl(shape, x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(),
                               dx.data(), dgamma.data(), dbeta.data());
}

absl::Status Backend::CausalSoftmaxForward(const SoftmaxShape& shape,
                                           DeviceSpan<const float> scores,
                                           DeviceSpan<float> probs) {
  constexpr absl::string_view op = "CausalSoftmaxForward";
  RETURN_IF_ERROR(CheckPositive(op, "t", shape.t));
  ASSIGN_OR_RETURN(uint64_t rows, Count(op, shape.batch, shape.t));
  ASSIGN_OR_RETURN(uint64_t n, Count(op, static_cast<int64_t>(rows), shape.t));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan(op, "scores", scores, n));
  RETURN_IF_ERROR(CheckSpan(op, "probs", probs, n));
  return CausalSoftmaxForwardImpl(shape, scores.data(), probs.data());
}

absl::Status Backend::CausalSoftmaxBackward(const SoftmaxShape& shape,
                                            DeviceSpan<const float> probs,
                                            DeviceSpan<const float> dprobs,
                                            DeviceSpan<float> dscores) {
  constexpr absl::string_view op = "CausalSoftmaxBackward";
  RETURN_IF_ERROR(CheckPositive(op, "t", shape.t));
  ASSIGN_OR_RETURN(uint64_t rows, Count(op, shape.batch, shape.t));
  ASSIGN_OR_RETURN(uint64_t n, Count(op, static_cast<int64_t>(rows), shape.t));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan(op, "probs", probs, n));
  RETURN_IF_ERROR(CheckSpan(op, "dprobs", dprobs, n));
  RETURN_IF_ERROR(CheckSpan(op, "dscores", dscores, n));
  return CausalSoftmaxBackwardImpl(shape, probs.data(), dprobs.data(), dscores.data());
}

absl::Status Backend::EmbeddingForward(const EmbeddingShape& shape, DeviceSpan<const int32_t> ids,
                                       DeviceSpan<const float> table, DeviceSpan<float> out,
                                       bool accumulate) {
  constexpr absl::string_view op = "EmbeddingForward";
  RETURN_IF_ERROR(CheckPositive(op, "vocab", shape.vocab));
  RETURN_IF_ERROR(CheckPositive(op, "dim", shape.dim));
  RETURN_IF_ERROR(CheckSlice(op, shape.first, shape.vocab, shape.total));
  ASSIGN_OR_RETURN(uint64_t n, Count(op, shape.rows, shape.dim));
  ASSIGN_OR_RETURN(uint64_t table_n, Count(op, shape.vocab, shape.dim));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan(op, "ids", ids, shape.rows));
  RETURN_IF_ERROR(CheckSpan(op, "table", table, table_n));
  RETURN_IF_ERROR(CheckSpan(op, "out", out, n));
  return EmbeddingForwardImpl(shape, ids.data(), table.data(), out.data(), accumulate);
}

absl::Status Backend::EmbeddingBackward(const EmbeddingShape& shape, DeviceSpan<const int32_t> ids,
                                        DeviceSpan<const float> dout, DeviceSpan<float> dtable) {
  constexpr absl::string_view op = "EmbeddingBackward";
  RETURN_IF_ERROR(CheckPositive(op, "vocab", shape.vocab));
  RETURN_IF_ERROR(CheckPositive(op, "dim", shape.dim));
  RETURN_IF_ERROR(CheckSlice(op, shape.first, shape.vocab, shape.total));
  ASSIGN_OR_RETURN(uint64_t n, Count(op, shape.rows, shape.dim));
  ASSIGN_OR_RETURN(uint64_t table_n, Count(op, shape.vocab, shape.dim));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan(op, "ids", ids, shape.rows));
  RETURN_IF_ERROR(CheckSpan(op, "dout", dout, n));
  RETURN_IF_ERROR(CheckSpan(op, "dtable", dtable, table_n));
  return EmbeddingBackwardImpl(shape, ids.data(), dout.data(), dtable.data());
}

absl::Status Backend::CrossEntropyForward(const CrossEntropyShape& shape,
                                          DeviceSpan<const float> logits,
                                          DeviceSpan<const int32_t> targets,
                                          DeviceSpan<float> losses) {
  constexpr absl::string_view op = "CrossEntropyForward";
  RETURN_IF_ERROR(CheckPositive(op, "vocab", shape.vocab));
  RETURN_IF_ERROR(CheckSlice(op, shape.first, shape.vocab, shape.total));
  if (!shape.whole()) return Invalid(op, "takes whole rows of logits (a slice's: CrossEntropyParts)");
  ASSIGN_OR_RETURN(uint64_t n, Count(op, shape.rows, shape.vocab));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan(op, "logits", logits, n));
  RETURN_IF_ERROR(CheckSpan(op, "targets", targets, shape.rows));
  RETURN_IF_ERROR(CheckSpan(op, "losses", losses, shape.rows));
  return CrossEntropyForwardImpl(shape, logits.data(), targets.data(), losses.data());
}

absl::Status Backend::CrossEntropyBackward(const CrossEntropyShape& shape,
                                           DeviceSpan<const float> logits,
                                           DeviceSpan<const int32_t> targets, float grad_scale,
                                           DeviceSpan<float> dlogits, DeviceSpan<const float> lse) {
  constexpr absl::string_view op = "CrossEntropyBackward";
  RETURN_IF_ERROR(CheckPositive(op, "vocab", shape.vocab));
  RETURN_IF_ERROR(CheckSlice(op, shape.first, shape.vocab, shape.total));
  if (lse.empty() && !shape.whole()) {
    return Invalid(op, "a slice of the classes needs the rows' log-sum-exp (lse)");
  }
  ASSIGN_OR_RETURN(uint64_t n, Count(op, shape.rows, shape.vocab));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan(op, "logits", logits, n));
  RETURN_IF_ERROR(CheckSpan(op, "targets", targets, shape.rows));
  RETURN_IF_ERROR(CheckSpan(op, "dlogits", dlogits, n));
  if (!lse.empty()) RETURN_IF_ERROR(CheckSpan(op, "lse", lse, shape.rows));
  return CrossEntropyBackwardImpl(shape, logits.data(), targets.data(), lse.empty() ? nullptr : lse.data(),
                                  grad_scale, dlogits.data());
}

absl::Status Backend::CrossEntropyParts(const CrossEntropyShape& shape, DeviceSpan<const float> logits,
                                        DeviceSpan<const int32_t> targets, DeviceSpan<float> parts) {
  constexpr absl::string_view op = "CrossEntropyParts";
  RETURN_IF_ERROR(CheckPositive(op, "vocab", shape.vocab));
  RETURN_IF_ERROR(CheckSlice(op, shape.first, shape.vocab, shape.total));
  ASSIGN_OR_RETURN(uint64_t n, Count(op, shape.rows, shape.vocab));
  ASSIGN_OR_RETURN(uint64_t parts_n, Count(op, shape.rows, 3));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan(op, "logits", logits, n));
  RETURN_IF_ERROR(CheckSpan(op, "targets", targets, shape.rows));
  RETURN_IF_ERROR(CheckSpan(op, "parts", parts, parts_n));
  return CrossEntropyPartsImpl(shape, logits.data(), targets.data(), parts.data());
}

absl::Status Backend::CrossEntropyCombine(const LossPartsShape& shape, DeviceSpan<const float> parts,
                                          DeviceSpan<const int32_t> targets, DeviceSpan<float> losses,
                                          DeviceSpan<float> lse) {
  constexpr absl::string_view op = "CrossEntropyCombine";
  RETURN_IF_ERROR(CheckPositive(op, "slices", shape.slices));
  ASSIGN_OR_RETURN(uint64_t rows, Count(op, shape.rows, 1));
  ASSIGN_OR_RETURN(uint64_t per_slice, Count(op, shape.rows, 3));
  ASSIGN_OR_RETURN(uint64_t parts_n, Count(op, shape.slices, static_cast<int64_t>(per_slice)));
  if (rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan(op, "parts", parts, parts_n));
  RETURN_IF_ERROR(CheckSpan(op, "targets", targets, rows));
  RETURN_IF_ERROR(CheckSpan(op, "losses", losses, rows));
  RETURN_IF_ERROR(CheckSpan(op, "lse", lse, rows));
  return CrossEntropyCombineImpl(shape, parts.data(), targets.data(), losses.data(), lse.data());
}

absl::Status Backend::AdamWUpdate(const AdamWStep& step, DeviceSpan<float> params,
                                  DeviceSpan<const float> grads, DeviceSpan<float> m,
                                  DeviceSpan<float> v) {
  constexpr absl::string_view op = "AdamWUpdate";
  if (step.step < 1) return Invalid(op, absl::StrCat("step counts from 1, got ", step.step));
  if (!(step.beta1 >= 0.0f && step.beta1 < 1.0f) || !(step.beta2 >= 0.0f && step.beta2 < 1.0f)) {
    return Invalid(op, "beta1 and beta2 must be in [0, 1)");
  }
  if (!(step.eps > 0.0f)) return Invalid(op, "eps must be positive");
  const size_t n = params.size();
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan(op, "params", params, n));
  RETURN_IF_ERROR(CheckSpan(op, "grads", grads, n));
  RETURN_IF_ERROR(CheckSpan(op, "m", m, n));
  RETURN_IF_ERROR(CheckSpan(op, "v", v, n));
  return AdamWUpdateImpl(step, params.data(), grads.data(), m.data(), v.data(), n);
}

absl::Status Backend::SgdMomentumUpdate(const SgdStep& step, DeviceSpan<float> params,
                                        DeviceSpan<const float> grads,
                                        DeviceSpan<float> momentum) {
  constexpr absl::string_view op = "SgdMomentumUpdate";
  if (!(step.momentum >= 0.0f)) return Invalid(op, "momentum must be >= 0");
  const size_t n = params.size();
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan(op, "params", params, n));
  RETURN_IF_ERROR(CheckSpan(op, "grads", grads, n));
  RETURN_IF_ERROR(CheckSpan(op, "momentum", momentum, n));
  return SgdMomentumUpdateImpl(step, params.data(), grads.data(), momentum.data(), n);
}

absl::StatusOr<double> Backend::SumOfSquares(DeviceSpan<const float> x) {
  if (x.empty()) {
    RETURN_IF_ERROR(Synchronize());
    return 0.0;
  }
  RETURN_IF_ERROR(CheckSpan("SumOfSquares", "x", x, x.size()));
  return SumOfSquaresImpl(x.data(), x.size());
}

absl::StatusOr<std::vector<double>> Backend::SumsOfSquares(
    absl::Span<const DeviceSpan<const float>> xs) {
  for (const DeviceSpan<const float>& x : xs) {
    if (!x.empty()) RETURN_IF_ERROR(CheckSpan("SumsOfSquares", "x", x, x.size()));
  }
  return SumsOfSquaresImpl(xs);
}

absl::StatusOr<std::vector<double>> Backend::SumsOfSquaresImpl(
    absl::Span<const DeviceSpan<const float>> xs) {
  std::vector<double> sums;
  sums.reserve(xs.size());
  for (const DeviceSpan<const float>& x : xs) {
    if (x.empty()) {
      sums.push_back(0.0);
      continue;
    }
    ASSIGN_OR_RETURN(double sum, SumOfSquaresImpl(x.data(), x.size()));
    sums.push_back(sum);
  }
  RETURN_IF_ERROR(Synchronize());  // errors of the work before, as SumOfSquares reports them
  return sums;
}

absl::Status Backend::ConvertFromF32(DeviceSpan<const float> src, common::DType dtype,
                                     DeviceSpan<uint16_t> dst) {
  RETURN_IF_ERROR(CheckHalfDType("ConvertFromF32", dtype));
  if (src.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan("ConvertFromF32", "src", src, src.size()));
  RETURN_IF_ERROR(CheckSpan("ConvertFromF32", "dst", dst, src.size()));
  return ConvertFromF32Impl(src.data(), dtype, dst.data(), src.size());
}

absl::Status Backend::ConvertToF32(DeviceSpan<const uint16_t> src, common::DType dtype,
                                   DeviceSpan<float> dst) {
  RETURN_IF_ERROR(CheckHalfDType("ConvertToF32", dtype));
  if (src.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckSpan("ConvertToF32", "src", src, src.size()));
  RETURN_IF_ERROR(CheckSpan("ConvertToF32", "dst", dst, src.size()));
  return ConvertToF32Impl(src.data(), dtype, dst.data(), src.size());
}

absl::Status Backend::AttentionForwardKernel(const AttentionShape&, const float*, float*, float*) {
  return absl::UnimplementedError(absl::StrCat(name(), " has no attention kernel of its own"));
}

absl::Status Backend::AttentionBackwardKernel(const AttentionShape&, const float*, const float*, const float*,
                                              const float*, float*) {
  return absl::UnimplementedError(absl::StrCat(name(), " has no attention kernel of its own"));
}

}  // namespace shardline::worker
