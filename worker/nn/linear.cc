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

absl::Status Linear::Backward(Backend& backend, DeviceSpan<const float> x,
                              DeviceSpan<const float> dy, int64_t rows, DeviceSpan<float> dx) {
  RETURN_IF_ERROR(BackwardWeights(backend, x, dy, rows));
  return dx.empty() ? absl::OkStatus() : BackwardInput(backend, dy, rows, dx);
}

absl::Status Linear::BackwardInput(Backend& backend, DeviceSpan<const float> dy, int64_t rows,
                                   DeviceSpan<float> dx) {
  GemmShape dxs;  // [rows × out] · [out × in]
  dxs.m = rows;
  dxs.n = in_;
  dxs.k = out_;
  return backend.Gemm(dxs, dy, weight_.v(), dx);
}

absl::Status Linear::BackwardWeights(Backend& backend, DeviceSpan<const float> x, DeviceSpan<const float> dy,
                                     int64_t rows) {
  GemmShape dw;  // [out × rows] · [rows × in], accumulated
  dw.trans_a = true;
  dw.m = out_;
  dw.n = in_;
  dw.k = rows;
  dw.beta = 1.0f;
  RETURN_IF_ERROR(backend.Gemm(dw, dy, x, weight_.g()));
  return has_bias_ ? backend.SumRows(dy, bias_.g(), rows, out_) : absl::OkStatus();
}

void Linear::AppendParameters(std::vector<Parameter*>& out) {
  out.push_back(&weight_);
  if (has_bias_) out.push_back(&bias_);
}

}  // namespace shardline::worker::nn
