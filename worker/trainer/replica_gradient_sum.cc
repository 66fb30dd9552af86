#include "worker/trainer/replica_gradient_sum.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::worker::trainer {

absl::Status ReplicaGradientSum::Add(Backend& backend, const std::vector<DeviceSpan<float>>& gradients,
                                     int rank) {
  if (sums_.empty()) {
    for (const DeviceSpan<float>& g : gradients) {
      ASSIGN_OR_RETURN(DeviceBuffer sum, backend.Allocate(g.size() * sizeof(float)));
      sums_.push_back(std::move(sum));
    }
  }
  if (sums_.size() != gradients.size()) {
    return absl::InternalError(absl::StrCat(gradients.size(), " gradients for ", sums_.size(), " sums"));
  }
  for (size_t i = 0; i < gradients.size(); ++i) {
    const DeviceSpan<float> sum = sums_[i].span<float>();
    const DeviceSpan<const float> g(gradients[i]);
    RETURN_IF_ERROR(rank == 0 ? backend.CopyOnDevice(g, sum) : backend.Add(DeviceSpan<const float>(sum), g, sum));
  }
  return absl::OkStatus();
}

absl::Status ReplicaGradientSum::Restore(Backend& backend, const std::vector<DeviceSpan<float>>& gradients) {
  if (sums_.size() != gradients.size()) {
    return absl::InternalError(absl::StrCat(gradients.size(), " gradients for ", sums_.size(), " sums"));
  }
  for (size_t i = 0; i < gradients.size(); ++i) {
    RETURN_IF_ERROR(backend.CopyOnDevice(DeviceSpan<const float>(sums_[i].span<float>()), gradients[i]));
  }
  return absl::OkStatus();
}

}  // namespace shardline::worker::trainer
