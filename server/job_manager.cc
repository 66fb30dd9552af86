#include "server/job_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/safetensors.h"
#include "common/status_macros.h"

namespace shardline::server {
namespace {

using shardline::v1::JobState;

std::vector<WorkerCapacity> Capacities(const std::vector<WorkerRecord>& workers) {
  std::vector<WorkerCapacity> out;
  for (const WorkerRecord& w : workers) {
    out.push_back({w.name, w.capabilities.gemm_flops(), w.capabilities.memory_bytes()});
  }
  return out;
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
  if (spec.parallel().data_parallel() != 1) {
    return absl::UnimplementedError("parallel.data_parallel > 1 is not built yet");
  }
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
  const std::vector<WorkerRecord> idle = registry_.Idle();
  ASSIGN_OR_RETURN(PipelinePlan plan, PlanPipeline(spec, Capacities(idle)));
  shardline::v1::PlanResponse out;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    auto* st = out.add_stages();
    st->set_stage(static_cast<int>(s));
    st->set_worker(plan.stages[s].worker);
    st->set_unit_begin(plan.stages[s].unit_begin);
    st->set_unit_end(plan.stages[s].unit_end);
    st->set_seconds_per_micro_batch(plan.stages[s].seconds_per_micro_batch);
    st->set_memory_bytes(plan.stages[s].memory_bytes);
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
    const int p = job.spec.parallel().pipeline_stages();
    std::vector<WorkerRecord> idle = registry_.Idle();
    if (static_cast<int>(idle.size()) < p) {
      job.status.set_message(absl::StrCat("waiting for ", p, " idle workers (", idle.size(), " now)"));
      Publish(job);
      continue;
    }
    idle.resize(p);
    absl::StatusOr<PipelinePlan> plan = PlanPipeline(job.spec, Capacities(idle));
    if (!plan.ok()) {
      End(job, shardline::v1::FAILED, absl::StrCat("cannot plan: ", plan.status().message()));
      continue;
    }
    const uint64_t epoch = next_epoch_++;
    job.status.set_state(shardline::v1::RUNNING);
    job.status.set_plan_epoch(epoch);
    job.status.set_message("");
    job.status.clear_stages();
    job.workers.clear();
    job.stages.assign(p, StageReport());
    for (int s = 0; s < p; ++s) {
      const StagePlan& sp = plan->stages[s];
      job.workers.push_back(idle[s].id);
      registry_.SetJob(idle[s].id, id);
      auto* status = job.status.add_stages();
      status->set_stage(s);
      status->set_worker(idle[s].name);
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
      if (s > 0) a.set_upstream_address(idle[s - 1].capabilities.listen_address());
      a.set_first_step(1);
      deliver_(idle[s].id, std::move(a));
    }
    Publish(job);
  }
}

absl::Status JobManager::CheckSender(const Job& job, uint64_t epoch, int stage,
                                     const std::string& worker_id) {
  if (epoch != job.status.plan_epoch()) {
    return absl::FailedPreconditionError(absl::StrCat("plan epoch ", epoch, " is stale; job ",
                                                      job.status.job_id(), " is at epoch ",
                                                      job.status.plan_epoch()));
  }
  if (stage < 0 || stage >= static_cast<int>(job.workers.size())) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job.status.job_id(), " has no stage ", stage));
  }
  if (!worker_id.empty() && job.workers[stage] != worker_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_id, " does not hold stage ", stage, " of ", job.status.job_id()));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> JobManager::ReportStep(const shardline::v1::ReportStepRequest& r) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, Find(r.job_id()));
  if (job->status.state() != shardline::v1::RUNNING) return true;
  RETURN_IF_ERROR(CheckSender(*job, r.plan_epoch(), r.stage(), r.worker_id()));
  const std::string& worker = job->status.stages(r.stage()).worker();
  if (!r.error().empty()) {
    const std::string message = absl::StrCat("stage ", r.stage(), " (worker ", worker,
                                             ") failed at step ", r.step(), ": ", r.error());
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
  StageReport& stage = job->stages[r.stage()];
  stage.last = r;
  stage.steps.insert(r.step());
  // The step is complete when every stage has reported it.
  for (const StageReport& s : job->stages) {
    if (!s.steps.count(r.step())) return false;
  }
  double slowest = 0;
  for (size_t s = 0; s < job->stages.size(); ++s) {
    StageReport& report = job->stages[s];
    report.steps.erase(report.steps.begin(), report.steps.upper_bound(r.step()));
    slowest = std::max(slowest, report.last.step_seconds());
    auto* status = job->status.mutable_stages(static_cast<int>(s));
    status->set_busy_fraction(report.last.step_seconds() > 0
                                  ? report.last.busy_seconds() / report.last.step_seconds()
                                  : 0.0);
    status->set_peak_slots(report.last.peak_slots());
    const double gib = static_cast<double>(report.last.received_bytes()) / (1 << 30);
    status->set_minor_faults_per_gib(gib > 0 ? report.last.minor_faults() / gib : 0.0);
    status->set_link_peak_bytes(report.last.link_peak_bytes());
  }
  const auto& last = job->stages.back().last;
  job->status.set_step(r.step());
  job->status.set_loss(last.loss());
  job->status.set_lr(last.lr());
  job->status.set_grad_norm(last.grad_norm());
  job->status.set_tokens_per_s(slowest > 0 ? last.tokens() / slowest : 0.0);
  job->recent_steps.push_back(job->status);
  if (job->recent_steps.size() > kRecentSteps) job->recent_steps.pop_front();
  Publish(*job);
  MaybeSucceed(*job);
  return false;
}

absl::StatusOr<bool> JobManager::ReportShard(const shardline::v1::ShardHeader& h,
                                             const std::string& bytes) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Job * job, Find(h.job_id()));
  if (job->status.state() != shardline::v1::RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat("job ", h.job_id(), " is not running"));
  }
  RETURN_IF_ERROR(CheckSender(*job, h.plan_epoch(), h.stage(), ""));
  if (h.stages() != static_cast<int>(job->workers.size())) {
    return absl::InvalidArgumentError(absl::StrCat("shard says ", h.stages(), " stages; the plan has ",
                                                   job->workers.size()));
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
      for (size_t s = 0; s < job.workers.size(); ++s) {
        if (job.workers[s] != w.id) continue;
        End(job, shardline::v1::FAILED,
            absl::StrCat("worker ", w.name, " (stage ", s, ") was lost: no heartbeat within its lease"));
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
