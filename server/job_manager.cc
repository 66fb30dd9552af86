#include "server/job_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/safetensors.h"
#include "common/status_macros.h"

namespace shardline::server {
namespace {

using shardline::v1::JobState;

// What each stage of a p × d grid can count on: its replicas share one cut,
// so the slowest and the smallest of a stage's d workers (positions r·p + s)
// decide, under replica 0's name.
std::vector<WorkerCapacity> GridCapacities(const std::vector<WorkerRecord>& workers, int p, int d) {
  std::vector<WorkerCapacity> out;
  for (int s = 0; s < p; ++s) {
    WorkerCapacity c{workers[s].name, workers[s].capabilities.gemm_flops(), workers[s].capabilities.memory_bytes()};
    for (int r = 1; r < d; ++r) {
      const auto& caps = workers[r * p + s].capabilities;
      c.flops_per_second = std::min(c.flops_per_second, caps.gemm_flops());
      c.memory_bytes = std::min(c.memory_bytes, caps.memory_bytes());
    }
    out.push_back(c);
  }
  return out;
}

// Gradient bytes one worker of a stage sends per step in its group's
// all-reduce (reduce-scatter and all-gather, (d − 1)/d each).
int64_t ReduceBytesPerStep(int64_t parameters, int d) {
  return d > 1 ? 2 * (d - 1) * parameters * static_cast<int64_t>(sizeof(float)) / d : 0;
}

}  // namespace

bool JobManager::Ended(const Job& job) {
  const JobState s = job.status.state();
  return s == shardline::v1::SUCCEEDED || s == shardline::v1::FAILED ||
         s == shardline::v1::CANCELLED;
}

absl::StatusOr<JobManager::Job*> JobManager::Find(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return &it->second;
}

absl::StatusOr<shardline::v1::JobStatus> JobManager::Submit(shardline::v1::JobSpec spec) {
  RETURN_IF_ERROR(common::ValidateJobSpec(spec));
  absl::MutexLock lock(&mu_);
  const std::string id = absl::StrCat("job-", next_job_++);
  Job& job = jobs_[id];
  job.spec = std::move(spec);
  job.status.set_job_id(id);
  job.status.set_name(job.spec.name());
  job.status.set_state(shardline::v1::PENDING);
  job.status.set_total_steps(job.spec.train().steps());
  job.status.set_committed_step(-1);
  order_.push_back(id);
  ScheduleLocked();
  return job.status;
}

absl::StatusOr<shardline::v1::JobStatus> JobManager::Get(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, Find(job_id));
  return job->status;
}

absl::StatusOr<shardline::v1::JobSpec> JobManager::Spec(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, Find(job_id));
  return job->spec;
}

std::vector<shardline::v1::JobStatus> JobManager::List() {
  absl::MutexLock lock(&mu_);
  std::vector<shardline::v1::JobStatus> out;
  for (const std::string& id : order_) out.push_back(jobs_[id].status);
  return out;
}

absl::StatusOr<std::vector<std::string>> JobManager::StageWorkers(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, Find(job_id));
  std::vector<std::string> names;
  for (const auto& stage : job->status.stages()) names.push_back(stage.worker());
  return names;
}

absl::StatusOr<shardline::v1::JobStatus> JobManager::Cancel(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, Find(job_id));
  if (Ended(*job)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " has already ended (",
                                                      JobState_Name(job->status.state()), ")"));
  }
  End(*job, shardline::v1::CANCELLED, "cancelled by an operator");
  return job->status;
}

absl::StatusOr<shardline::v1::PlanResponse> JobManager::Plan(shardline::v1::JobSpec spec) {
  RETURN_IF_ERROR(common::ValidateJobSpec(spec));
  const int p = spec.parallel().pipeline_stages(), d = spec.parallel().data_parallel();
  const std::vector<WorkerRecord> idle = registry_.Idle();
  if (static_cast<int>(idle.size()) < p * d) {
    return absl::InvalidArgumentError(absl::StrCat("the plan needs ", p * d, " workers (", p, " stages × ", d,
                                                   " replicas), ", idle.size(), " are idle"));
  }
  ASSIGN_OR_RETURN(PipelinePlan plan, PlanPipeline(spec, GridCapacities(idle, p, d)));
  shardline::v1::PlanResponse out;
  for (int r = 0; r < d; ++r) {
    for (int s = 0; s < p; ++s) {
      const StagePlan& sp = plan.stages[s];
      auto* st = out.add_stages();
      st->set_stage(s);
      st->set_replica(r);
      st->set_worker(idle[r * p + s].name);
      st->set_unit_begin(sp.unit_begin);
      st->set_unit_end(sp.unit_end);
      st->set_seconds_per_micro_batch(sp.seconds_per_micro_batch);
      st->set_memory_bytes(sp.memory_bytes);
      st->set_reduce_bytes_per_step(ReduceBytesPerStep(sp.parameters, d));
    }
  }
  out.set_predicted_step_seconds(plan.predicted_step_seconds);
  out.set_bubble_fraction(plan.bubble_fraction);
  return out;
}

