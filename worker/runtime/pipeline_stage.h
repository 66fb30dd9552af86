// PipelineStage runs one stage's part of synchronous pipeline-parallel
// training steps: its schedule of forward and backward passes over the step's
// micro-batches, exchanging activations (with the targets the last stage
// needs) and gradients with its neighbours through a StageLink, then the
// all-stage reduction of the squared gradient norm, clipping and the local
// optimizer step. Stage 0 owns the data source; the last stage computes the
// loss. With the same spec, every stage's arithmetic is the reference
// trainer's, micro-batch by micro-batch, so the losses and weights match it.
//
// The stage never waits for its device to copy a tensor: outputs go to the
// host asynchronously and a StageSender sends each once it is written, and
// received tensors are kept until their copy to the device is done, so on a
// GPU the next micro-batch's work is queued while the last one's output is
// in transit. Not thread-safe: one thread per stage.
#ifndef SHARDLINE_WORKER_RUNTIME_PIPELINE_STAGE_H_
#define SHARDLINE_WORKER_RUNTIME_PIPELINE_STAGE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "shardline/v1/job.pb.h"
#include "worker/collective/collective.h"
#include "worker/data/data_source.h"
#include "worker/runtime/gradient_buckets.h"
#include "worker/runtime/pipeline_schedule.h"
#include "worker/runtime/shard_runtime.h"
#include "worker/runtime/stage_activity.h"
#include "worker/runtime/stage_sender.h"
#include "worker/runtime/step_trace.h"
#include "worker/transport/stage_link.h"

namespace shardline::worker::runtime {

struct PipelineStageOptions {
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  int stages = 1;
  int stage = 0;
  int micro_batches = 1;
  int64_t global_batch = 1;
  // Precision of the activations and gradients sent (parallel.wire_dtype):
  // converted on the stage's device before the copy to the host.
  common::DType wire = common::DType::kF32;
  // This pipeline's place among the data-parallel replicas: replica r's
  // stage 0 trains on global micro-batches r·m … r·m + m − 1 of
  // global_batch / (replicas · m) sequences each.
  int replica = 0;
  int replicas = 1;
  // The replicas sum their gradients in buckets of at most this many bytes
  // (parallel.bucket_mib).
  size_t bucket_bytes = size_t{25} << 20;
  // ZeRO-1 (parallel.shard_optimizer): each replica updates, and keeps
  // optimizer state for, its share of the parameters only; the replicas
  // then gather each other's shares of the new weights.
  bool shard_optimizer = false;
  // Tensor parallelism: this position's rank in its stage's tensor-parallel
  // group of tensor_size (the runtime was built with the same split).
  int tensor_rank = 0;
  int tensor_size = 1;
  // Tensor parallelism across hosts (Assignment.gather_from_previous,
  // scatter_to_next): the edge with that neighbour carries each rank's part
  // of every tensor (ShardRuntime::SplitEdges); both ends must agree.
  bool split_previous = false;
  bool split_next = false;
  // The replicas sum their gradients over 8-bit blocks with error feedback
  // (parallel.wire_dtype "int8", or "auto" where the plan finds the
  // all-reduce slow): lossy, outside the determinism contract.
  bool int8_reduce = false;
  // Where the stage says what it is doing (the hang explainer); optional.
  StageActivity* activity = nullptr;
  // A grid shrunk to fewer replicas than its spec's: each replica runs
  // `groups` of the spec's replicas, its micro_batches (the spec's m ·
  // groups) in that many consecutive groups, each group's gradients summed
  // apart and added as a part of its own in the data-parallel sum
  // (GradientBuckets), so the bits are the spec's. With one replica the
  // group is a group of one.
  int groups = 1;
  // Validation windows a validation pass takes (train.eval_examples).
  int eval_examples = 1000;
  // The validation pass scores exact match (data::EvalSet::Kind::
  // kExactMatch: addition) as well as the loss (ShardRuntime::Inputs::argmax
  // on the last stage).
  bool eval_exact_match = false;
};

struct StageStepResult {
  int64_t step = 0;
  double loss = 0.0;        // this replica's part of the step's loss; only the last stage knows it (0 elsewhere)
  // With groups: each group's part of it, in order (`loss` is their sum).
  std::vector<double> group_losses;
  double grad_norm = 0.0;   // global, over every stage
  double lr = 0.0;
  size_t peak_slots = 0;    // most micro-batches of activations held at once
  double busy_seconds = 0;  // device time of the forward/backward passes (WorkTimer)
  double step_seconds = 0;  // wall time of the whole step on this stage
  int64_t tokens = 0;       // tokens of the step
  uint64_t received_bytes = 0;  // link payload bytes received during the step
  int64_t minor_faults = 0;     // minor page faults of the whole process during the step
  uint64_t link_peak_bytes = 0;  // most tensor bytes the links held at once, so far
  // With replicas: seconds the gradient reduction ran, and the part of them
  // the backward pass did not hide (GradientBuckets).
  double reduce_seconds = 0;
  double reduce_exposed_seconds = 0;
  // The optimizer state this replica holds after the step (bytes; with
  // shard_optimizer, its share).
  size_t optimizer_state_bytes = 0;
  // What the stage's thread did, span by span (StepTrace).
  std::vector<shardline::v1::TraceEvent> trace;
};

// A validation pass's result (PipelineStage::Evaluate).
struct StageEvalResult {
  // Only the last stage knows them (0 / empty elsewhere): the loss of each
  // batch of the replica's share (common::EvalShare), in order, and their sum.
  std::vector<double> losses;
  double loss = 0.0;
  int64_t windows = 0;  // validation sequences the pass ran
  int64_t matches = 0;  // with eval_exact_match, the last stage: those exactly right (data::ExactMatches)
};

// The most bytes one stage-link tensor of `spec`'s jobs holds (a
// micro-batch's activations or gradients, f32 in host memory): the size of
// the links' staging slots.
size_t LargestLinkTensorBytes(const shardline::v1::JobSpec& spec);
// The tokens of one micro-batch of `spec` (its sequences × the context):
// the most targets an activation carries.
int64_t MicroBatchTokens(const shardline::v1::JobSpec& spec);

class PipelineStage {
 public:
  // `data` is required on stage 0 and ignored elsewhere. With replicas > 1,
  // `replica_group` is this stage's data-parallel group (rank = replica):
  // the gradients are summed over it in buckets, each as soon as the step's
  // last backward pass has finished its layers (GradientBuckets). With
  // tensor_size > 1, `tensor_group` is the group the runtime's layers are
  // split over (rank = tensor_rank): the stage's part of the grad norm is
  // its ranks' parts (a replicated parameter counted once) added in rank
  // order; each rank exchanges the whole activations with the same rank of
  // its neighbours. Nothing is owned; everything must outlive the stage.
  static absl::StatusOr<std::unique_ptr<PipelineStage>> Create(ShardRuntime& runtime,
                                                               const data::DataSource* data,
                                                               transport::StageLink& link,
                                                               PipelineStageOptions options,
                                                               collective::Collective* replica_group = nullptr,
                                                               collective::Collective* tensor_group = nullptr);

