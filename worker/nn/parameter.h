// A trainable tensor of the model: its stable global name
// ("blocks.3.attn.qkv.weight"), shape, value and gradient on the backend, and
// the optimizer's state for it. With tensor parallelism a rank may hold a
// slice of the global tensor (Slice): `shape` is the slice's, and
// `global_shape` the tensor's. Owned by the layer that uses it; the
// optimizer and the runtime hold plain pointers. Not thread-safe.
#ifndef SHARDLINE_WORKER_NN_PARAMETER_H_
#define SHARDLINE_WORKER_NN_PARAMETER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/nn/tensor_parallel.h"

namespace shardline::worker::nn {

// How a parameter starts (design brief §4: a function of (seed, name) only).
enum class InitKind {
  kNormal,  // N(0, std²)
  kZeros,
  kOnes,
};

// The part of a global tensor a tensor-parallel rank holds: along its
// dimension `dim` (0: rows; 1: columns of a matrix), each of `blocks` is
// cut into `ranks` equal parts and rank `rank` holds part `rank` of each,
// side by side in the local tensor (qkv's q, k and v blocks by heads; one
// block for the others). Unsplit: the whole tensor.
struct Slice {
  int dim = 0;
  Ranges blocks;
  int rank = 0;
  int ranks = 1;
  bool whole() const { return ranks <= 1 || blocks.empty(); }
  // The ranges rank `r` holds.
  Ranges RangesOf(int r) const {
    Ranges out;
    for (const auto& [a, b] : blocks) out.emplace_back(a + r * (b - a) / ranks, a + (r + 1) * (b - a) / ranks);
    return out;
  }
  Ranges ranges() const { return RangesOf(rank); }
  // The same split as rank `r` holds it.
  Slice Of(int r) const {
    Slice s = *this;
    s.rank = r;
    return s;
  }
};

// The slice's shape; the elements of `global` (a tensor of `global_shape`)
// it holds, in local order; and the way back (`local` into `global`).
std::vector<int64_t> SliceShape(const std::vector<int64_t>& global_shape, const Slice& slice);
std::vector<float> TakeSlice(absl::Span<const float> global, const std::vector<int64_t>& global_shape,
                             const Slice& slice);
void PutSlice(absl::Span<const float> local, const std::vector<int64_t>& global_shape, const Slice& slice,
              absl::Span<float> global);

struct Parameter {
  std::string name;
  std::vector<int64_t> shape;         // of the value held here
  std::vector<int64_t> global_shape;  // of the tensor `name` (== shape unless sliced)
  Slice slice;
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

// Allocates value (initialised) and gradient (zeroed) on `backend`: the
// `slice` of the tensor `name` of `shape`, initialised as that tensor is
// (the same values whatever the split).
absl::StatusOr<Parameter> CreateParameter(Backend& backend, uint64_t seed, std::string name,
                                          std::vector<int64_t> shape, InitKind kind, float std,
                                          bool decay, const Slice& slice = {});

}  // namespace shardline::worker::nn

#endif  // SHARDLINE_WORKER_NN_PARAMETER_H_
