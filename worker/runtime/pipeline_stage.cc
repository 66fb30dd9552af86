#include "worker/runtime/pipeline_stage.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/status_macros.h"

namespace shardline::worker::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using Kind = transport::StageMessage::Kind;

// Minor page faults of this process so far: allocator churn on the receive
// path shows up here (shared/docs/transport-notes.md).
int64_t MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Where each of `groups` consecutive groups of the micro-batches but the
// last has its gradients complete: the index of its last action that adds
// to them (a backward pass, or either part of one). GPipe and 1F1B add them
// in micro-batch order, so no later group's comes before it; zero-bubble
// runs a later micro-batch's input part (which adds the gradients that are
// not deferred) before an earlier one's weight part, so it has no such
// point (INTERNAL: the caller runs 1F1B's order instead).
absl::StatusOr<std::vector<size_t>> GroupEnds(const std::vector<PipelineAction>& schedule, int micro_batches,
                                              int groups) {
  using Type = PipelineAction::Type;
  const int per = micro_batches / groups;
  std::vector<size_t> ends(static_cast<size_t>(groups - 1), 0);
  std::vector<bool> seen(static_cast<size_t>(groups), false);
  for (size_t i = 0; i < schedule.size(); ++i) {
    if (schedule[i].type == Type::kForward) continue;
    const int g = schedule[i].micro_batch / per;
    seen[static_cast<size_t>(g)] = true;
    if (g + 1 < groups) ends[static_cast<size_t>(g)] = i;
    for (int earlier = 0; earlier < g; ++earlier) {
      if (!seen[static_cast<size_t>(earlier)]) {
        return absl::InternalError(absl::StrCat("the schedule adds micro-batch ", schedule[i].micro_batch,
                                                "'s gradients before group ", earlier, "'s"));
      }
    }
    for (int later = g + 1; later < groups; ++later) {
      if (seen[static_cast<size_t>(later)]) {
        return absl::InternalError(absl::StrCat("the schedule adds micro-batch ", schedule[i].micro_batch,
                                                "'s gradients after a later group's"));
      }
    }
  }
  return ends;
}

}  // namespace

int64_t MicroBatchTokens(const shardline::v1::JobSpec& spec) {
  return common::MicroBatchSequences(spec) * spec.model().context();
}

size_t LargestLinkTensorBytes(const shardline::v1::JobSpec& spec) {
  return static_cast<size_t>(std::max<int64_t>(1, MicroBatchTokens(spec) * spec.model().d_model())) * sizeof(float);
}

