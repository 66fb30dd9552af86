// Trainer is the single-process reference trainer: a ShardRuntime holding
// every unit of the model, fed by the job's DataSource, stepping the
// optimizer. It is the run every distributed run is checked against, so each
// step is a pure function of the spec: micro-batches run forward and backward
// in index order and each token's loss is scaled by 1 / (targets in the whole
// step), which makes the loss and gradients independent of how the global
// batch is split into micro-batches. With parallel.data_parallel = d it runs
// the step as d replicas would (d groups of micro_batches micro-batches,
// their gradients and losses summed in rank order: ReplicaGradientSum), so a
// data-parallel run of the spec gives the same bits. Not thread-safe.
#ifndef SHARDLINE_WORKER_TRAINER_TRAINER_H_
#define SHARDLINE_WORKER_TRAINER_TRAINER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "shardline/v1/job.pb.h"
#include "worker/backend/backend.h"
#include "worker/data/data_source.h"
#include "worker/runtime/shard_runtime.h"
#include "worker/trainer/replica_gradient_sum.h"

namespace shardline::worker::trainer {

struct StepResult {
  int64_t step = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  int64_t tokens = 0;  // tokens processed in the step
};

struct EvalResult {
  bool exact_match = false;  // addition: accuracy (and the answer digits' loss); otherwise val_loss
  double accuracy = 0.0;
  int64_t matches = 0;       // exact match: the examples right
  double val_loss = 0.0;
  double bits_per_byte = 0.0;  // text_bytes; NaN for token ids (their bytes are unknown)
  int64_t examples = 0;
};

class Trainer {
 public:
  // `spec` must be validated (common::ValidateJobSpec). The backend must
  // outlive the trainer.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const shardline::v1::JobSpec& spec,
                                                         Backend& backend);

  // One optimizer step (1-based, in order).
  absl::StatusOr<StepResult> TrainStep(int64_t step);
  // Held-out evaluation with the current weights (data::EvalSet): batches of
  // a micro-batch's sequences, their losses added in order.
  absl::StatusOr<EvalResult> Evaluate();

  const shardline::v1::JobSpec& spec() const { return spec_; }
  runtime::ShardRuntime& runtime() { return *runtime_; }
  const data::DataSource& data() const { return *data_; }

 private:
  Trainer(shardline::v1::JobSpec spec) : spec_(std::move(spec)) {}

  const shardline::v1::JobSpec spec_;
  std::unique_ptr<data::DataSource> data_;
  std::unique_ptr<runtime::ShardRuntime> runtime_;
  ReplicaGradientSum replica_sum_;
};

}  // namespace shardline::worker::trainer

#endif  // SHARDLINE_WORKER_TRAINER_TRAINER_H_
