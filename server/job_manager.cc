#include "server/job_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/heartbeat.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/grid_placement.h"

namespace shardline::server {

using shardline::v1::JobState;

absl::StatusOr<RunningJob*> JobManager::Find(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return &it->second;
}

absl::Status JobManager::Recover() {
  ASSIGN_OR_RETURN(std::vector<CoordinatorStore::StoredJob> saved, store_.LoadJobs());
  absl::MutexLock lock(&mu_);
  for (CoordinatorStore::StoredJob& s : saved) {
    const std::string id = s.status.job_id();
    // The weights are the truth for what was committed (the record may
    // predate the last commit).
    absl::StatusOr<WeightStore::Version> committed = weights_.CommittedVersion(id);
    s.status.set_committed_step(committed.ok() ? committed->step : -1);
    s.status.set_checkpoint_bytes(committed.ok() ? committed->bytes : 0);
    RunningJob& job = jobs_.try_emplace(id, std::move(s.spec), std::move(s.status)).first->second;
    order_.push_back(id);
    const bool untimed = job.FillMissingTimes(registry_.Now());
    if (job.ended()) {
      if (untimed) Save(job);
      continue;
    }
    LOG(INFO) << "job " << id << ": " << job.status().message();
    // Its workers have a lease to notice and a backoff to register again;
    // then it may re-plan onto fewer stages.
    Fence(job);
    job.AllowShrinkAt(registry_.Now() + 2 * registry_.lease());
    if (job.finished()) End(job, shardline::v1::SUCCEEDED, "");
    Save(job);
  }
  if (!saved.empty()) LOG(INFO) << "recovered " << saved.size() << " jobs";
  ForgetUnownedCheckpoints();
  return absl::OkStatus();
}

void JobManager::Save(const RunningJob& job) {
  if (absl::Status s = store_.SaveJob(job.spec(), job.status()); !s.ok()) {
    LOG(ERROR) << "job " << job.status().job_id() << " was not saved: " << s;
  }
}

absl::StatusOr<shardline::v1::GetTraceResponse> JobManager::Trace(const std::string& job_id, int64_t first,
                                                                    int64_t last) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(RunningJob * job, Find(job_id));
  return job->trace().Get(job_id, first, last);
}

absl::StatusOr<shardline::v1::JobStatus> JobManager::Get(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(RunningJob * job, Find(job_id));
  shardline::v1::JobStatus status = job->status();
  if (!job->running()) return status;
  // The hang explainer: what each position said it was doing at its
  // worker's last heartbeat.
  const absl::Time now = registry_.Now();
  for (size_t position = 0; position < job->workers().size(); ++position) {
    absl::StatusOr<WorkerRecord> worker = registry_.Get(job->workers()[position]);
    if (!worker.ok() || static_cast<int>(position) >= status.stages_size()) continue;
    shardline::v1::StageStatus* stage = status.mutable_stages(static_cast<int>(position));
    const double age = absl::ToDoubleSeconds(now - worker->last_heartbeat);
    stage->set_heartbeat_age_seconds(age);
    const shardline::v1::StageActivity& a = worker->activity;
    if (a.job_id() != job_id || a.plan_epoch() != status.plan_epoch()) continue;
    stage->set_activity(a.doing());
    stage->set_activity_step(a.step());
    stage->set_activity_seconds(a.seconds() + age);
  }
  return status;
}

absl::StatusOr<shardline::v1::JobSpec> JobManager::Spec(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(RunningJob * job, Find(job_id));
  return job->spec();
}

std::vector<shardline::v1::JobStatus> JobManager::List() {
  absl::MutexLock lock(&mu_);
  std::vector<shardline::v1::JobStatus> out;
  for (const std::string& id : order_) out.push_back(jobs_.at(id).status());
  return out;
}

