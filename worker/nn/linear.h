// Linear is the affine map y = x·Wᵀ + b of a GPT layer (W is [out × in], as
// torch.nn.Linear stores it), over rows of activations. Owns its parameters
// `<prefix>.weight` and `<prefix>.bias`. Not thread-safe.
#ifndef SHARDLINE_WORKER_NN_LINEAR_H_
#define SHARDLINE_WORKER_NN_LINEAR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/nn/parameter.h"

namespace shardline::worker::nn {

class Linear {
 public:
  // Weight ~ N(0, std²) from (seed, name); bias zero when present.
  static absl::StatusOr<Linear> Create(Backend& backend, uint64_t seed, const std::string& prefix,
                                       int64_t in, int64_t out, bool bias, float std);

  absl::Status Forward(Backend& backend, DeviceSpan<const float> x, int64_t rows,
                       DeviceSpan<float> y);
  // dW += dyᵀ·x, db += Σ_rows dy, and dx = dy·W unless dx is empty.
  absl::Status Backward(Backend& backend, DeviceSpan<const float> x, DeviceSpan<const float> dy,
                        int64_t rows, DeviceSpan<float> dx);

  void AppendParameters(std::vector<Parameter*>& out);
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }

 private:
  int64_t in_ = 0;
  int64_t out_ = 0;
  Parameter weight_;
  Parameter bias_;
  bool has_bias_ = false;
};

}  // namespace shardline::worker::nn

#endif  // SHARDLINE_WORKER_NN_LINEAR_H_