absl::StatusOr<std::unique_ptr<PipelineStage>> PipelineStage::Create(
    ShardRuntime& runtime, const data::DataSource* data, transport::StageLink& link,
    PipelineStageOptions options, collective::Collective* replica_group, collective::Collective* tensor_group) {
  if (runtime.is_first() != (options.stage == 0) ||
      runtime.is_last() != (options.stage == options.stages - 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", options.stage, " of ", options.stages, " holds units [", runtime.unit_begin(),
        ", ", runtime.unit_end(), "): the first stage must start at the embedding and the last "
        "end with the head"));
  }
  if (runtime.is_first() && data == nullptr) {
    return absl::InvalidArgumentError("the first stage needs the data source");
  }
  if (options.replicas < 1 || options.replica < 0 || options.replica >= options.replicas ||
      options.micro_batches < 1 || options.global_batch % (int64_t{options.replicas} * options.micro_batches) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica ", options.replica, " of ", options.replicas, " with ", options.micro_batches,
        " micro-batches: replicas × micro_batches must divide global_batch (", options.global_batch, ")"));
  }
  if (options.groups < 1 || options.micro_batches % options.groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat(options.micro_batches, " micro-batches do not make ",
                                                   options.groups, " groups of the same size"));
  }
  // The gradients are summed: over replicas, or over a replica's groups.
  const bool summed = options.replicas > 1 || options.groups > 1;
  if (summed &&
      (replica_group == nullptr || replica_group->size() != options.replicas ||
       replica_group->rank() != options.replica)) {
    return absl::InvalidArgumentError(absl::StrCat("replica ", options.replica, " of ", options.replicas,
                                                   " needs its data-parallel group, as rank ", options.replica));
  }
  if (options.tensor_size > 1 &&
      (tensor_group == nullptr || tensor_group->size() != options.tensor_size ||
       tensor_group->rank() != options.tensor_rank)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor rank ", options.tensor_rank, " of ", options.tensor_size,
                                                   " needs its tensor-parallel group, as rank ", options.tensor_rank));
  }
  RETURN_IF_ERROR(runtime.set_edge_dtype(options.wire));
  RETURN_IF_ERROR(runtime.SplitEdges(options.split_previous, options.split_next));
  // Zero-bubble has no point between two groups where one's gradients are
  // complete and the next's not begun (GroupEnds): with groups, every stage
  // runs 1F1B's order, whose bits zero-bubble has.
  const ScheduleKind kind =
      options.groups > 1 && options.schedule == ScheduleKind::kZeroBubble ? ScheduleKind::kOneFOneB : options.schedule;
  ASSIGN_OR_RETURN(std::vector<PipelineAction> schedule,
                   BuildSchedule(kind, options.stages, options.stage, options.micro_batches));
  std::unique_ptr<GradientBuckets> buckets;
  if (summed) {
    GradientBucketsOptions bucket_options;
    bucket_options.bucket_bytes = options.bucket_bytes;
    bucket_options.shard = options.shard_optimizer;
    bucket_options.int8 = options.int8_reduce;
    bucket_options.groups = options.groups;
    ASSIGN_OR_RETURN(buckets,
                     GradientBuckets::Create(runtime.backend(), runtime.Gradients(), *replica_group, bucket_options));
  }
  ASSIGN_OR_RETURN(std::vector<size_t> group_ends, GroupEnds(schedule, options.micro_batches, options.groups));
  std::unique_ptr<PipelineStage> stage(new PipelineStage(runtime, data, link, options,
                                                         summed ? replica_group : nullptr,
                                                         options.tensor_size > 1 ? tensor_group : nullptr,
                                                         std::move(schedule), std::move(buckets)));
  stage->group_ends_ = std::move(group_ends);
  return stage;
}

absl::StatusOr<transport::StageMessage> PipelineStage::Expect(absl::StatusOr<transport::StageMessage> message,
                                                   Kind kind, int64_t step, int micro_batch) {
  transport::StageMessage wanted;
  wanted.kind = kind;
  wanted.step = step;
  wanted.micro_batch = micro_batch;
  if (!message.ok()) {
    const bool from_previous = kind == Kind::kActivation || kind == Kind::kNormPartial;
    return absl::Status(message.status().code(),
                        absl::StrCat("stage ", options_.stage, " waiting for the ", transport::DescribeMessage(wanted),
                                     " from stage ", options_.stage + (from_previous ? -1 : 1), ": ",
                                     message.status().message()));
  }
  if (message->kind != kind || message->step != step || message->micro_batch != micro_batch) {
    return absl::FailedPreconditionError(absl::StrCat("stage ", options_.stage, " expected ",
                                                      transport::DescribeMessage(wanted), ", got ",
                                                      transport::DescribeMessage(*message)));
  }
  const bool tensor = kind == Kind::kActivation || kind == Kind::kGradient;
  if (tensor && message->dtype != options_.wire) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stage ", options_.stage, " got the ", transport::DescribeMessage(*message), " in ",
        common::DTypeName(message->dtype), ", the job's wire precision is ",
        common::DTypeName(options_.wire)));
  }
  return message;
}

void PipelineStage::KeepUntilRead(HostTransfer read, transport::StageMessage message) {
  if (read.done()) return;  // the message is freed here
  uploads_.push_back({std::move(read), std::move(message)});
}

void PipelineStage::ReleaseUploads(bool wait) {
  while (!uploads_.empty() && (wait || uploads_.front().read.done())) {
    // A failed copy is reported by the device's next synchronising call.
    (void)uploads_.front().read.Wait();
    uploads_.pop_front();
  }
}

absl::Status PipelineStage::StartPass() {
  ASSIGN_OR_RETURN(std::unique_ptr<WorkTimer> timer, runtime_.backend().StartTimer());
  pass_timers_.push_back(std::move(timer));
  return absl::OkStatus();
}