absl::StatusOr<std::vector<std::string>> JobManager::StageWorkers(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(RunningJob * job, Find(job_id));
  std::vector<std::string> names;
  for (const auto& stage : job->status().stages()) names.push_back(stage.worker());
  return names;
}

absl::StatusOr<shardline::v1::JobStatus> JobManager::Cancel(const std::string& job_id, const std::string& by) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(RunningJob * job, Find(job_id));
  if (job->ended()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " has already ended (",
                                                      JobState_Name(job->status().state()), ")"));
  }
  End(*job, shardline::v1::CANCELLED, absl::StrCat("cancelled by ", by));
  return job->status();
}

absl::StatusOr<shardline::v1::DeleteJobResponse> JobManager::Delete(const std::string& job_id, const std::string& by) {
  shardline::v1::DeleteJobResponse out;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(RunningJob * job, Find(job_id));
    if (!job->ended()) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " is ", JobState_Name(job->status().state()),
                                                        "; cancel it first"));
    }
    out.set_job_id(job_id);
    out.set_state(job->status().state());
  }
  // An ended job never runs again, so its checkpoint can go outside the
  // jobs' lock (the store moves it aside at once and removes it after).
  ASSIGN_OR_RETURN(const int64_t freed, weights_.DeleteJob(job_id));
  out.set_freed_bytes(freed);
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(store_.DeleteJob(job_id));  // NOT_FOUND: another deletion took it meanwhile
  jobs_.erase(job_id);
  order_.erase(std::remove(order_.begin(), order_.end(), job_id), order_.end());
  if (delete_observer_) delete_observer_(job_id);
  LOG(INFO) << "job " << job_id << " deleted by " << by << " (" << freed << " bytes of checkpoint freed)";
  return out;
}

absl::StatusOr<shardline::v1::PlanResponse> JobManager::Plan(shardline::v1::JobSpec spec) {
  RETURN_IF_ERROR(common::ValidateJobSpec(spec));
  return PreviewGrid(spec, registry_.Idle(), LinksFrom(&links_));
}

void JobManager::Schedule() {
  absl::MutexLock lock(&mu_);
  ScheduleLocked();
}

