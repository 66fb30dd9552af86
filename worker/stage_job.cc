#include "worker/stage_job.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "common/job_spec.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "worker/background_reporter.h"
#include "worker/collective/timed_collective.h"
#include "worker/data/data_source.h"
#include "worker/runtime/pipeline_stage.h"
#include "worker/runtime/shard_runtime.h"
#include "worker/state_loader.h"
#include "worker/step_wire_paces.h"

namespace shardline::worker {
namespace {

shardline::v1::ReportStepRequest Report(const shardline::v1::Assignment& a,
                                        const std::string& worker_id, int64_t step) {
  shardline::v1::ReportStepRequest r;
  r.set_job_id(a.job_id());
  r.set_plan_epoch(a.plan_epoch());
  r.set_stage(a.stage());
  r.set_replica(a.replica());
  r.set_tensor_rank(a.tensor_rank());
  r.set_worker_id(worker_id);
  r.set_step(step);
  return r;
}

absl::Status ReportFailure(const shardline::v1::Assignment& a, const std::string& worker_id,
                           int64_t step, const absl::Status& error, StageReporter& reporter) {
  shardline::v1::ReportStepRequest r = Report(a, worker_id, step);
  r.set_error(std::string(error.message()));
  r.set_error_code(static_cast<int>(error.code()));
  (void)reporter.ReportStep(r);  // best effort: the coordinator may be the problem
  return error;
}

// The shard at `step` in host memory (the same on every replica of the
// stage): what the checkpoint uploads while the stage trains on.
// `reuse`: the last snapshot's tensors, written over.
absl::StatusOr<std::unique_ptr<ShardSnapshot>> TakeSnapshot(const shardline::v1::Assignment& a, int64_t step,
                                                            runtime::PipelineStage& stage,
                                                            runtime::ShardRuntime::HostTensors reuse) {
  common::SafetensorsContents contents;
  ASSIGN_OR_RETURN(contents.tensors, stage.ExportState(std::move(reuse)));
  contents.metadata = {{"job_id", a.job_id()}, {"stage", std::to_string(a.stage())},
                       {"step", std::to_string(step)}};
  shardline::v1::ShardHeader header;
  header.set_job_id(a.job_id());
  header.set_plan_epoch(a.plan_epoch());
  header.set_stage(a.stage());
  header.set_stages(a.stages());
  header.set_step(step);
  return ShardSnapshot::Create(std::move(header), std::move(contents));
}

}  // namespace

absl::Status RunStageJob(const shardline::v1::Assignment& a, const std::string& worker_id,
                         Backend& backend, transport::StageLink& link, collective::Collective* replicas,
                         collective::Collective* tensor_group,
                         StageReporter& reporter, StateCache& cache, const std::atomic<bool>& cancelled,
                         const std::atomic<int64_t>& stop_after_step, const data::DataAccess& data_access,
                         runtime::StageActivity* activity) {
  auto doing = [activity](int64_t step, std::string what) {
    if (activity != nullptr) activity->Set(step, std::move(what));
  };
  // The tensor group's collectives sit inside the passes: timed apart for
  // the step reports (and so the worker's metrics).
  std::unique_ptr<collective::TimedCollective> timed_tensor;
  if (tensor_group != nullptr) {
    timed_tensor = std::make_unique<collective::TimedCollective>(*tensor_group);
    tensor_group = timed_tensor.get();
  }
  shardline::v1::JobSpec spec = a.spec();
  absl::Status status = common::ValidateJobSpec(spec);
  std::unique_ptr<data::DataSource> data;
  std::unique_ptr<runtime::ShardRuntime> runtime;
  std::unique_ptr<runtime::PipelineStage> stage;
  if (status.ok() && a.stage() == 0) {
    absl::StatusOr<std::unique_ptr<data::DataSource>> source = data::CreateDataSource(spec, data_access);
    status = source.status();
    if (source.ok()) data = std::move(*source);
  }
  absl::StatusOr<runtime::ScheduleKind> schedule = runtime::ParseScheduleKind(spec.parallel().schedule());
  if (status.ok()) status = schedule.status();
  // "int8" and "auto": f32 off the device, 8-bit blocks on the links the
  // assignment names (the link encodes them).
  const std::string& wire_dtype = spec.parallel().wire_dtype();
  absl::StatusOr<common::DType> wire = common::ParseDType(
      wire_dtype.empty() || wire_dtype == "int8" || wire_dtype == "auto" ? "f32" : wire_dtype);
  if (status.ok()) status = wire.status();
  if (status.ok()) {
    const auto config = nn::ModelConfig::FromSpec(spec.model());
    nn::TensorParallel tp;
    if (a.tensor_size() > 1) tp = {a.tensor_rank(), a.tensor_size(), tensor_group, common::VocabParallel(spec)};
    auto created = runtime::ShardRuntime::Create(backend, config, a.unit_begin(), a.unit_end(),
                                                 spec.train().seed(),
                                                 nn::OptimizerConfig::FromSpec(spec.train()), tp);
    status = created.status();
    if (created.ok()) runtime = std::move(*created);
  }
  if (status.ok()) {
    runtime::PipelineStageOptions options{*schedule,
                                          a.stages(),
                                          a.stage(),
                                          spec.train().micro_batches(),
                                          spec.train().global_batch(),
                                          *wire,
                                          a.replica(),
                                          std::max(1, a.replicas()),
                                          static_cast<size_t>(spec.parallel().bucket_mib() * (1 << 20)),
                                          spec.parallel().shard_optimizer()};
    options.activity = activity;
    options.tensor_rank = a.tensor_rank();
    options.tensor_size = std::max(1, a.tensor_size());
    options.split_previous = a.gather_from_previous();
    options.split_next = a.scatter_to_next();
    options.int8_reduce = a.int8_reduce();
    options.groups = std::max(1, a.replica_groups());
    options.eval_examples = spec.train().eval_examples();
    options.eval_exact_match = common::EvaluatesExactMatch(spec);
    if (options.groups > 1) {
      LOG(INFO) << "job " << a.job_id() << " stage " << a.stage() << " replica " << a.replica() << " runs "
                << options.groups << " of the spec's replicas' micro-batch groups (the grid has "
                << std::max(1, a.replicas()) << " replicas)"
                << (a.int8_reduce() ? "; its gradient sums stay f32" : "")
                << (*schedule == runtime::ScheduleKind::kZeroBubble ? "; 1F1B's order (the same bits as zb)" : "");
    }
    auto created = runtime::PipelineStage::Create(*runtime, data.get(), link, options, replicas, tensor_group);
    status = created.status();
    if (created.ok()) stage = std::move(*created);
  }
  std::string resumed_from;
  // A job that starts from given weights (another job's, or sent with it)
  // loads them as the coordinator's version of step 0, as a restart loads a
  // checkpoint.
  if (status.ok() && (a.first_step() > 1 || a.initial_weights())) {
    doing(a.first_step(), absl::StrCat("loads the state of step ", a.first_step() - 1));
    absl::StatusOr<std::string> source = LoadState(a, worker_id, *runtime, *stage, reporter, cache);
    status = source.status();
    if (source.ok()) {
      resumed_from = *source;
      LOG(INFO) << "job " << a.job_id() << " stage " << a.stage() << " replica " << a.replica()
                << ": resumed from step " << a.first_step() - 1 << ", its state from " << resumed_from;
    }
  }
  if (!status.ok()) return ReportFailure(a, worker_id, a.first_step(), status, reporter);
  if (a.gather_from_previous() || a.scatter_to_next()) {
    LOG(INFO) << "job " << a.job_id() << " stage " << a.stage() << " tensor rank " << a.tensor_rank()
              << ": parts of tensors (scatter/gather) on the edge"
              << (a.gather_from_previous() && a.scatter_to_next() ? "s with both neighbours"
                  : a.gather_from_previous()                       ? " with the previous stage"
                                                                   : " with the next stage");
  }

  int64_t total = spec.train().steps();  // or the step the coordinator re-plans from
  BackgroundReporter background(reporter, cache, cancelled);
  background.Prepare(runtime->StateLayout());  // the snapshot memory, allocated off this thread
  // Reported once the background reporter has stopped: they share the
  // reporter.
  auto fail = [&](int64_t step, const absl::Status& error) {
    background.Abandon();
    return ReportFailure(a, worker_id, step, error, reporter);
  };
  // A checkpoint of `step` (its report `r`): the snapshot now, its digest
  // (every replica) and upload (replica 0) in the background.
  auto checkpoint = [&](int64_t step, shardline::v1::ReportStepRequest r) -> absl::Status {
    const absl::Time begin = absl::Now();
    doing(step, "waits for the previous checkpoint's upload");
    runtime::ShardRuntime::HostTensors memory = background.WaitForSnapshotSlot();
    const absl::Time ready = absl::Now();
    doing(step, "copies its checkpoint snapshot");
    ASSIGN_OR_RETURN(std::unique_ptr<ShardSnapshot> snapshot, TakeSnapshot(a, step, *stage, std::move(memory)));
    r.set_checkpoint_wait_seconds(absl::ToDoubleSeconds(ready - begin));
    r.set_checkpoint_seconds(absl::ToDoubleSeconds(absl::Now() - ready));
    background.ReportCheckpoint(std::move(r), std::move(snapshot), a.replica() == 0 && a.tensor_rank() == 0);
    return absl::OkStatus();
  };
  StepWirePaces wire_paces(link, replicas);
  int64_t last_run = a.first_step() - 1, last_checkpoint = last_run;
  shardline::v1::ReportStepRequest last_report;  // of last_run
  for (int64_t step = a.first_step(); step <= total; ++step) {
    if (cancelled) return absl::CancelledError("the job was cancelled");
    if (absl::Status s = background.status(); !s.ok()) {
      return absl::IsCancelled(s) ? s : fail(step, s);  // CANCELLED: the coordinator stopped the job
    }
    // The coordinator re-plans from `stop`: end there, checkpointed. The
    // word is sent half a second's steps (at least two) ahead; if it came
    // after that step's end, the state is still that step's: checkpoint it
    // now. Later than that, the step is gone: fail, and the job restarts
    // from its commit.
    if (const int64_t stop = stop_after_step.load(); stop > 0 && step > stop) {
      if (last_run > stop) {
        return fail(step, absl::UnavailableError(absl::StrCat("told to stop after step ", stop, " at step ", step,
                                                              ": too late to re-plan from it")));
      }
      if (last_checkpoint < stop) {  // its report went out already: again, with the shard's digest
        if (absl::Status s = checkpoint(stop, last_report); !s.ok()) return fail(stop, s);
      }
      total = stop;
      break;
    }
    const uint64_t collective_before = replicas != nullptr ? replicas->BytesReceived() : 0;
    const uint64_t tensor_before = tensor_group != nullptr ? tensor_group->BytesReceived() : 0;
    const double tensor_seconds_before = timed_tensor != nullptr ? timed_tensor->seconds() : 0.0;
    wire_paces.Begin();
    absl::StatusOr<runtime::StageStepResult> result = stage->RunStep(step);
    if (!result.ok()) return fail(step, result.status());
    if (step == a.first_step()) {
      LOG(INFO) << "job " << a.job_id() << " stage " << a.stage() << " replica " << a.replica() << ": "
                << result->optimizer_state_bytes << " bytes of optimizer state"
                << (spec.parallel().shard_optimizer() ? " (its ZeRO-1 share)" : "");
    }
    shardline::v1::ReportStepRequest r = Report(a, worker_id, step);
    if (common::EvaluatesAfter(spec, step)) {
      doing(step, absl::StrCat("validation pass after step ", step));
      absl::StatusOr<runtime::StageEvalResult> eval = stage->Evaluate(step);
      if (!eval.ok()) return fail(step, eval.status());
      if (a.stage() == a.stages() - 1) {
        for (double loss : eval->losses) r.add_eval_losses(loss);
        if (common::EvaluatesExactMatch(spec)) r.set_eval_matches(eval->matches);
      }
      r.set_eval_windows(eval->windows);
    }
    r.set_loss(result->loss);
    for (double loss : result->group_losses) r.add_group_losses(loss);
    r.set_grad_norm(result->grad_norm);
    r.set_lr(result->lr);
    r.set_tokens(result->tokens);
    r.set_busy_seconds(result->busy_seconds);
    r.set_step_seconds(result->step_seconds);
    r.set_peak_slots(static_cast<int64_t>(result->peak_slots));
    r.set_received_bytes(static_cast<int64_t>(result->received_bytes));
    r.set_minor_faults(result->minor_faults);
    r.set_link_peak_bytes(static_cast<int64_t>(result->link_peak_bytes));
    for (shardline::v1::TraceEvent& event : result->trace) *r.add_trace() = std::move(event);
    if (replicas != nullptr) r.set_collective_bytes(static_cast<int64_t>(replicas->BytesReceived() - collective_before));
    if (tensor_group != nullptr) {
      r.set_tensor_collective_bytes(static_cast<int64_t>(tensor_group->BytesReceived() - tensor_before));
      r.set_tensor_collective_seconds(timed_tensor->seconds() - tensor_seconds_before);
    }
    wire_paces.AddTo(r);
    if (step == a.first_step()) r.set_resumed_from(resumed_from);
    last_run = step;
    if (common::CheckpointsAfter(spec, step) || step == total || step == stop_after_step.load()) {
      if (absl::Status s = checkpoint(step, std::move(r)); !s.ok()) return fail(step, s);
      last_checkpoint = step;
    } else {
      last_report = r;
      background.Report(std::move(r));
    }
  }
  doing(total, "waits for its last reports and checkpoint upload");
  if (absl::Status s = background.Flush(); !s.ok()) return absl::IsCancelled(s) ? s : fail(total, s);
  return absl::OkStatus();
}

}  // namespace shardline::worker