  // After a failed step, closes the link (the stage is done with it): a
  // send still blocked on a neighbour that stopped reading returns at once
  // instead of holding the teardown for the link's timeout.
  ~PipelineStage();

  // Runs step `step` (1-based). On error the step's slots are freed, the
  // replica group is closed (the twin replicas fail too, instead of waiting
  // for this one), and the weights may be part-updated only if the error
  // came after the flush.
  absl::StatusOr<StageStepResult> RunStep(int64_t step);

  // The validation pass after step `step` (train.eval_every): the held-out
  // windows forward through the pipeline in batches of a micro-batch's
  // sequences, no backward pass, each replica its share of the batches
  // (common::EvalShare), stage 0 reading them from its data source and
  // telling the others how many there are (an empty share: one activation
  // of no tokens and no count), the last stage taking each batch's loss
  // and, with eval_exact_match, counting the sequences exactly right, as the
  // trainer does (Trainer::Evaluate): added in batch order over the
  // replicas (common::SumEvalShares), the same bits. Its messages carry
  // step −step.
  absl::StatusOr<StageEvalResult> Evaluate(int64_t step);

  // The shard's weights and whole optimizer state (ShardRuntime::
  // ExportState). With shard_optimizer the state is gathered from every
  // replica's share, so every replica of the stage must call it at the
  // same point (a checkpoint step), and all export the same tensors.
  // Tensors of `reuse` that fit are written over (ShardRuntime::ExportWeights).
  // Split over a tensor-parallel group, the ranks put their slices together
  // (every rank of the stage calls it at the same point): the shard is in
  // the global layout, the same on every rank and in every grid.
  absl::StatusOr<ShardRuntime::HostTensors> ExportState(ShardRuntime::HostTensors reuse = {});
  // Weights alone (a job's starting weights, Assignment.initial_weights):
  // the optimizer state stays as it starts.
  absl::Status ImportWeights(const std::map<std::string, common::Tensor>& weights) {
    return runtime_.ImportWeights(weights);
  }
  // Before the first RunStep of a restart: the weights and whole optimizer
  // state ExportState wrote at the committed step, in the global layout of
  // any grid (a split rank takes its slices; this replica keeps its share
  // of the state when sharded).
  absl::Status ImportState(const std::map<std::string, common::Tensor>& state);