void JobManager::Schedule() {
  absl::MutexLock lock(&mu_);
  ScheduleLocked();
}

void JobManager::ScheduleLocked() {
  for (const std::string& id : order_) {
    Job& job = jobs_[id];
    if (job.status.state() != shardline::v1::PENDING) continue;
    const int p = job.spec.parallel().pipeline_stages(), d = job.spec.parallel().data_parallel();
    std::vector<WorkerRecord> idle = registry_.Idle();
    if (static_cast<int>(idle.size()) < p * d) {
      job.status.set_message(d > 1 ? absl::StrCat("waiting for ", p * d, " idle workers (", p, " stages × ", d,
                                                  " replicas; ", idle.size(), " now)")
                                   : absl::StrCat("waiting for ", p, " idle workers (", idle.size(), " now)"));
      Publish(job);
      continue;
    }
    idle.resize(p * d);
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(job.spec, GridCapacities(idle, p, d));
    if (!plan.ok()) {
      End(job, shardline::v1::FAILED, absl::StrCat("cannot plan: ", plan.status().message()));
      continue;
    }
    const uint64_t epoch = next_epoch_++;
    job.status.set_state(shardline::v1::RUNNING);
    job.status.set_plan_epoch(epoch);
    job.status.set_message("");
    job.status.clear_stages();
    job.stages = p;
    job.replicas = d;
    job.workers.clear();
    job.reports.assign(static_cast<size_t>(p * d), {});
    for (int r = 0; r < d; ++r) {
      for (int s = 0; s < p; ++s) {
        const StagePlan& sp = plan->stages[s];
        const WorkerRecord& w = idle[r * p + s];
        job.workers.push_back(w.id);
        registry_.SetJob(w.id, id);
        auto* status = job.status.add_stages();
        status->set_stage(s);
        status->set_replica(r);
        status->set_worker(w.name);
        status->set_unit_begin(sp.unit_begin);
        status->set_unit_end(sp.unit_end);
        shardline::v1::Assignment a;
        a.set_job_id(id);
        a.set_plan_epoch(epoch);
        *a.mutable_spec() = job.spec;
        a.set_stage(s);
        a.set_stages(p);
        a.set_unit_begin(sp.unit_begin);
        a.set_unit_end(sp.unit_end);
        if (s > 0) a.set_upstream_address(idle[r * p + s - 1].capabilities.listen_address());
        a.set_first_step(1);
        a.set_replica(r);
        a.set_replicas(d);
        if (d > 1) {
          for (int q = 0; q < d; ++q) a.add_replica_addresses(idle[q * p + s].capabilities.listen_address());
        }
        deliver_(w.id, std::move(a));
      }
    }
    Publish(job);
  }
}

std::string JobManager::PositionName(const Job& job, int position) {
  const int s = position % job.stages, r = position / job.stages;
  const std::string worker = job.status.stages(position).worker();
  return job.replicas > 1 ? absl::StrCat("stage ", s, " of replica ", r, " (worker ", worker, ")")
                          : absl::StrCat("stage ", s, " (worker ", worker, ")");
}

absl::StatusOr<int> JobManager::CheckSender(const Job& job, uint64_t epoch, int stage, int replica,
                                            const std::string& worker_id) {
  if (epoch != job.status.plan_epoch()) {
    return absl::FailedPreconditionError(absl::StrCat("plan epoch ", epoch, " is stale; job ",
                                                      job.status.job_id(), " is at epoch ",
                                                      job.status.plan_epoch()));
  }
  if (stage < 0 || stage >= job.stages) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job.status.job_id(), " has no stage ", stage));
  }
  if (replica < 0 || replica >= job.replicas) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job.status.job_id(), " has no replica ", replica));
  }
  const int position = replica * job.stages + stage;
  if (!worker_id.empty() && job.workers[position] != worker_id) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker_id, " does not hold stage ", stage,
                                                      job.replicas > 1 ? absl::StrCat(" of replica ", replica) : "",
                                                      " of ", job.status.job_id()));
  }
  return position;
}

