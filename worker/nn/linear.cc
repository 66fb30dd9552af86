#include "worker/nn/linear.h"

#include "common/status_macros.h"

namespace shardline::worker::nn {

absl::StatusOr<Linear> Linear::Create(Backend& backend, uint64_t seed, const std::string& prefix,
                                      int64_t in, int64_t out, bool bias, float std, const LinearSplit& split) {
  using Kind = LinearSplit::Kind;
  Linear linear;
  // The weight [out × in]: a column-parallel part holds rows, a row-parallel one columns.
  Slice weight_slice, bias_slice;
  if (split.kind == Kind::kColumns) weight_slice = bias_slice = Slice{0, split.blocks, split.rank, split.ranks};
  if (split.kind == Kind::kRows) weight_slice = Slice{1, split.blocks, split.rank, split.ranks};
  ASSIGN_OR_RETURN(linear.weight_, CreateParameter(backend, seed, prefix + ".weight", {out, in},
                                                   InitKind::kNormal, std, /*decay=*/true, weight_slice));
  linear.out_ = linear.weight_.shape[0];
  linear.in_ = linear.weight_.shape[1];
  linear.row_parallel_ = split.kind == Kind::kRows;
  linear.has_bias_ = bias;
  if (bias) {
    ASSIGN_OR_RETURN(linear.bias_, CreateParameter(backend, seed, prefix + ".bias", {out},
                                                   InitKind::kZeros, 0.0f, /*decay=*/false, bias_slice));
  }
  return linear;
}

absl::Status Linear::AddBias(Backend& backend, DeviceSpan<float> y, int64_t rows) {
  return has_bias_ ? backend.BiasAdd(y, bias_.v(), rows, out_) : absl::OkStatus();
}

absl::Status Linear::Forward(Backend& backend, DeviceSpan<const float> x, int64_t rows,
                             DeviceSpan<float> y) {
  GemmShape g;  // [rows × in] · [in × out]
  g.trans_b = true;
  g.m = rows;
  g.n = out_;
  g.k = in_;
  RETURN_IF_ERROR(backend.Gemm(g, x, weight_.v(), y));
  if (has_bias_ && !row_parallel_) RETURN_IF_ERROR(backend.BiasAdd(y, bias_.v(), rows, out_));
  return absl::OkStatus();
}

GemmCall Linear::InputGradient(DeviceSpan<const float> dy, int64_t rows, DeviceSpan<float> dx) const {
  GemmCall dxs{{}, dy, weight_.v(), dx};  // [rows × out] · [out × in]
  dxs.shape.m = rows;
  dxs.shape.n = in_;
  dxs.shape.k = out_;
  return dxs;
}

GemmCall Linear::WeightGradient(DeviceSpan<const float> x, DeviceSpan<const float> dy, int64_t rows) const {
  GemmCall dw{{}, dy, x, weight_.g()};  // [out × rows] · [rows × in], accumulated
  dw.shape.trans_a = true;
  dw.shape.m = out_;
  dw.shape.n = in_;
  dw.shape.k = rows;
  dw.shape.beta = 1.0f;
  return dw;
}

absl::Status Linear::Backward(Backend& backend, DeviceSpan<const float> x,
                              DeviceSpan<const float> dy, int64_t rows, DeviceSpan<float> dx) {
  if (dx.empty()) return BackwardWeights(backend, x, dy, rows);
  // The two gradients are independent: the backend may run them at once.
  RETURN_IF_ERROR(backend.GemmPair(WeightGradient(x, dy, rows), InputGradient(dy, rows, dx)));
  return has_bias_ ? backend.SumRows(dy, bias_.g(), rows, out_) : absl::OkStatus();
}

absl::Status Linear::BackwardInput(Backend& backend, DeviceSpan<const float> dy, int64_t rows,
                                   DeviceSpan<float> dx) {
  const GemmCall dxs = InputGradient(dy, rows, dx);
  return backend.Gemm(dxs.shape, dxs.a, dxs.b, dxs.c);
}

absl::Status Linear::BackwardWeights(Backend& backend, DeviceSpan<const float> x, DeviceSpan<const float> dy,
                                     int64_t rows) {
  const GemmCall dw = WeightGradient(x, dy, rows);
  RETURN_IF_ERROR(backend.Gemm(dw.shape, dw.a, dw.b, dw.c));
  return has_bias_ ? backend.SumRows(dy, bias_.g(), rows, out_) : absl::OkStatus();
}

void Linear::AppendParameters(std::vector<Parameter*>& out) {
  out.push_back(&weight_);
  if (has_bias_) out.push_back(&bias_);
}

}  // namespace shardline::worker::nn