 private:
  PipelineStage(ShardRuntime& runtime, const data::DataSource* data, transport::StageLink& link,
                PipelineStageOptions options, collective::Collective* replica_group,
                collective::Collective* tensor_group, std::vector<PipelineAction> schedule,
                std::unique_ptr<GradientBuckets> buckets)
      : runtime_(runtime), data_(data), link_(link), options_(options), replica_group_(replica_group),
        tensor_group_(tensor_group), schedule_(std::move(schedule)), sender_(link), buckets_(std::move(buckets)) {}
  // This rank's own tensors (a ZeRO-1 state gathered over the replicas).
  absl::StatusOr<ShardRuntime::HostTensors> ExportLocalState(ShardRuntime::HostTensors& reuse);
  // The stage's norm terms over its tensor-parallel group: each rank's own
  // terms added (a replicated parameter's on rank 0 only), one per rank.
  absl::StatusOr<std::vector<double>> TensorGroupNormTerms(const std::vector<double>& own);
  bool sharded() const { return buckets_ != nullptr && buckets_->sharded(); }
  // From now on the stage does `what` (for the hang explainer, in
  // options_.activity if any), a span `name` of `micro_batch` (-1: of the
  // whole step) in the step's trace.
  void Doing(int64_t step, absl::string_view name, int micro_batch, std::string what) {
    trace_.Mark(name, micro_batch);
    if (options_.activity != nullptr) options_.activity->Set(step, std::move(what));
  }
  // A received message whose tensor the device is still reading.
  struct Upload {
    HostTransfer read;
    transport::StageMessage message;
  };
  absl::Status Forward(int64_t step, int k, const std::vector<data::Batch>& batches,
                       float loss_scale, StageStepResult& result);
  // A pass's inputs from stage 0's batch (and what its activations carry
  // on: the targets and loss scale), or from the previous stage's message.
  static void TakeBatch(const data::Batch& b, float loss_scale, ShardRuntime::Inputs& in,
                        transport::StageMessage& carried);
  static void TakeActivation(const transport::StageMessage& m, ShardRuntime::Inputs& in);
  // The activation message of (validation) batch `k` of `step` for the next
  // stage: `in`'s shape, `values`, and what `received` carries on (its
  // targets are moved).
  transport::StageMessage Activation(int64_t step, int k, const ShardRuntime::Inputs& in,
                                     transport::HostBuffer values, transport::StageMessage& received);
  absl::StatusOr<StageStepResult> RunStepImpl(int64_t step);
  absl::StatusOr<StageEvalResult> EvaluateImpl(int64_t step);
  // A validation pass with no batch for this replica: tells the next stage
  // so (an activation of no tokens), if there is one.
  absl::Status PassOnEmptyShare(int64_t id);
  // `last`: the step's last backward pass on this stage, which finishes
  // the gradients. `defer_weights`: its input part only (zero-bubble), the
  // weight part being BackwardWeights.
  absl::Status Backward(int64_t step, int k, bool last, bool defer_weights);
  absl::Status BackwardWeights(int64_t step, int k, bool last);
  // What tells the gradient buckets which gradients are final: on the pass
  // that finishes them (`last`), with replicas; null otherwise.
  ShardRuntime::GradientsFinal GradientsFinal(bool last);
  absl::StatusOr<double> ReduceGradNorm(int64_t step);
  absl::StatusOr<transport::StageMessage> Expect(absl::StatusOr<transport::StageMessage> message,
                                                 transport::StageMessage::Kind kind, int64_t step,
                                                 int micro_batch);
  // Keeps `message` until `read` is done.
  void KeepUntilRead(HostTransfer read, transport::StageMessage message);
  // Drops the kept messages whose copies are done; all of them, waiting,
  // when `wait`. Copies finish in the order they were queued.
  void ReleaseUploads(bool wait);
  // Starts and stops timing one pass's device work.
  absl::Status StartPass();
  absl::Status EndPass();

  ShardRuntime& runtime_;
  const data::DataSource* const data_;
  transport::StageLink& link_;
  const PipelineStageOptions options_;
  collective::Collective* const replica_group_;  // null with one replica
  collective::Collective* const tensor_group_;   // null unsplit
  const std::vector<PipelineAction> schedule_;
  StageSender sender_;
  StepTrace trace_;  // this step's spans
  std::unique_ptr<GradientBuckets> buckets_;  // with replicas or groups
  // With groups: the schedule's index of the action that completes each
  // group's gradients but the last's (Hold, then zeroed).
  std::vector<size_t> group_ends_;
  bool stepped_ = false;                      // the optimizer has run at least once
  std::deque<Upload> uploads_;
  // The step's passes, timed on the device; read at the end of the step.
  std::vector<std::unique_ptr<WorkTimer>> pass_timers_;
  bool last_step_failed_ = false;
  // Stage 0: the validation batches, made at the first pass.
  std::unique_ptr<data::EvalSet> eval_set_;
  std::vector<int32_t> eval_argmax_;  // last stage, exact match: a validation batch's most likely classes
};

}  // namespace shardline::worker::runtime

#endif  // SHARDLINE_WORKER_RUNTIME_PIPELINE_STAGE_H_
