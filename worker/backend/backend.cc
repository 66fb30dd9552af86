#include "worker/backend/backend.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::worker {
namespace {

constexpr int64_t kMaxBlasDim = std::numeric_limits<int32_t>::max();

absl::Status Invalid(absl::string_view op, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", message));
}

// `needed` elements must be addressable through `span`.
template <typename T>
absl::Status CheckSpan(absl::string_view op, absl::string_view name, DeviceSpan<T> span,
                       uint64_t needed) {
  if (needed == 0) return absl::OkStatus();
  if (span.data() == nullptr) return Invalid(op, absl::StrCat(name, " is null"));
  if (span.size() < needed) {
    return Invalid(op, absl::StrCat(name, " has ", span.size(), " elements, needs ", needed));
  }
  return absl::OkStatus();
}

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

// Elements one operand of a batched GEMM spans, given the matrix as stored
// ([rows × cols] with row stride ld). Fills in a packed ld when it is 0.
absl::StatusOr<uint64_t> GemmExtent(absl::string_view op, absl::string_view name, int64_t rows,
                                    int64_t cols, int64_t& ld, int64_t batch, int64_t stride) {
  if (ld == 0) ld = cols > 0 ? cols : 1;
  if (ld < cols || ld < 1 || ld > kMaxBlasDim) {
    return Invalid(op, absl::StrCat("leading dimension of ", name, " is ", ld, " for ", cols,
                                        " columns"));
  }
  if (stride < 0) return Invalid(op, absl::StrCat("batch stride of ", name, " is negative"));
  if (rows == 0 || cols == 0) return uint64_t{0};
  const __int128 extent = static_cast<__int128>(batch - 1) * stride +
                          static_cast<__int128>(rows - 1) * ld + cols;
  if (extent > common::kMaxElements) {
    return Invalid(op, absl::StrCat(name, " would span more than 2^48 elements"));
  }
  return static_cast<uint64_t>(extent);
}

// The elements [begin, end) of one operand that a GEMM reads or writes.
struct Extent {
  uintptr_t begin = 0, end = 0;
};

Extent ExtentOf(const void* data, uint64_t elements) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  return {begin, begin + elements * sizeof(float)};
}

bool Overlap(const Extent& x, const Extent& y) {
  return x.begin < x.end && y.begin < y.end && x.begin < y.end && y.begin < x.end;
}

// A GEMM whose arguments passed the checks; empty when C has no elements.
struct CheckedGemm {
  GemmOperands operands;
  Extent a, b, c;
  bool empty() const { return c.begin == c.end; }
};

absl::StatusOr<CheckedGemm> CheckGemm(absl::string_view op, const GemmCall& call) {
  GemmShape s = call.shape;
  for (int64_t dim : {s.m, s.n, s.k}) {
    if (dim < 0 || dim > kMaxBlasDim) {
      return Invalid(op, absl::StrCat("m, n, k must be in [0, 2^31), got ", s.m, ", ", s.n, ", ", s.k));
    }
  }
  if (s.batch < 1 || s.batch > kMaxBlasDim) {
    return Invalid(op, absl::StrCat("batch must be in [1, 2^31), got ", s.batch));
  }
  const int64_t a_rows = s.trans_a ? s.k : s.m, a_cols = s.trans_a ? s.m : s.k;
  const int64_t b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
  ASSIGN_OR_RETURN(uint64_t a_extent, GemmExtent(op, "A", a_rows, a_cols, s.lda, s.batch, s.stride_a));
  ASSIGN_OR_RETURN(uint64_t b_extent, GemmExtent(op, "B", b_rows, b_cols, s.ldb, s.batch, s.stride_b));
  ASSIGN_OR_RETURN(uint64_t c_extent, GemmExtent(op, "C", s.m, s.n, s.ldc, s.batch, s.stride_c));
  if (s.batch > 1 && s.stride_c == 0 && c_extent > 0) {
    return Invalid(op, "batched C must not have stride 0 (entries would overlap)");
  }
  CheckedGemm g;
  g.operands = {s, call.a.data(), call.b.data(), call.c.data()};
  if (c_extent == 0) return g;
  if (s.k > 0) {
    RETURN_IF_ERROR(CheckSpan(op, "A", call.a, a_extent));
    RETURN_IF_ERROR(CheckSpan(op, "B", call.b, b_extent));
    g.a = ExtentOf(call.a.data(), a_extent);
    g.b = ExtentOf(call.b.data(), b_extent);
  }
  RETURN_IF_ERROR(CheckSpan(op, "C", call.c, c_extent));
  g.c = ExtentOf(call.c.data(), c_extent);
  return g;
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

absl::Status Backend::Gemm(const GemmShape& shape, DeviceSpan<const float> a,
                           DeviceSpan<const float> b, DeviceSpan<float> c) {
  ASSIGN_OR_RETURN(CheckedGemm g, CheckGemm("Gemm", GemmCall{shape, a, b, c}));
  return g.empty() ? absl::OkStatus() : GemmImpl(g.operands.shape, g.operands.a, g.operands.b, g.operands.c);
}

absl::Status Backend::GemmPair(const GemmCall& first, const GemmCall& second) {
  ASSIGN_OR_RETURN(CheckedGemm g1, CheckGemm("GemmPair (first)", first));
  ASSIGN_OR_RETURN(CheckedGemm g2, CheckGemm("GemmPair (second)", second));
  if (Overlap(g1.c, g2.c) || Overlap(g1.c, g2.a) || Overlap(g1.c, g2.b) || Overlap(g2.c, g1.a) ||
      Overlap(g2.c, g1.b)) {
    return Invalid("GemmPair", "one GEMM's C overlaps the other's operands");
  }
  if (g1.empty() || g2.empty()) {
    const CheckedGemm& g = g1.empty() ? g2 : g1;
    return g.empty() ? absl::OkStatus() : GemmImpl(g.operands.shape, g.operands.a, g.operands.b, g.operands.c);
  }
  return GemmPairImpl(g1.operands, g2.operands);
}

absl::Status Backend::GemmPairImpl(const GemmOperands& first, const GemmOperands& second) {
  RETURN_IF_ERROR(GemmImpl(first.shape, first.a, first.b, first.c));
  return GemmImpl(second.shape, second.a, second.b, second.c);
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