void JobManager::ScheduleLocked() {
  for (const std::string& id : order_) {
    RunningJob& job = jobs_.at(id);
    if (!job.waiting()) continue;
    // Its workers are idle for its probes, not for the jobs behind it.
    if (AwaitingProbes(job)) break;
    const int p = job.spec().parallel().pipeline_stages(), d = job.spec().parallel().data_parallel();
    const int t = std::max(1, job.spec().parallel().tensor_parallel());
    const std::vector<WorkerRecord> idle = registry_.Idle();
    const int n = static_cast<int>(idle.size());
    const std::string resume = job.resume_reason().empty()
                                   ? ""
                                   : absl::StrCat("recovering (", job.resume_reason(), "): resuming at step ",
                                                  job.first_step(), ": ");
    std::string grid = absl::StrCat(p, " stages");
    if (d > 1) absl::StrAppend(&grid, " × ", d, " replicas");
    if (t > 1) absl::StrAppend(&grid, " × ", t, " tensor ranks");
    const std::string want = d > 1 || t > 1
                                 ? absl::StrCat("waiting for ", p * d * t, " idle workers (", grid, "; ", n, " now)")
                                 : absl::StrCat("waiting for ", p, " idle workers (", n, " now)");
    // A job that lost workers re-plans when no replacement came within
    // its grace: onto fewer stages of the same d replicas (and t tensor
    // ranks), or, with fewer than d · t workers, onto fewer replicas (the
    // largest divisor d′ of d they can hold), each running d / d′ of the
    // spec's replicas' micro-batch groups, summed apart: the same bits.
    int stages = p, replicas = d;
    if (n < p * d * t) {
      const bool grace_over = registry_.Now() >= job.shrink_after();
      stages = grace_over ? std::min(p - 1, n / (d * t)) : 0;
      for (int fewer = d - 1; grace_over && stages < 1 && fewer >= 1; --fewer) {
        if (d % fewer != 0 || n < fewer * t || (fewer > 1 && d / fewer > common::kMaxReplicaGroups)) continue;
        replicas = fewer;
        stages = std::min(p, n / (fewer * t));
      }
      if (stages < 1) {
        job.Wait(absl::StrCat(resume, want));
        continue;
      }
    }
    absl::StatusOr<GridPlacement> placement =
        PlaceGrid(job.spec(), id, job.first_step(), stages, idle, job.previous_workers(), job.previous_cut(),
                  LinksFrom(&links_), replicas);
    if (!placement.ok() && (stages < p || replicas < d)) {
      job.Wait(absl::StrCat(resume, "cannot re-plan onto ", stages * replicas * t, " workers (",
                            placement.status().message(), "); ", want));
      continue;
    }
    if (!placement.ok()) {
      End(job, shardline::v1::FAILED, absl::StrCat("cannot plan: ", placement.status().message()));
      continue;
    }
    absl::StatusOr<uint64_t> epoch = store_.TakeEpoch();
    if (!epoch.ok()) {
      job.Wait(absl::StrCat("cannot take a plan epoch: ", epoch.status().message()));
      continue;
    }
    std::vector<shardline::v1::Assignment> assignments = std::move(placement->assignments);
    job.Start(*epoch, *std::move(placement), registry_.Now());
    Save(job);
    for (size_t position = 0; position < assignments.size(); ++position) {
      const std::string& worker = job.workers()[position];
      registry_.SetJob(worker, id);
      assignments[position].set_plan_epoch(*epoch);
      assignments[position].set_link_token(job.link_token());  // the job's workers alone know it
      assignments[position].set_initial_weights(job.first_step() == 1 && !job.status().init_from().empty());
      deliver_(worker, std::move(assignments[position]));
    }
    job.rate_watch().Start(job.first_step());
    job.set_link_recoveries_seen(links_.recoveries());
    job.idle_seen().clear();
    for (const WorkerRecord& w : registry_.Idle()) job.idle_seen().insert(w.name);
  }
}

absl::StatusOr<bool> JobManager::ReportStep(const shardline::v1::ReportStepRequest& r) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(RunningJob * job, Find(r.job_id()));
  if (!job->running()) return true;
  ASSIGN_OR_RETURN(const int position,
                   job->CheckSender(r.plan_epoch(), r.stage(), r.replica(), r.tensor_rank(), r.worker_id()));
  if (r.group_losses_size() != 0 && r.group_losses_size() != job->replica_groups()) {
    return absl::InvalidArgumentError(absl::StrCat("group_losses has ", r.group_losses_size(), " entries; ",
                                                   job->PositionLabel(position), " runs ", job->replica_groups(),
                                                   " of the spec's replicas"));
  }
  if (!r.error().empty()) {
    const std::string message = absl::StrCat(job->PositionName(position), " failed at step ", r.step(), ": ",
                                             r.error());
    const auto code = static_cast<absl::StatusCode>(r.error_code());
    const bool link_broke = code == absl::StatusCode::kUnavailable ||
                            code == absl::StatusCode::kDeadlineExceeded ||
                            code == absl::StatusCode::kCancelled;
    if (link_broke) {
      job->NoteLinkFailure(message, registry_.Now() + registry_.lease());
    } else {
      End(*job, shardline::v1::FAILED, message);
    }
    return true;
  }
  if (r.step() < 1 || r.step() > job->status().total_steps()) {
    return absl::InvalidArgumentError(absl::StrCat("step ", r.step(), " is outside 1..",
                                                   job->status().total_steps()));
  }
  if (r.step() <= job->status().step()) return false;  // a retried report
  const int64_t before = job->status().step();
  // What the worker achieves on the job's layers, for the next plans (not
  // from the step after the committed version: an epoch's first, with its
  // allocations and warm-up).
  if (r.step() > job->first_step()) {
    if (r.busy_seconds() > 0) {
      registry_.NoteAchievedRate(r.worker_id(), job->flops_per_step(position) / r.busy_seconds());
    }
    double optimizer_seconds = 0;  // the step's "optimizer" span (StageTrace)
    for (const auto& event : r.trace()) {
      if (event.name() == "optimizer") optimizer_seconds += static_cast<double>(event.duration_us()) / 1e6;
    }
    if (optimizer_seconds > 0) {
      registry_.NoteOptimizerRate(r.worker_id(), job->optimizer_parameters(position) / optimizer_seconds);
    }
    NoteWirePaces(*job, position, r);
  }
  const int64_t val_before = job->status().val_step();
  if (absl::Status s = job->AddReport(position, r); !s.ok()) {
    End(*job, shardline::v1::FAILED, std::string(s.message()));
  } else {
    const bool committed = NoteValidationVersions(*job, val_before);
    if (job->status().step() > before && step_observer_) step_observer_(job->status());
    MaybeSucceed(*job);
    if (committed) ReplanIfDue(*job);
    if (job->running() && job->status().step() > before && !MaybeGrowBack(*job)) MaybePlanReplan(*job);
  }
  return !job->running();
}

