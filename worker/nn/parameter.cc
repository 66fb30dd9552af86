#include "worker/nn/parameter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/rng.h"
#include "common/status_macros.h"

namespace shardline::worker::nn {

std::vector<float> InitialValues(uint64_t seed, const std::string& name, int64_t count,
                                 InitKind kind, float std) {
  std::vector<float> values(static_cast<size_t>(count), kind == InitKind::kOnes ? 1.0f : 0.0f);
  if (kind == InitKind::kNormal) {
    common::Rng rng(common::MixKey(seed, common::HashString(name)));
    for (float& v : values) v = static_cast<float>(rng.Normal() * std);
  }
  return values;
}

std::vector<int64_t> SliceShape(const std::vector<int64_t>& global_shape, const Slice& slice) {
  if (slice.whole()) return global_shape;
  std::vector<int64_t> shape = global_shape;
  int64_t n = 0;
  for (const auto& [begin, end] : slice.ranges()) n += end - begin;
  shape[static_cast<size_t>(slice.dim)] = n;
  return shape;
}

namespace {

// Calls copy(global offset, local offset, count) for each contiguous run of
// the slice, in local order.
template <typename Copy>
void ForEachRun(const std::vector<int64_t>& global_shape, const Slice& slice, const Copy& copy) {
  int64_t inner = 1;  // elements per index of dimension `dim`
  for (size_t d = static_cast<size_t>(slice.dim) + 1; d < global_shape.size(); ++d) inner *= global_shape[d];
  int64_t outer = 1;
  for (size_t d = 0; d < static_cast<size_t>(slice.dim); ++d) outer *= global_shape[d];
  const int64_t extent = global_shape[static_cast<size_t>(slice.dim)];
  int64_t local = 0;
  const Ranges ranges = slice.ranges();
  for (int64_t o = 0; o < outer; ++o) {
    for (const auto& [begin, end] : ranges) {
      const int64_t count = (end - begin) * inner;
      copy((o * extent + begin) * inner, local, count);
      local += count;
    }
  }
}

}  // namespace

std::vector<float> TakeSlice(absl::Span<const float> global, const std::vector<int64_t>& global_shape,
                             const Slice& slice) {
  if (slice.whole()) return std::vector<float>(global.begin(), global.end());
  std::vector<float> local;
  ForEachRun(global_shape, slice, [&](int64_t from, int64_t, int64_t count) {
    local.insert(local.end(), global.begin() + from, global.begin() + from + count);
  });
  return local;
}

void PutSlice(absl::Span<const float> local, const std::vector<int64_t>& global_shape, const Slice& slice,
              absl::Span<float> global) {
  if (slice.whole()) {
    std::copy(local.begin(), local.end(), global.begin());
    return;
  }
  ForEachRun(global_shape, slice, [&](int64_t to, int64_t from, int64_t count) {
    std::copy(local.begin() + from, local.begin() + from + count, global.begin() + to);
  });
}

absl::StatusOr<Parameter> CreateParameter(Backend& backend, uint64_t seed, std::string name,
                                          std::vector<int64_t> shape, InitKind kind, float std,
                                          bool decay, const Slice& slice) {
  ASSIGN_OR_RETURN(int64_t global_count, common::NumElements(shape));
  for (const auto& [begin, end] : slice.whole() ? Ranges() : slice.ranges()) {
    if (slice.dim < 0 || static_cast<size_t>(slice.dim) >= shape.size() || begin < 0 || begin >= end ||
        end > shape[static_cast<size_t>(slice.dim)]) {
      return absl::InvalidArgumentError(absl::StrCat("a slice of ", name, " out of its shape"));
    }
  }
  Parameter p;
  // The global tensor's initial values, then this rank's part of them: the
  // same model whatever the split.
  const std::vector<float> initial =
      TakeSlice(InitialValues(seed, name, global_count, kind, std), shape, slice);
  ASSIGN_OR_RETURN(p.value, backend.Allocate(initial.size() * sizeof(float)));
  RETURN_IF_ERROR(backend.CopyToDevice(absl::Span<const float>(initial), p.value.span<float>()));
  ASSIGN_OR_RETURN(p.grad, backend.AllocateZeros(initial.size()));
  p.name = std::move(name);
  p.shape = SliceShape(shape, slice);
  p.global_shape = std::move(shape);
  p.slice = slice;
  p.decay = decay;
  return p;
}

}  // namespace shardline::worker::nn