absl::StatusOr<bool> JobManager::ReportStep(const shardline::v1::ReportStepRequest& r) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, Find(r.job_id()));
  if (job->status.state() != shardline::v1::RUNNING) return true;
  ASSIGN_OR_RETURN(const int position, CheckSender(*job, r.plan_epoch(), r.stage(), r.replica(), r.worker_id()));
  if (!r.error().empty()) {
    const std::string message = absl::StrCat(PositionName(*job, position), " failed at step ", r.step(), ": ",
                                             r.error());
    const auto code = static_cast<absl::StatusCode>(r.error_code());
    const bool link_broke = code == absl::StatusCode::kUnavailable ||
                            code == absl::StatusCode::kDeadlineExceeded ||
                            code == absl::StatusCode::kCancelled;
    if (!link_broke) {
      End(*job, shardline::v1::FAILED, message);
    } else if (job->pending_failure.empty()) {
      job->pending_failure = message;
      job->failure_deadline = registry_.Now() + registry_.lease();
      job->status.set_message("a stage lost its link; checking whether a worker was lost");
      Publish(*job);
    }
    return true;
  }
  if (r.step() < 1 || r.step() > job->status.total_steps()) {
    return absl::InvalidArgumentError(absl::StrCat("step ", r.step(), " is outside 1..",
                                                   job->status.total_steps()));
  }
  if (r.step() <= job->status.step()) return false;  // a retried report
  job->reports[position][r.step()] = r;
  MaybeCompleteStep(*job, r.step());
  return job->status.state() != shardline::v1::RUNNING;
}

void JobManager::MaybeCompleteStep(Job& job, int64_t step) {
  for (const auto& reports : job.reports) {
    if (!reports.count(step)) return;
  }
  const int p = job.stages, d = job.replicas;
  auto report = [&](int s, int r) -> const shardline::v1::ReportStepRequest& {
    return job.reports[r * p + s].at(step);
  };
  // The replicas of a stage hold the same shard at a checkpoint.
  for (int s = 0; s < p; ++s) {
    for (int r = 1; r < d; ++r) {
      if (report(s, r).shard_digest() != report(s, 0).shard_digest()) {
        End(job, shardline::v1::FAILED,
            absl::StrCat("the replicas of stage ", s, " diverged at step ", step, ": replica ", r,
                         "'s shard differs from replica 0's (digest ", absl::Hex(report(s, r).shard_digest()),
                         " vs ", absl::Hex(report(s, 0).shard_digest()), ")"));
        return;
      }
    }
  }
  double slowest = 0, loss = 0;
  int64_t tokens = 0;
  for (int position = 0; position < p * d; ++position) {
    const shardline::v1::ReportStepRequest& rep = job.reports[position].at(step);
    slowest = std::max(slowest, rep.step_seconds());
    auto* status = job.status.mutable_stages(position);
    status->set_busy_fraction(rep.step_seconds() > 0 ? rep.busy_seconds() / rep.step_seconds() : 0.0);
    status->set_peak_slots(rep.peak_slots());
    const double gib = static_cast<double>(rep.received_bytes()) / (1 << 30);
    status->set_minor_faults_per_gib(gib > 0 ? rep.minor_faults() / gib : 0.0);
    status->set_link_peak_bytes(rep.link_peak_bytes());
  }
  // The step's loss and tokens: the replicas' last stages', in rank order.
  for (int r = 0; r < d; ++r) {
    loss += report(p - 1, r).loss();
    tokens += report(p - 1, r).tokens();
  }
  const shardline::v1::ReportStepRequest& last = report(p - 1, 0);
  job.status.set_step(step);
  job.status.set_loss(loss);
  job.status.set_lr(last.lr());
  job.status.set_grad_norm(last.grad_norm());
  job.status.set_tokens_per_s(slowest > 0 ? tokens / slowest : 0.0);
  for (auto& reports : job.reports) reports.erase(reports.begin(), reports.upper_bound(step));
  job.recent_steps.push_back(job.status);
  if (job.recent_steps.size() > kRecentSteps) job.recent_steps.pop_front();
  Publish(job);
  MaybeSucceed(job);
}

