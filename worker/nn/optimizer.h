// Optimizer applies one update to a set of parameters: AdamW (decoupled
// weight decay) or SGD with momentum, with a linear warm-up and cosine decay
// of the learning rate, and an optional factor on the gradients (global
// grad-norm clipping). Weight decay only touches parameters marked `decay`
// (matrices and embeddings), never norms or biases. Optimizer state lives in
// each Parameter (state1, state2), allocated on the first step. Not
// thread-safe.
#ifndef SHARDLINE_WORKER_NN_OPTIMIZER_H_
#define SHARDLINE_WORKER_NN_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "shardline/v1/job.pb.h"
#include "worker/backend/backend.h"
#include "worker/nn/parameter.h"

namespace shardline::worker::nn {

struct OptimizerConfig {
  bool adamw = true;
  double lr = 1e-3;
  double weight_decay = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double momentum = 0.9;
  double grad_clip = 0.0;  // 0 = off

  // From a validated spec (defaults already filled in).
  static OptimizerConfig FromSpec(const shardline::v1::TrainSpec& train);
};

// Learning rate at `step` (1-based): lr·step/warmup during warm-up, then a
// cosine from lr down to lr·min_lr_ratio at total_steps.
double LearningRate(const OptimizerConfig& config, int64_t step);

// The factor the gradients are multiplied by for clipping: min(1, clip/norm),
// or 1 when clipping is off or the norm is 0.
double ClipFactor(const OptimizerConfig& config, double grad_norm);

class Optimizer {
 public:
  Optimizer(Backend& backend, OptimizerConfig config) : backend_(backend), config_(config) {}
  const OptimizerConfig& config() const { return config_; }

  // Scales the gradients by grad_factor (when ≠ 1) and updates every
  // parameter for `step` (1-based).
  absl::Status Step(const std::vector<Parameter*>& params, int64_t step, double grad_factor);
  // The same on some runs of elements of each parameter only (`shares[i]`
  // for params[i], ascending, not overlapping), keeping state for those
  // alone, the runs end to end: a ZeRO-1 replica's share. Element-wise, so
  // each element gets the bits Step gives it. A parameter's share stays the
  // same from step to step.
  struct Range {
    size_t begin = 0, end = 0;
  };
  using Share = std::vector<Range>;
  absl::Status StepShares(const std::vector<Parameter*>& params, const std::vector<Share>& shares, int64_t step,
                          double grad_factor);

 private:
  Backend& backend_;
  const OptimizerConfig config_;
};

}  // namespace shardline::worker::nn

#endif  // SHARDLINE_WORKER_NN_OPTIMIZER_H_