void JobManager::MaybeSucceed(RunningJob& job) {
  if (!job.running()) return;
  if (job.finished()) {
    End(job, shardline::v1::SUCCEEDED, "");
  } else if (StoppedEarly(job)) {
    End(job, shardline::v1::SUCCEEDED,
        common::EarlyStopMessage(job.spec().train().early_stopping(), job.status().val_step(),
                                 job.validation_best()));
  }
}

void JobManager::ReleaseWorkers(const RunningJob& job, bool cancel) {
  for (const std::string& worker : job.workers()) {
    if (cancel) {
      shardline::v1::Assignment stop;
      stop.set_job_id(job.status().job_id());
      stop.set_plan_epoch(job.status().plan_epoch());
      stop.set_cancel(true);
      deliver_(worker, std::move(stop));
    }
    registry_.SetJob(worker, "");
  }
}

void JobManager::Fence(RunningJob& job) {
  const std::string& id = job.status().job_id();
  weights_.DropUncommitted(id, job.status().plan_epoch() + 1);
  absl::StatusOr<WeightStore::Version> committed = weights_.CommittedVersion(id);
  if (committed.ok() && committed->step > job.status().committed_step()) job.Commit(committed->step, committed->bytes);
}

void JobManager::End(RunningJob& job, JobState state, const std::string& message) {
  // With early stopping a job succeeds with its best version, perhaps
  // before its last step (its workers are then stopped).
  const bool at_best = state == shardline::v1::SUCCEEDED && common::StopsEarly(job.spec());
  if (job.running()) ReleaseWorkers(job, /*cancel=*/state != shardline::v1::SUCCEEDED || (at_best && !job.finished()));
  if (state != shardline::v1::SUCCEEDED || at_best) Fence(job);
  job.End(state, at_best ? EndAtBest(job, message) : message, registry_.Now());
  Save(job);
  ScheduleLocked();
}

void JobManager::WorkersLost(const std::vector<WorkerRecord>& lost, const std::string& why) {
  absl::MutexLock lock(&mu_);
  for (const WorkerRecord& w : lost) FailOver(w, why);
}

void JobManager::FailOver(const WorkerRecord& w, const std::string& why) {
  for (auto& [id, job] : jobs_) {
    if (!job.running()) continue;
    const auto& workers = job.workers();
    const auto it = std::find(workers.begin(), workers.end(), w.id);
    if (it == workers.end()) continue;
    const int position = static_cast<int>(it - workers.begin());
    Requeue(job, absl::StrCat("worker ", w.name, " (", job.PositionLabel(position), ") ", why));
  }
}