absl::Status PipelineStage::EndPass() { return pass_timers_.back()->Stop(); }

absl::Status PipelineStage::Forward(int64_t step, int k, const std::vector<data::Batch>& batches,
                                    float loss_scale, StageStepResult& result) {
  ShardRuntime::Inputs in;
  transport::StageMessage received;
  if (runtime_.is_first()) {
    TakeBatch(batches[k], loss_scale, in, received);
  } else {
    Doing(step, "receive", k, absl::StrCat("waits for ACTIVATION of micro-batch ", k, " from stage ", options_.stage - 1));
    ASSIGN_OR_RETURN(received, Expect(link_.ReceiveFromPrevious(), Kind::kActivation, step, k));
    TakeActivation(received, in);
  }
  if (runtime_.is_last()) in.targets = received.targets;
  result.tokens += in.batch * in.t;

  transport::HostBuffer output;  // written by the forward pass, sent as it is
  if (!runtime_.is_last()) {
    output = link_.OutgoingBuffer(Kind::kActivation, static_cast<size_t>(runtime_.OutputElements(in.batch * in.t)));
  }
  Doing(step, "forward", k, absl::StrCat("forward of micro-batch ", k));
  RETURN_IF_ERROR(StartPass());
  ASSIGN_OR_RETURN(ShardRuntime::EdgeTransfers edge, runtime_.ForwardAsync(k, in, output.span()));
  RETURN_IF_ERROR(EndPass());
  if (runtime_.is_last()) {  // its loss is read at the end of the step
    KeepUntilRead(std::move(edge.inputs_read), std::move(received));
    return absl::OkStatus();
  }
  transport::StageMessage out = Activation(step, k, in, std::move(output), received);
  KeepUntilRead(std::move(edge.inputs_read), std::move(received));
  Doing(step, "send", k, absl::StrCat("sends ACTIVATION of micro-batch ", k, " to stage ", options_.stage + 1));
  return sender_.Send(StageSender::Direction::kNext, std::move(out), std::move(edge.output_written));
}

void PipelineStage::TakeBatch(const data::Batch& b, float loss_scale, ShardRuntime::Inputs& in,
                              transport::StageMessage& carried) {
  in.batch = b.batch;
  in.t = b.t;
  in.ids = b.ids;
  in.loss_scale = loss_scale;
  carried.targets = b.targets;
  carried.loss_scale = loss_scale;
}

void PipelineStage::TakeActivation(const transport::StageMessage& m, ShardRuntime::Inputs& in) {
  in.batch = m.batch;
  in.t = m.t;
  in.activations = m.values;
  in.loss_scale = m.loss_scale;
}

transport::StageMessage PipelineStage::Activation(int64_t step, int k, const ShardRuntime::Inputs& in,
                                                  transport::HostBuffer values, transport::StageMessage& received) {
  transport::StageMessage out;
  out.kind = Kind::kActivation;
  out.step = step;
  out.micro_batch = k;
  out.batch = in.batch;
  out.t = in.t;
  out.values = std::move(values);
  out.dtype = options_.wire;
  out.targets = std::move(received.targets);  // not read by the device: only the last stage's are
  out.loss_scale = received.loss_scale;
  out.eval_batches = received.eval_batches;
  return out;
}

