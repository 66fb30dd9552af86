// ShardRuntime's gradients and optimizer: zeroing and listing the
// gradients, their sums of squares in fixed pieces (the norm every layout
// adds alike, norm_pieces.h), and the optimizer step over the whole shard
// or a ZeRO-1 share of it.
#include <algorithm>
#include <vector>

#include "common/status_macros.h"
#include "worker/runtime/norm_pieces.h"
#include "worker/runtime/shard_runtime.h"

namespace shardline::worker::runtime {

absl::Status ShardRuntime::ZeroGrads() {
  for (nn::Parameter* p : parameters()) RETURN_IF_ERROR(backend_.Fill(p->g(), 0.0f));
  return absl::OkStatus();
}

std::vector<DeviceSpan<float>> ShardRuntime::Gradients() {
  std::vector<DeviceSpan<float>> grads;
  for (nn::Parameter* p : parameters()) grads.push_back(p->g());
  return grads;
}

absl::StatusOr<std::vector<double>> ShardRuntime::GradSumsOfSquares() {
  std::vector<DeviceSpan<const float>> pieces;
  for (nn::Parameter* p : parameters()) {
    const DeviceSpan<const float> g = p->g();
    for (size_t k = 0; k < NormPieceCount(g.size()); ++k) {
      const size_t offset = k * kNormPieceElements;
      pieces.push_back(g.subspan(offset, std::min(kNormPieceElements, g.size() - offset)));
    }
  }
  return backend_.SumsOfSquares(pieces);
}

absl::StatusOr<double> ShardRuntime::GradSquaredNorm() {
  ASSIGN_OR_RETURN(std::vector<double> parts, GradSumsOfSquares());
  double sum = 0.0;
  for (double part : parts) sum += part;
  return sum;
}

absl::Status ShardRuntime::ApplyOptimizer(int64_t step, double grad_factor) {
  return optimizer_.Step(parameters(), step, grad_factor);
}

absl::Status ShardRuntime::ApplyOptimizer(int64_t step, double grad_factor,
                                          const std::vector<nn::Optimizer::Share>& owned) {
  return optimizer_.StepShares(parameters(), owned, step, grad_factor);
}

size_t ShardRuntime::optimizer_state_bytes() {
  size_t bytes = 0;
  for (nn::Parameter* p : parameters()) bytes += p->state1.bytes() + p->state2.bytes();
  return bytes;
}

}  // namespace shardline::worker::runtime
