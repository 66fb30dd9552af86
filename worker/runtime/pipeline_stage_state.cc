// PipelineStage's state for checkpoints and restarts: the shard's weights
// and optimizer state out (gathered from a ZeRO-1 group's shares and a
// tensor-parallel group's slices into the global layout) and back in.
#include <algorithm>

#include "common/status_macros.h"
#include "worker/nn/parameter.h"
#include "worker/runtime/pipeline_stage.h"

namespace shardline::worker::runtime {

absl::StatusOr<ShardRuntime::HostTensors> PipelineStage::ExportState(ShardRuntime::HostTensors reuse) {
  ASSIGN_OR_RETURN(ShardRuntime::HostTensors out, ExportLocalState(reuse));
  if (tensor_group_ == nullptr) return out;
  // Split parameters (and their optimizer state) put together from the
  // ranks' slices: the stage's shard in the global layout, on every rank.
  for (nn::Parameter* p : runtime_.parameters()) {
    if (p->slice.whole()) continue;
    for (const std::string& name : {p->name, "optimizer.m." + p->name, "optimizer.v." + p->name}) {
      auto it = out.find(name);
      if (it == out.end()) continue;
      const size_t local = p->count(), t = static_cast<size_t>(tensor_group_->size());
      std::vector<float> gathered(t * local, 0.0f);
      const auto mine = it->second.values<float>();
      std::copy(mine.begin(), mine.end(), gathered.begin() + static_cast<ptrdiff_t>(local * options_.tensor_rank));
      RETURN_IF_ERROR(tensor_group_->AllGatherHost(absl::MakeSpan(gathered)));
      ASSIGN_OR_RETURN(common::Tensor global, TakeHostTensor(reuse, name, p->global_shape));
      for (size_t r = 0; r < t; ++r) {
        nn::PutSlice(absl::Span<const float>(gathered).subspan(r * local, local), p->global_shape,
                     p->slice.Of(static_cast<int>(r)), global.values<float>());
      }
      it->second = std::move(global);
    }
  }
  return out;
}

absl::StatusOr<ShardRuntime::HostTensors> PipelineStage::ExportLocalState(ShardRuntime::HostTensors& reuse) {
  if (!sharded()) return runtime_.ExportState(&reuse);
  ASSIGN_OR_RETURN(auto out, runtime_.ExportWeights(&reuse));
  const std::vector<nn::Parameter*> params = runtime_.parameters();
  for (auto [member, prefix] : {std::pair{&nn::Parameter::state1, "optimizer.m."},
                                std::pair{&nn::Parameter::state2, "optimizer.v."}}) {
    // Known alike on every replica (one may own no element of the shard).
    const bool kept = stepped_ && (member == &nn::Parameter::state1 || runtime_.optimizer_config().adamw);
    if (!kept) continue;
    std::vector<DeviceSpan<const float>> shares;
    for (nn::Parameter* p : params) shares.push_back(DeviceSpan<const float>((p->*member).span<float>()));
    ASSIGN_OR_RETURN(std::vector<std::vector<float>> whole, buckets_->GatherState(shares));
    for (size_t i = 0; i < params.size(); ++i) {
      ASSIGN_OR_RETURN(common::Tensor t, TakeHostTensor(reuse, prefix + params[i]->name, params[i]->shape));
      std::copy(whole[i].begin(), whole[i].end(), t.values<float>().begin());
      out.emplace(prefix + params[i]->name, std::move(t));
    }
  }
  return out;
}

absl::Status PipelineStage::ImportState(const std::map<std::string, common::Tensor>& state) {
  RETURN_IF_ERROR(runtime_.ImportState(state, sharded() ? &buckets_->owned() : nullptr));
  stepped_ = true;
  return absl::OkStatus();
}

}  // namespace shardline::worker::runtime