absl::Status PipelineStage::Backward(int64_t step, int k, bool last, bool defer_weights) {
  transport::StageMessage gradient;
  if (!runtime_.is_last()) {
    Doing(step, "receive", k, absl::StrCat("waits for GRADIENT of micro-batch ", k, " from stage ", options_.stage + 1));
    ASSIGN_OR_RETURN(gradient, Expect(link_.ReceiveFromNext(), Kind::kGradient, step, k));
  }
  transport::HostBuffer grad_input;  // written by the backward pass, sent as it is
  if (!runtime_.is_first()) {
    ASSIGN_OR_RETURN(int64_t tokens, runtime_.SlotTokens(k));
    grad_input = link_.OutgoingBuffer(Kind::kGradient, static_cast<size_t>(runtime_.InputElements(tokens)));
  }
  Doing(step, "backward", k, absl::StrCat("backward of micro-batch ", k, defer_weights ? " (input part)" : ""));
  RETURN_IF_ERROR(StartPass());
  absl::StatusOr<ShardRuntime::EdgeTransfers> backward =
      defer_weights ? runtime_.BackwardInputAsync(k, gradient.values, grad_input.span())
                    : runtime_.BackwardAsync(k, gradient.values, grad_input.span(), GradientsFinal(last));
  RETURN_IF_ERROR(backward.status());
  ShardRuntime::EdgeTransfers edge = *std::move(backward);
  RETURN_IF_ERROR(EndPass());
  KeepUntilRead(std::move(edge.inputs_read), std::move(gradient));
  if (runtime_.is_first()) return absl::OkStatus();
  transport::StageMessage out;
  out.kind = Kind::kGradient;
  out.step = step;
  out.micro_batch = k;
  out.values = std::move(grad_input);
  out.dtype = options_.wire;
  Doing(step, "send", k, absl::StrCat("sends GRADIENT of micro-batch ", k, " to stage ", options_.stage - 1));
  return sender_.Send(StageSender::Direction::kPrevious, std::move(out),
                      std::move(edge.output_written));
}

absl::Status PipelineStage::BackwardWeights(int64_t step, int k, bool last) {
  Doing(step, "weights", k, absl::StrCat("weight gradients of micro-batch ", k));
  RETURN_IF_ERROR(StartPass());
  RETURN_IF_ERROR(runtime_.BackwardWeights(k, GradientsFinal(last)));
  return EndPass();
}

ShardRuntime::GradientsFinal PipelineStage::GradientsFinal(bool last) {
  if (!last || buckets_ == nullptr) return nullptr;
  return [this](size_t first) { return buckets_->Ready(first); };
}

PipelineStage::~PipelineStage() {
  if (last_step_failed_) {
    link_.Close(absl::StrCat("stage ", options_.stage, " stopped after a failed step"));
  }
}

absl::StatusOr<StageStepResult> PipelineStage::RunStep(int64_t step) {
  absl::StatusOr<StageStepResult> result = RunStepImpl(step);
  last_step_failed_ = !result.ok();
  if (!result.ok() && replica_group_ != nullptr) {
    replica_group_->Close(absl::StrCat("stage ", options_.stage, " of replica ", options_.replica,
                                       " failed step ", step, ": ", result.status().message()));
    buckets_->Abandon();  // its calls in flight fail now
  }
  return result;
}