absl::StatusOr<bool> JobManager::ReportShard(const shardline::v1::ShardHeader& h,
                                             const std::string& bytes) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, Find(h.job_id()));
  if (job->status.state() != shardline::v1::RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat("job ", h.job_id(), " is not running"));
  }
  // Replica 0 sends the shards (the others' agree: their digests).
  RETURN_IF_ERROR(CheckSender(*job, h.plan_epoch(), h.stage(), 0, "").status());
  if (h.stages() != job->stages) {
    return absl::InvalidArgumentError(absl::StrCat("shard says ", h.stages(), " stages; the plan has ",
                                                   job->stages));
  }
  if (h.step() < 0 || h.step() > job->status.total_steps()) {
    return absl::InvalidArgumentError(absl::StrCat("shard of step ", h.step(), " is out of range"));
  }
  ASSIGN_OR_RETURN(common::SafetensorsContents contents, common::ParseSafetensors(bytes));
  ASSIGN_OR_RETURN(bool committed,
                   weights_.Report({h.job_id(), h.stage(), h.stages(), h.step(), std::move(contents)}));
  if (committed) {
    job->status.set_committed_step(h.step());
    Publish(*job);
    MaybeSucceed(*job);
  }
  return committed;
}

void JobManager::MaybeSucceed(Job& job) {
  if (job.status.state() == shardline::v1::RUNNING &&
      job.status.step() == job.status.total_steps() &&
      job.status.committed_step() == job.status.total_steps()) {
    End(job, shardline::v1::SUCCEEDED, "");
  }
}

void JobManager::End(Job& job, JobState state, const std::string& message) {
  const bool was_running = job.status.state() == shardline::v1::RUNNING;
  job.status.set_state(state);
  job.status.set_message(message);
  for (const std::string& worker : job.workers) {
    if (was_running && state != shardline::v1::SUCCEEDED) {
      shardline::v1::Assignment cancel;
      cancel.set_job_id(job.status.job_id());
      cancel.set_plan_epoch(job.status.plan_epoch());
      cancel.set_cancel(true);
      deliver_(worker, std::move(cancel));
    }
    registry_.SetJob(worker, "");
  }
  Publish(job);
  ScheduleLocked();
}

void JobManager::WorkersLost(const std::vector<WorkerRecord>& lost) {
  absl::MutexLock lock(&mu_);
  for (const WorkerRecord& w : lost) {
    for (auto& [id, job] : jobs_) {
      if (job.status.state() != shardline::v1::RUNNING) continue;
      for (size_t position = 0; position < job.workers.size(); ++position) {
        if (job.workers[position] != w.id) continue;
        const int s = static_cast<int>(position) % job.stages, r = static_cast<int>(position) / job.stages;
        End(job, shardline::v1::FAILED,
            absl::StrCat("worker ", w.name, " (stage ", s, job.replicas > 1 ? absl::StrCat(" of replica ", r) : "",
                         ") was lost: no heartbeat within its lease"));
        break;
      }
    }
  }
}

void JobManager::Tick() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = registry_.Now();
  for (auto& [id, job] : jobs_) {
    if (job.status.state() == shardline::v1::RUNNING && !job.pending_failure.empty() &&
        now >= job.failure_deadline) {
      End(job, shardline::v1::FAILED, job.pending_failure);
    }
  }
}

absl::Status JobManager::Watch(const std::string& job_id,
                               std::shared_ptr<StreamMailbox<shardline::v1::JobStatus>> mailbox) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, Find(job_id));
  for (const shardline::v1::JobStatus& past : job->recent_steps) {
    if (past.step() < job->status.step()) mailbox->Push(past);  // the current step comes with the status now
  }
  mailbox->Push(job->status);
  if (!Ended(*job)) job->watchers.push_back(std::move(mailbox));
  return absl::OkStatus();
}

void JobManager::Publish(Job& job) {
  std::vector<std::shared_ptr<StreamMailbox<shardline::v1::JobStatus>>> alive;
  for (auto& watcher : job.watchers) {
    if (watcher->Push(job.status)) alive.push_back(std::move(watcher));
  }
  job.watchers = Ended(job) ? decltype(alive)() : std::move(alive);
}

}  // namespace shardline::server
