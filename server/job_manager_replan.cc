// JobManager's re-planning on a slowdown, and growing a job that lost
// stages back onto its spec's (job_manager.h).
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/grid_cost.h"
#include "server/grid_placement.h"
#include "server/job_manager.h"
#include "server/replan_advice.h"

namespace shardline::server {

std::vector<WorkerRecord> JobManager::WatchedWorkers(const RunningJob& job) {
  std::vector<WorkerRecord> out;
  for (WorkerRecord& w : registry_.List()) {
    if (!w.lost && !w.drained && (w.job_id.empty() || w.job_id == job.status().job_id())) out.push_back(std::move(w));
  }
  return out;
}

void JobManager::MaybePlanReplan(RunningJob& job) {
  const int64_t step = job.status().step();
  const int64_t stop = ReplanStop(job);
  // A link of the job found slower than its probe counts even where the
  // epoch's steps were slow from its start (it began on that link).
  const bool steps_slowed = job.pace().slowed(), link_slowed = job.link_slowed();
  if (!auto_replan_ || job.spec().parallel().placement() == "in_order" || job.replan_step() > 0 ||
      stop + kReplanMinRemaining > job.status().total_steps() ||
      (job.replan_checked_at() > 0 && step < job.replan_checked_at() + kReplanCheckSteps)) {
    return;
  }
  // Rates are looked at every kReplanCheckSteps steps, and at each check of
  // a slowed job (a worker that got faster counts in its advice too).
  // A link found back (a job moved off it, or one it could use).
  const bool any_back = links_.recoveries() != job.link_recoveries_seen();
  const bool look = step % kReplanCheckSteps == 0 || steps_slowed || link_slowed || any_back;
  const std::vector<WorkerRecord> watched = look ? WatchedWorkers(job) : std::vector<WorkerRecord>();
  std::set<std::string> usable;  // by name
  for (const WorkerRecord& w : watched) usable.insert(w.name);
  // One another job took, or lost or drained, is weighed as newly idle
  // once it is idle again: its links may have been found back meanwhile.
  for (auto it = job.idle_seen().begin(); look && it != job.idle_seen().end();) {
    it = usable.count(*it) ? std::next(it) : job.idle_seen().erase(it);
  }
  const std::vector<std::string> back = any_back ? LinksBack(job, usable) : std::vector<std::string>();
  const bool link_back = !back.empty();
  const std::string rose = look ? job.rate_watch().Rose(step, watched) : std::string();
  const std::vector<WorkerRecord> joined = look ? NewlyIdle(job, watched) : std::vector<WorkerRecord>();
  if (!steps_slowed && !link_slowed && rose.empty() && !link_back && joined.empty()) return;
  // Moving costs a restart (state reloaded, streams reconnected): worth
  // weighing only where the time the slowdown costs the rest of the job
  // could repay it.
  const double remaining = static_cast<double>(job.status().total_steps() - stop);
  if (steps_slowed && !link_slowed && rose.empty() && !link_back && joined.empty() &&
      (job.pace().recent() - job.pace().baseline()) * remaining < kReplanMinSavingSeconds) {
    return;
  }
  const double step_seconds = std::max(job.pace().recent(), job.status().step_seconds());
  job.set_replan_checked_at(step);
  for (const WorkerRecord& w : joined) job.idle_seen().insert(w.name);
  std::map<std::string, WorkerRecord> known;  // with their planning and predicting rates
  for (WorkerRecord& w : registry_.List()) known.emplace(w.id, std::move(w));
  std::vector<WorkerRecord> grid;
  for (const std::string& id : job.workers()) {
    auto w = known.find(id);
    if (w == known.end() || w->second.lost) return;  // failover will move the job
    grid.push_back(w->second);
  }
  std::vector<int> cut;
  for (const auto& stage : job.status().stages()) {
    if (stage.replica() == 0 && stage.tensor_rank() == 0) cut.push_back(stage.unit_begin());
  }
  absl::StatusOr<ReplanAdvice> advice = AdviseReplan(job.running_spec(), grid, cut, registry_.Idle(), LinksFrom(&links_));
  if (!advice.ok()) {
    LOG(WARNING) << "job " << job.status().job_id() << ": cannot weigh a re-plan: " << advice.status();
    return;
  }
  // Why a move is weighed, for people: "its steps slowed from 0.5 s to
  // 5 s, and link a1 -> a2 carries 940 Mbit/s again (…); the running
  // layout is predicted at …".
  std::vector<std::string> reasons;
  if (steps_slowed) {
    reasons.push_back(
        absl::StrFormat("its steps slowed from %.3f s to %.3f s", job.pace().baseline(), job.pace().recent()));
  } else if (link_slowed) {
    reasons.push_back(absl::StrFormat("a link it uses slowed (%.3f s a step)", step_seconds));
  }
  if (!rose.empty()) reasons.push_back(absl::StrCat("worker ", rose));
  reasons.insert(reasons.end(), back.begin(), back.end());
  if (!joined.empty()) {
    reasons.push_back(absl::StrCat(
        joined.size() == 1 ? "worker " : "workers ",
        absl::StrJoin(joined, ", ",
                      [](std::string* out, const WorkerRecord& w) {
                        absl::StrAppendFormat(out, "%s (%.1f GFLOP/s)", w.name, PlanningFlops(w) / 1e9);
                      }),
        joined.size() == 1 ? " is idle, its links measured" : " are idle, their links measured"));
  }
  const std::string slowed = absl::StrCat(absl::StrJoin(reasons, ", and "), "; ", advice->why);
  // What the new layout would save over the rest of the job, at the pace
  // measured now.
  const double saving = step_seconds * remaining *
                        (1 - advice->proposed.step_seconds / std::max(advice->current.step_seconds, 1e-12));
  if (!advice->replan || saving < kReplanMinSavingSeconds) {
    // Steps that slowed far more than the running layout's estimate moved
    // since the plan: what slows them (a link whose pace no stream showed,
    // another tenant) is not in the model, and no move can be weighed
    // against it: said, not hidden.
    const double planned = job.status().predicted_step_seconds();
    const double steps_by = steps_slowed ? job.pace().recent() / std::max(job.pace().baseline(), 1e-12) : 0;
    const double estimate_by = planned > 0 ? advice->current.step_seconds / planned : 1;
    if (steps_by > kUnexplainedSlowdown * std::max(estimate_by, 1.0)) {
      LOG(WARNING) << "job " << job.status().job_id() << ": " << slowed << ": no layout is clearly faster; its steps "
                   << absl::StrFormat("slowed %.1fx and the running layout's estimate %.1fx since the plan", steps_by,
                                      estimate_by)
                   << ": what slows them the coordinator does not see (`shardctl describe " << job.status().job_id()
                   << "` shows who waits for whom)";
    } else {
      LOG(INFO) << "job " << job.status().job_id() << ": " << slowed << ": no layout is clearly faster";
    }
    job.NoteWeighed(absl::StrCat(slowed, ": no layout is clearly faster"));
    if (!rose.empty()) job.rate_watch().Weighed(watched);
    return;
  }
  LOG(WARNING) << "job " << job.status().job_id() << ": " << slowed << ": moving to it after step " << stop;
  StopForReplan(job, stop, slowed);
}

bool JobManager::MaybeGrowBack(RunningJob& job) {
  const int p = job.spec().parallel().pipeline_stages(), d = std::max(1, job.spec().parallel().data_parallel());
  if (!grow_back_ || (job.stages() >= p && job.replicas() >= d) || job.replan_step() > 0) return false;
  const int64_t step = job.status().step();
  if (job.replan_checked_at() > 0 && step < job.replan_checked_at() + kReplanCheckSteps) return false;
  const int64_t stop = ReplanStop(job);
  if (stop + kReplanMinRemaining > job.status().total_steps()) return false;
  // Jobs waiting for workers get the idle ones first.
  for (const auto& [id, other] : jobs_) {
    if (other.waiting()) return false;
  }
  const std::vector<WorkerRecord> idle = registry_.Idle();
  const size_t needed = static_cast<size_t>(p) * static_cast<size_t>(d * job.tensor_ranks());
  if (idle.empty() || job.workers().size() + idle.size() < needed) return false;
  job.set_replan_checked_at(step);
  // The spec's grid must fit in their memory: the worker that came back
  // may not be the one that left.
  std::vector<WorkerRecord> candidates;
  for (const std::string& id : job.workers()) {
    absl::StatusOr<WorkerRecord> w = registry_.Get(id);
    if (!w.ok() || w->lost) return false;  // failover will move the job
    candidates.push_back(*std::move(w));
  }
  candidates.insert(candidates.end(), idle.begin(), idle.end());
  absl::StatusOr<GridPlacement> placement =
      PlaceGrid(job.spec(), job.status().job_id(), stop + 1, p, candidates, {}, {}, LinksFrom(&links_));
  // What differs from the spec: "3 pipeline stages", "4 replicas", "2
  // pipeline stages × 4 replicas".
  const bool stages_differ = job.stages() != p, replicas_differ = job.replicas() != d;
  auto grid = [&](int stages, int replicas) {
    const std::string s = absl::StrCat(stages, " pipeline stages"), r = absl::StrCat(replicas, " replicas");
    if (stages_differ && replicas_differ) return absl::StrCat(s, " × ", r);
    return stages_differ ? s : r;
  };
  if (!placement.ok()) {
    LOG(INFO) << "job " << job.status().job_id() << " stays on " << grid(job.stages(), job.replicas())
              << " (the spec's " << grid(p, d) << " do not fit: " << placement.status().message() << ")";
    return false;
  }
  const std::string why = absl::StrCat(idle.size(), idle.size() == 1 ? " worker is" : " workers are",
                                       " idle: back onto the spec's ", grid(p, d), " from ",
                                       grid(job.stages(), job.replicas()));
  LOG(WARNING) << "job " << job.status().job_id() << ": " << why << ", after step " << stop;
  StopForReplan(job, stop, why);
  return true;
}

std::vector<std::string> JobManager::LinksBack(RunningJob& job, const std::set<std::string>& usable) {
  uint64_t forgotten = 0;
  const std::vector<LinkRecovery> since = links_.RecoveredSince(job.link_recoveries_seen(), &forgotten);
  job.set_link_recoveries_seen(since.empty() ? job.link_recoveries_seen() + forgotten : since.back().number);
  std::vector<std::string> out;
  uint64_t more = forgotten;  // not told one by one (forgotten: maybe usable)
  for (const LinkRecovery& r : since) {
    if (!usable.count(r.from) || !usable.count(r.to)) continue;
    if (out.size() < kLinksBackTold) {
      out.push_back(absl::StrCat("link ", r.what));
    } else {
      ++more;
    }
  }
  if (more > 0) absl::StrAppend(&out.emplace_back(), more, more == 1 ? " more link" : " more links", " found back");
  return out;
}

std::vector<WorkerRecord> JobManager::NewlyIdle(const RunningJob& job, const std::vector<WorkerRecord>& watched) {
  // Jobs waiting for workers get the idle ones first.
  for (const auto& [id, other] : jobs_) {
    if (other.waiting()) return {};
  }
  std::vector<const WorkerRecord*> ours;  // the job's workers
  for (const WorkerRecord& w : watched) {
    if (w.job_id == job.status().job_id()) ours.push_back(&w);
  }
  std::vector<WorkerRecord> out;
  for (const WorkerRecord& w : watched) {
    if (!w.job_id.empty() || job.idle_seen().count(w.name)) continue;
    // Weighed once its links with the job's workers on other hosts are
    // measured (probed, or checked beside the job: LinkTable::ClaimCheck);
    // never measured, they would be planned on assumptions.
    bool measured = true;
    for (const WorkerRecord* peer : ours) {
      if (HostOf(*peer) == HostOf(w)) continue;  // memory, not a wire: assumed
      for (const auto& [from, to] : {std::make_pair(w.name, peer->name), std::make_pair(peer->name, w.name)}) {
        const std::optional<LinkRecord> l = links_.Get(from, to);
        measured &= l.has_value() && (l->bytes_per_second > 0 || !l->error.empty());
      }
    }
    if (measured) out.push_back(w);
  }
  return out;
}

int64_t JobManager::ReplanStop(const RunningJob& job) {
  // Half a second's steps ahead, at least two: the word must reach every
  // position before it ends that step (one step late is caught up;
  // StageJob).
  const double seconds = std::max(job.pace().recent(), job.status().step_seconds());
  const int64_t lead = seconds > 0 ? static_cast<int64_t>(std::ceil(kReplanLeadSeconds / seconds)) : 0;
  return job.status().step() + std::max<int64_t>(kReplanLeadSteps, lead);
}

void JobManager::StopForReplan(RunningJob& job, int64_t stop, const std::string& why) {
  job.PlanReplan(stop, why);
  for (const std::string& worker : job.workers()) {
    shardline::v1::Assignment update;
    update.set_job_id(job.status().job_id());
    update.set_plan_epoch(job.status().plan_epoch());
    update.set_stop_after_step(stop);
    deliver_(worker, std::move(update));
  }
}

absl::StatusOr<shardline::v1::JobStatus> JobManager::Replan(const std::string& job_id, const std::string& why) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(RunningJob * job, Find(job_id));
  if (!job->running()) return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " is not running"));
  if (job->replan_step() > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is already re-planning after step ", job->replan_step()));
  }
  const int64_t stop = ReplanStop(*job);
  if (stop >= job->status().total_steps()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " ends at step ", job->status().total_steps(),
                                                      " before it could stop for a re-plan (step ", stop, ")"));
  }
  LOG(WARNING) << "job " << job_id << ": re-planning after step " << stop << " (" << why << ")";
  StopForReplan(*job, stop, why);
  return job->status();
}