absl::StatusOr<StageStepResult> PipelineStage::RunStepImpl(int64_t step) {
  const auto start = Clock::now();
  const uint64_t received_before = link_.BytesReceived();
  const int64_t faults_before = MinorFaults();
  (void)trace_.Take();  // what a failed step left
  StageStepResult result;
  result.step = step;
  std::vector<data::Batch> batches;
  float loss_scale = 0.0f;
  if (runtime_.is_first()) {
    // This replica's micro-batches of the global batch; the loss is scaled
    // by the targets of the whole global batch (every replica's).
    const int m = options_.micro_batches;
    const int64_t per = options_.global_batch / (int64_t{options_.replicas} * m);
    for (int k = 0; k < m; ++k) {
      ASSIGN_OR_RETURN(data::Batch batch, data_->TrainBatch(step, options_.replica * m + k, per));
      batches.push_back(std::move(batch));
    }
    const int64_t targets = data_->TrainTargets(per) * options_.replicas * m;
    if (targets == 0) return absl::InternalError("a training step with no scored tokens");
    loss_scale = static_cast<float>(1.0 / static_cast<double>(targets));
  }
  RETURN_IF_ERROR(runtime_.ZeroGrads());
  runtime_.ResetPeakSlots();
  absl::Status status = [&]() -> absl::Status {
    using Type = PipelineAction::Type;
    // The action that finishes the gradients.
    size_t last_backward = 0;
    for (size_t i = 0; i < schedule_.size(); ++i) {
      if (schedule_[i].type == Type::kBackward || schedule_[i].type == Type::kBackwardWeights) last_backward = i;
    }
    for (size_t i = 0; i < schedule_.size(); ++i) {
      const PipelineAction& action = schedule_[i];
      const int k = action.micro_batch;
      ReleaseUploads(/*wait=*/false);
      switch (action.type) {
        case Type::kForward:
          RETURN_IF_ERROR(Forward(step, k, batches, loss_scale, result));
          break;
        case Type::kBackward:
        case Type::kBackwardInput:
          RETURN_IF_ERROR(Backward(step, k, i == last_backward, action.type == Type::kBackwardInput));
          break;
        case Type::kBackwardWeights:
          RETURN_IF_ERROR(BackwardWeights(step, k, i == last_backward));
          break;
      }
      // A group's gradients are complete: kept apart, and the next group's
      // start from zero, as a replica's of the spec would.
      for (size_t g = 0; g < group_ends_.size(); ++g) {
        if (group_ends_[g] != i) continue;
        Doing(step, "hold", -1, absl::StrCat("keeps the gradients of micro-batch group ", g));
        RETURN_IF_ERROR(buckets_->Hold(static_cast<int>(g)));
        RETURN_IF_ERROR(runtime_.ZeroGrads());
      }
    }
    return absl::OkStatus();
  }();
  // The device reads the batches' ids and the kept messages until then.
  ReleaseUploads(/*wait=*/true);
  for (const auto& timer : pass_timers_) {
    if (!status.ok()) break;
    absl::StatusOr<double> seconds = timer->Seconds();
    status = seconds.status();
    if (seconds.ok()) result.busy_seconds += *seconds;
  }
  pass_timers_.clear();
  // The losses, copied to the host while the passes ran, summed in
  // micro-batch order as the trainer sums them (with groups: each group's
  // from zero, as its replica of the spec would, then the groups in order,
  // as the coordinator adds replicas).
  const int per_group = options_.micro_batches / options_.groups;
  for (int k = 0; status.ok() && runtime_.is_last() && k < options_.micro_batches; ++k) {
    absl::StatusOr<double> loss = runtime_.Loss(k);
    status = loss.status();
    if (!loss.ok()) break;
    if (options_.groups == 1) {
      result.loss += *loss;
      continue;
    }
    if (k % per_group == 0) result.group_losses.push_back(0.0);
    result.group_losses.back() += *loss;
  }
  for (double group_loss : result.group_losses) result.loss += group_loss;
  if (!status.ok()) {
    for (int k = 0; k < options_.micro_batches; ++k) runtime_.Discard(k);
    return status;
  }
  result.peak_slots = runtime_.peak_slots_held();
  if (buckets_ != nullptr) {
    Doing(step, "reduce", -1, "waits for the gradient sums of its data-parallel replicas");
    RETURN_IF_ERROR(buckets_->Finish());
    result.reduce_seconds = buckets_->reduce_seconds();
    result.reduce_exposed_seconds = buckets_->exposed_seconds();
  }
  ASSIGN_OR_RETURN(double squared, ReduceGradNorm(step));
  result.grad_norm = std::sqrt(squared);
  const nn::OptimizerConfig& optimizer = runtime_.optimizer_config();
  result.lr = nn::LearningRate(optimizer, step);
  const double clip = nn::ClipFactor(optimizer, result.grad_norm);
  Doing(step, "optimizer", -1, "optimizer step");
  if (sharded()) {
    RETURN_IF_ERROR(runtime_.ApplyOptimizer(step, clip, buckets_->owned()));
    std::vector<DeviceSpan<float>> values;
    for (nn::Parameter* p : runtime_.parameters()) values.push_back(p->v());
    Doing(step, "gather", -1, "gathers the new weights from its data-parallel replicas");
    RETURN_IF_ERROR(buckets_->GatherParameters(values));
  } else {
    RETURN_IF_ERROR(runtime_.ApplyOptimizer(step, clip));
  }
  stepped_ = true;
  result.optimizer_state_bytes = runtime_.optimizer_state_bytes();
  Doing(step, "flush", -1, "waits for its last sends to go out");
  RETURN_IF_ERROR(sender_.Flush());
  result.trace = trace_.Take();  // its spans end before the step's time does
  result.step_seconds = SecondsSince(start);
  result.received_bytes = link_.BytesReceived() - received_before;
  result.minor_faults = MinorFaults() - faults_before;
  result.link_peak_bytes = link_.PeakHeldBytes();
  return result;
}

}  // namespace shardline::worker::runtime
