// A trainable tensor of the model: its stable global name
// ("blocks.3.attn.qkv.weight"), shape, value and gradient on the backend, and
// the optimizer's state for it. Owned by the layer that uses it; the optimizer
// and the runtime hold plain pointers. Not thread-safe.
#ifndef SHARDLINE_WORKER_NN_PARAMETER_H_
#define SHARDLINE_WORKER_NN_PARAMETER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"

namespace shardline::worker::nn {

// How a parameter starts (design brief §4: a function of (seed, name) only).
enum class InitKind {
  kNormal,  // N(0, std²)
  kZeros,
  kOnes,
};

struct Parameter {
  std::string name;
  std::vector<int64_t> shape;
  bool decay = false;  // weight decay applies (matrices and embeddings, not norms or biases)
  DeviceBuffer value;
  DeviceBuffer grad;
  // Allocated by the optimizer: for every element, or (ZeRO-1) for the
  // replica's share of them only (nn::Optimizer::StepShares).
  DeviceBuffer state1;  // AdamW m / SGD momentum
  DeviceBuffer state2;  // AdamW v

  size_t count() const { return value.bytes() / sizeof(float); }
  DeviceSpan<float> v() const { return value.span<float>(); }
  DeviceSpan<float> g() const { return grad.span<float>(); }
};

// The initial values of parameter `name`: identical for every partition of
// the model, every backend and every run with the same seed.
std::vector<float> InitialValues(uint64_t seed, const std::string& name, int64_t count,
                                 InitKind kind, float std);

// Allocates value (initialised) and gradient (zeroed) on `backend`.
absl::StatusOr<Parameter> CreateParameter(Backend& backend, uint64_t seed, std::string name,
                                          std::vector<int64_t> shape, InitKind kind, float std,
                                          bool decay);

}  // namespace shardline::worker::nn

#endif  // SHARDLINE_WORKER_NN_PARAMETER_H_