absl::StatusOr<WorkerRecord> JobManager::Drain(const std::string& worker, bool undo, bool at_once,
                                               const std::string& by) {
  ASSIGN_OR_RETURN(const WorkerRecord w, registry_.SetDrained(worker, !undo));
  absl::MutexLock lock(&mu_);
  if (!undo) {
    LOG(INFO) << "worker " << w.name << " drained by " << by << (at_once ? ", its job moved at once" : "");
    if (at_once) {
      FailOver(w, absl::StrCat("was drained by ", by));
    } else {
      MoveOffAtAStep(w, absl::StrCat("was drained by ", by));
    }
  }
  ScheduleLocked();  // a waiting job may take it back, or recover without it
  return registry_.Get(w.id);
}

void JobManager::Requeue(RunningJob& job, const std::string& why) {
  LOG(WARNING) << "job " << job.status().job_id() << ": " << why << "; restarting from its committed step "
               << std::max<int64_t>(job.status().committed_step(), 0);
  // The survivors stop (their epoch is over) and are free for the new
  // placement; shards of steps the old epoch had not committed are void.
  ReleaseWorkers(job, /*cancel=*/true);
  Fence(job);
  job.Requeue(why, registry_.Now() + registry_.lease());
  Save(job);
  ScheduleLocked();
}

void JobManager::Tick() {
  for (const std::string& id : CheckJobs()) {
    absl::StatusOr<shardline::v1::DeleteJobResponse> deleted = Delete(id);
    if (!deleted.ok() && !absl::IsNotFound(deleted.status())) {
      LOG(ERROR) << "job " << id << " ended over " << ended_job_lifetime_ << " ago and could not be deleted: "
                 << deleted.status();
    }
  }
}

std::vector<std::string> JobManager::CheckJobs() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = registry_.Now();
  for (auto& [id, job] : jobs_) {
    if (!job.running() || !job.link_failure_pending()) continue;
    // A stage's link broke: a worker of the job that has stopped talking
    // for two heartbeats is taken for lost now, not a lease later.
    const std::vector<WorkerRecord> silent =
        registry_.ExpireSilent(job.workers(), 2 * common::HeartbeatInterval(registry_.lease()));
    for (const WorkerRecord& w : silent) {
      LOG(WARNING) << "worker " << w.name << " lost: its neighbours' links broke and its heartbeats stopped";
      FailOver(w, "was lost: its neighbours' links broke and its heartbeats stopped");
    }
    if (!job.running() || !job.link_failure_due(now)) continue;
    // A lease on, nobody was lost: a network fault or a stuck stage. Start
    // again from the committed step, a few times; then it is the job's.
    if (job.TakeLinkRetry()) {
      Requeue(job, absl::StrCat("a link broke and no worker was lost: ", job.pending_failure()));
    } else {
      End(job, shardline::v1::FAILED,
          absl::StrCat(job.pending_failure(), " (links broke ", RunningJob::kLinkRetries + 1,
                       " times in a row with no newer checkpoint)"));
    }
  }
  ScheduleLocked();  // a recovering job's grace may be over
  // Ended jobs past their time to be kept.
  std::vector<std::string> expired;
  if (ended_job_lifetime_ == absl::InfiniteDuration()) return expired;
  for (const std::string& id : order_) {
    const RunningJob& job = jobs_.at(id);
    const double ended_at = job.status().ended_at();
    if (job.ended() && ended_at > 0 && now - (absl::UnixEpoch() + absl::Seconds(ended_at)) >= ended_job_lifetime_) {
      expired.push_back(id);
    }
  }
  return expired;
}

absl::Status JobManager::Watch(const std::string& job_id,
                               std::shared_ptr<StreamMailbox<shardline::v1::JobStatus>> mailbox) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(RunningJob * job, Find(job_id));
  RETURN_IF_ERROR(job->Watch(std::move(mailbox)));
  return absl::OkStatus();
}

}  // namespace shardline::server
