// ShardRuntime's checkpoint side: the shard's weights and optimizer state
// to and from host tensors by global name (checkpoints, export, restarts).
#include "worker/runtime/shard_runtime.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::worker::runtime {

namespace {

// `t`'s values for parameter `p` here: as they are when `t` has p's shape,
// p's slice of them when `t` is the whole tensor of a split parameter (a
// checkpoint in the global layout, whatever grid wrote it).
absl::StatusOr<std::vector<float>> ValuesFor(const nn::Parameter& p, const std::string& name,
                                             const common::Tensor& t) {
  if (t.dtype() == common::DType::kF32 && t.shape() == p.shape) {
    const auto v = t.values<float>();
    return std::vector<float>(v.begin(), v.end());
  }
  if (t.dtype() == common::DType::kF32 && !p.slice.whole() && t.shape() == p.global_shape) {
    return nn::TakeSlice(t.values<float>(), p.global_shape, p.slice);
  }
  return absl::InvalidArgumentError(absl::StrCat(name, " is ", t.DebugString(), ", expected f32",
                                                 common::ShapeString(p.global_shape)));
}

}  // namespace

absl::Status ShardRuntime::ImportWeights(const std::map<std::string, common::Tensor>& weights) {
  for (nn::Parameter* p : parameters()) {
    auto it = weights.find(p->name);
    if (it == weights.end()) return absl::NotFoundError(absl::StrCat("no weights for ", p->name));
    ASSIGN_OR_RETURN(const std::vector<float> values, ValuesFor(*p, p->name, it->second));
    RETURN_IF_ERROR(backend_.CopyToDevice(absl::Span<const float>(values), p->v()));
  }
  return absl::OkStatus();
}

absl::Status ShardRuntime::ImportState(const std::map<std::string, common::Tensor>& state,
                                       const std::vector<nn::Optimizer::Share>* owned) {
  RETURN_IF_ERROR(ImportWeights(state));
  const std::vector<nn::Parameter*> params = parameters();
  if (owned != nullptr && owned->size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat(owned->size(), " shares for ", params.size(), " parameters"));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    nn::Parameter* p = params[i];
    for (auto [buffer, prefix] : {std::pair{&p->state1, "optimizer.m."}, {&p->state2, "optimizer.v."}}) {
      if (buffer == &p->state2 && !optimizer_.config().adamw) continue;
      auto it = state.find(prefix + p->name);
      if (it == state.end()) return absl::NotFoundError(absl::StrCat("no ", prefix, p->name));
      ASSIGN_OR_RETURN(const std::vector<float> values, ValuesFor(*p, prefix + p->name, it->second));
      const absl::Span<const float> whole(values);
      std::vector<float> kept;
      if (owned == nullptr) {
        kept.assign(whole.begin(), whole.end());
      } else {
        for (const nn::Optimizer::Range& r : (*owned)[i]) {
          if (r.begin > r.end || r.end > whole.size()) return absl::InvalidArgumentError("a share out of range");
          kept.insert(kept.end(), whole.begin() + r.begin, whole.begin() + r.end);
        }
      }
      *buffer = DeviceBuffer();
      if (kept.empty()) continue;  // a ZeRO-1 share with no element of it
      ASSIGN_OR_RETURN(*buffer, backend_.AllocateZeros(kept.size()));
      RETURN_IF_ERROR(backend_.CopyToDevice(absl::Span<const float>(kept), buffer->span<float>()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardRuntime::HostTensors> ShardRuntime::ExportState(HostTensors* reuse) {
  HostTensors none;
  if (reuse == nullptr) reuse = &none;
  ASSIGN_OR_RETURN(HostTensors out, ExportWeights(reuse));
  for (nn::Parameter* p : parameters()) {
    for (auto [buffer, prefix] : {std::pair{&p->state1, "optimizer.m."}, {&p->state2, "optimizer.v."}}) {
      if (buffer->bytes() != p->value.bytes()) continue;  // none yet, or a ZeRO-1 share
      ASSIGN_OR_RETURN(common::Tensor t, TakeHostTensor(*reuse, prefix + p->name, p->shape));
      RETURN_IF_ERROR(backend_.CopyToHost(DeviceSpan<const float>(buffer->span<float>()),
                                          t.values<float>()));
      out.emplace(prefix + p->name, std::move(t));
    }
  }
  return out;
}

absl::StatusOr<ShardRuntime::HostTensors> ShardRuntime::ExportWeights(HostTensors* reuse) {
  HostTensors none;
  HostTensors out;
  for (nn::Parameter* p : parameters()) {
    ASSIGN_OR_RETURN(common::Tensor t, TakeHostTensor(reuse != nullptr ? *reuse : none, p->name, p->shape));
    RETURN_IF_ERROR(backend_.CopyToHost(DeviceSpan<const float>(p->v()), t.values<float>()));
    out.emplace(p->name, std::move(t));
  }
  return out;
}

std::map<std::string, std::vector<int64_t>> ShardRuntime::StateLayout() {
  std::map<std::string, std::vector<int64_t>> layout;
  for (nn::Parameter* p : parameters()) {
    layout[p->name] = p->shape;
    layout["optimizer.m." + p->name] = p->shape;  // AdamW's m, or SGD's momentum
    if (optimizer_.config().adamw) layout["optimizer.v." + p->name] = p->shape;
  }
  return layout;
}

absl::StatusOr<common::Tensor> TakeHostTensor(ShardRuntime::HostTensors& reuse, const std::string& name,
                                              const std::vector<int64_t>& shape) {
  auto it = reuse.find(name);
  if (it != reuse.end() && it->second.dtype() == common::DType::kF32 && it->second.shape() == shape) {
    common::Tensor t = std::move(it->second);
    reuse.erase(it);
    return t;
  }
  return common::Tensor::Zeros(common::DType::kF32, shape);
}

}  // namespace shardline::worker::runtime
