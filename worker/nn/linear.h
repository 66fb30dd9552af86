// Linear is the affine map y = x·Wᵀ + b of a GPT layer (W is [out × in], as
// torch.nn.Linear stores it), over rows of activations. Owns its parameters
// `<prefix>.weight` and `<prefix>.bias`. A tensor-parallel rank may hold a
// part of it (LinearSplit): column-parallel, some output features (W's rows,
// b's elements); row-parallel, some input features (W's columns), giving a
// partial y that the ranks sum, after which the caller adds the (whole)
// bias (AddBias). Not thread-safe.
#ifndef SHARDLINE_WORKER_NN_LINEAR_H_
#define SHARDLINE_WORKER_NN_LINEAR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/nn/parameter.h"
#include "worker/nn/tensor_parallel.h"

namespace shardline::worker::nn {

struct LinearSplit {
  enum class Kind { kWhole, kColumns, kRows };
  Kind kind = Kind::kWhole;
  // kColumns: of the output features; kRows: of the input features; each
  // cut into `ranks` parts, of which this rank holds part `rank` (Slice).
  Ranges blocks;
  int rank = 0;
  int ranks = 1;
};

class Linear {
 public:
  // Weight ~ N(0, std²) from (seed, name); bias zero when present. `in` and
  // `out` are the whole layer's; `split`, the part of it held here.
  static absl::StatusOr<Linear> Create(Backend& backend, uint64_t seed, const std::string& prefix,
                                       int64_t in, int64_t out, bool bias, float std,
                                       const LinearSplit& split = {});

  // y (rows × out()) from x (rows × in()); a row-parallel part adds no bias.
  absl::Status Forward(Backend& backend, DeviceSpan<const float> x, int64_t rows,
                       DeviceSpan<float> y);
  // y += b (a row-parallel layer's, once its parts are summed).
  absl::Status AddBias(Backend& backend, DeviceSpan<float> y, int64_t rows);
  // dW += dyᵀ·x, db += Σ_rows dy, and dx = dy·W unless dx is empty (the two
  // GEMMs as one Backend::GemmPair).
  absl::Status Backward(Backend& backend, DeviceSpan<const float> x, DeviceSpan<const float> dy,
                        int64_t rows, DeviceSpan<float> dx);
  // Backward's two parts, for a caller that runs them apart: dx = dy·W; and
  // dW += dyᵀ·x, db += Σ_rows dy.
  absl::Status BackwardInput(Backend& backend, DeviceSpan<const float> dy, int64_t rows, DeviceSpan<float> dx);
  absl::Status BackwardWeights(Backend& backend, DeviceSpan<const float> x, DeviceSpan<const float> dy,
                               int64_t rows);

  void AppendParameters(std::vector<Parameter*>& out);
  // The features held here.
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }

 private:
  // The GEMMs of dx = dy·W and dW += dyᵀ·x.
  GemmCall InputGradient(DeviceSpan<const float> dy, int64_t rows, DeviceSpan<float> dx) const;
  GemmCall WeightGradient(DeviceSpan<const float> x, DeviceSpan<const float> dy, int64_t rows) const;

  int64_t in_ = 0;
  int64_t out_ = 0;
  bool row_parallel_ = false;
  Parameter weight_;
  Parameter bias_;
  bool has_bias_ = false;
};

}  // namespace shardline::worker::nn

#endif  // SHARDLINE_WORKER_NN_LINEAR_H_