void JobManager::MoveOffAtAStep(const WorkerRecord& w, const std::string& why) {
  for (auto& [id, job] : jobs_) {
    const auto& workers = job.workers();
    const auto it = std::find(workers.begin(), workers.end(), w.id);
    if (!job.running() || it == workers.end() || job.replan_step() > 0) continue;
    const std::string reason =
        absl::StrCat("worker ", w.name, " (", job.PositionLabel(static_cast<int>(it - workers.begin())), ") ", why);
    const int64_t stop = ReplanStop(job);
    if (stop >= job.status().total_steps()) {
      LOG(INFO) << "job " << id << " ends at step " << job.status().total_steps() << " before it could stop ("
                << reason << "): it ends there";
      continue;
    }
    LOG(WARNING) << "job " << id << ": " << reason << ": moving off it after step " << stop;
    StopForReplan(job, stop, reason);
  }
}

void JobManager::ReplanIfDue(RunningJob& job) {
  if (!job.running() || job.replan_step() == 0 || job.status().committed_step() < job.replan_step()) return;
  LOG(WARNING) << "job " << job.status().job_id() << ": step " << job.replan_step()
               << " is committed; re-planning from it";
  ReleaseWorkers(job, /*cancel=*/true);  // they stopped after it already
  Fence(job);
  std::vector<RunningJob::DoubtedLink> doubted = ProbeDoubtedEnds(job);  // while it still names its workers
  job.ReplanNow(registry_.Now() + registry_.lease());
  job.AwaitProbes(std::move(doubted), registry_.Now() + kReplanProbeWait);
  Save(job);
  ScheduleLocked();
}

}  // namespace shardline::server
