#include "worker/trainer/trainer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/job_spec.h"
#include "common/status_macros.h"
#include "worker/nn/model_config.h"
#include "worker/nn/optimizer.h"

namespace shardline::worker::trainer {
namespace {

constexpr int kEvalSlot = 0;

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const shardline::v1::JobSpec& spec, Backend& backend) {
  std::unique_ptr<Trainer> trainer(new Trainer(spec));
  ASSIGN_OR_RETURN(trainer->data_, data::CreateDataSource(spec));
  const nn::ModelConfig config = nn::ModelConfig::FromSpec(spec.model());
  ASSIGN_OR_RETURN(trainer->runtime_,
                   runtime::ShardRuntime::Create(backend, config, 0, config.units(), spec.train().seed(),
                                                 nn::OptimizerConfig::FromSpec(spec.train())));
  return trainer;
}

absl::StatusOr<StepResult> Trainer::TrainStep(int64_t step) {
  // d groups of m micro-batches, as d data-parallel replicas run them:
  // global micro-batch r·m + k is replica r's k-th.
  const int replicas = spec_.parallel().data_parallel();
  const int micro_batches = spec_.train().micro_batches();
  const int64_t per_micro = spec_.train().global_batch() / (replicas * micro_batches);
  std::vector<data::Batch> batches;
  int64_t targets = 0;
  for (int g = 0; g < replicas * micro_batches; ++g) {
    ASSIGN_OR_RETURN(data::Batch batch, data_->TrainBatch(step, g, per_micro));
    targets += batch.target_count();
    batches.push_back(std::move(batch));
  }
  if (targets == 0) return absl::InternalError("a training step with no scored tokens");
  const float loss_scale = static_cast<float>(1.0 / static_cast<double>(targets));

  StepResult result;
  result.step = step;
  for (int r = 0; r < replicas; ++r) {
    RETURN_IF_ERROR(runtime_->ZeroGrads());
    double group_loss = 0.0;
    for (int k = 0; k < micro_batches; ++k) {
      const data::Batch& b = batches[r * micro_batches + k];
      runtime::ShardRuntime::Inputs in;
      in.batch = b.batch;
      in.t = b.t;
      in.ids = b.ids;
      in.targets = b.targets;
      in.loss_scale = loss_scale;
      RETURN_IF_ERROR(runtime_->Forward(k, in));
      ASSIGN_OR_RETURN(double loss, runtime_->Loss(k));
      group_loss += loss;
      RETURN_IF_ERROR(runtime_->Backward(k, {}));
      result.tokens += b.batch * b.t;
    }
    // The replicas' losses and gradients are summed in rank order, as the
    // coordinator and the collective layer sum them.
    result.loss += group_loss;
    if (replicas > 1) RETURN_IF_ERROR(replica_sum_.Add(runtime_->backend(), runtime_->Gradients(), r));
  }
  if (replicas > 1) RETURN_IF_ERROR(replica_sum_.Restore(runtime_->backend(), runtime_->Gradients()));
  ASSIGN_OR_RETURN(double squared, runtime_->GradSquaredNorm());
  result.grad_norm = std::sqrt(squared);
  const nn::OptimizerConfig& optimizer = runtime_->optimizer_config();
  result.lr = nn::LearningRate(optimizer, step);
  RETURN_IF_ERROR(runtime_->ApplyOptimizer(step, nn::ClipFactor(optimizer, result.grad_norm)));
  return result;
}

absl::StatusOr<EvalResult> Trainer::Evaluate() {
  ASSIGN_OR_RETURN(const data::EvalSet set,
                   data_->MakeEvalSet(spec_.train().eval_examples(), common::MicroBatchSequences(spec_)));
  EvalResult result;
  result.exact_match = set.kind == data::EvalSet::Kind::kExactMatch;
  int64_t targets = 0;
  for (const data::Batch& b : set.batches) {
    targets += b.target_count();
    result.examples += b.batch;
  }
  if (targets == 0) return absl::FailedPreconditionError("no validation targets");
  std::vector<int32_t> argmax;
  for (const data::Batch& b : set.batches) {
    runtime::ShardRuntime::Inputs in;
    in.batch = b.batch;
    in.t = b.t;
    in.ids = b.ids;
    in.targets = b.targets;
    in.loss_scale = static_cast<float>(1.0 / static_cast<double>(targets));
    if (result.exact_match) {
      argmax.resize(static_cast<size_t>(b.batch * b.t));
      in.argmax = absl::MakeSpan(argmax);
    }
    absl::Status status = runtime_->Forward(kEvalSlot, in);
    if (status.ok()) {
      absl::StatusOr<double> loss = runtime_->Loss(kEvalSlot);
      if (loss.ok()) result.val_loss += *loss;
      status = loss.status();
    }
    runtime_->Discard(kEvalSlot);
    RETURN_IF_ERROR(status);
    if (result.exact_match) result.matches += data::ExactMatches(b.targets, b.batch, b.t, argmax);
  }
  result.accuracy =
      result.exact_match ? static_cast<double>(result.matches) / static_cast<double>(result.examples) : 0.0;
  result.bits_per_byte =
      spec_.data().kind() == "text_bytes" ? result.val_loss / std::log(2.0) : std::numeric_limits<double>::quiet_NaN();
  return result;
}

}  // namespace shardline::worker::trainer
