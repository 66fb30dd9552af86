#include "worker/nn/parameter.h"

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

absl::StatusOr<Parameter> CreateParameter(Backend& backend, uint64_t seed, std::string name,
                                          std::vector<int64_t> shape, InitKind kind, float std,
                                          bool decay) {
  ASSIGN_OR_RETURN(int64_t count, common::NumElements(shape));
  Parameter p;
  const std::vector<float> initial = InitialValues(seed, name, count, kind, std);
  ASSIGN_OR_RETURN(p.value, backend.Allocate(static_cast<size_t>(count) * sizeof(float)));
  RETURN_IF_ERROR(backend.CopyToDevice(absl::Span<const float>(initial), p.value.span<float>()));
  ASSIGN_OR_RETURN(p.grad, backend.AllocateZeros(static_cast<size_t>(count)));
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.decay = decay;
  return p;
}

}  // namespace shardline::worker::nn
