// JobManager is the coordinator's jobs: it takes submissions, starts a
// PENDING job (a new plan epoch) once p × d workers are idle, placing it
// with PlaceGrid (a RECOVERING one on fewer stages, once its grace is
// over and the survivors fit), and tells the workers (assignments, cancellations) and the
// registry (who is busy). Worker messages are checked against the job's
// current epoch and plan and handed to the job's record (RunningJob: state,
// step aggregation, watchers); shards go to the WeightStore. A job SUCCEEDS
// once every position finished the last step and its weights are
// committed, and FAILS (naming the stage and worker) when a stage reports an
// error or the replicas' shards diverge. A lost worker (lease lapsed, or it
// left) does not fail the job: it restarts from its committed step.
// Every job's spec and status is saved in the CoordinatorStore when it
// changes state (submitted, started, committed, ended), and job numbers and
// plan epochs come from it, so Recover() after a restart serves every
// earlier job and resumes the unfinished ones from their committed step.
// Thread-safe: one mutex over every job.
#ifndef SHARDLINE_SERVER_JOB_MANAGER_H_
#define SHARDLINE_SERVER_JOB_MANAGER_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/coordinator_store.h"
#include "server/link_table.h"
#include "server/planner.h"
#include "server/running_job.h"
#include "server/stream_mailbox.h"
#include "server/weight_store.h"
#include "server/worker_registry.h"
#include "shardline/v1/admin.pb.h"
#include "shardline/v1/coordinator.pb.h"

namespace shardline::server {

// Who asked, in messages and the log, where the Admin service cannot say
// (no tokens, no certificate).
inline constexpr char kAnOperator[] = "an operator";

class JobManager {
 public:
  // Sends an assignment (or cancellation) to a worker's watch stream.
  using Deliver = std::function<void(const std::string& worker_id, shardline::v1::Assignment)>;

  JobManager(WorkerRegistry& registry, WeightStore& weights, CoordinatorStore& store, Deliver deliver)
      : registry_(registry),
        weights_(weights),
        store_(store),
        deliver_(std::move(deliver)),
        links_([&registry] { return registry.Now(); }) {}

  // The links its workers measured, and the probes to run (on the
  // registry's clock).
  LinkTable& links() { return links_; }

  // Told of each step a job completes (every position reported it), with
  // the job's status after it; called under the manager's lock, so it must
  // not call back into the manager (metrics only). Set before serving.
  using StepObserver = std::function<void(const shardline::v1::JobStatus& status)>;
  void SetStepObserver(StepObserver observer) { step_observer_ = std::move(observer); }
  // Told of each job deleted (its id), under the manager's lock like the
  // step observer. Set before serving.
  using DeleteObserver = std::function<void(const std::string& job_id)>;
  void SetDeleteObserver(DeleteObserver observer) { delete_observer_ = std::move(observer); }
  // Whether a job whose steps slow down for long moves to a faster layout
  // by itself (default; coordinator flag --replan_on_slowdown). ReplanJob
  // works either way. Set before serving.
  void SetAutoReplan(bool on) { auto_replan_ = on; }
  // Whether a job re-planned onto fewer pipeline stages after a loss moves
  // back onto its spec's stages once enough workers are idle (default;
  // coordinator flag --grow_back). Set before serving.
  void SetGrowBack(bool on) { grow_back_ = on; }

  // Loads the saved jobs (once, before serving): ended ones as they ended,
  // the others RECOVERING, to run from their committed step at a new epoch
  // once enough workers have (re-)registered (after two leases, on fewer
  // stages if that is what came back).
  absl::Status Recover();

  // INVALID_ARGUMENT for a spec that fails validation (naming the field).
  absl::StatusOr<shardline::v1::JobStatus> Submit(shardline::v1::JobSpec spec, const std::string& by = kAnOperator);
  // Submit, the job starting from the weights file at `path` (ShardDigest
  // `digest`, written at `step` of whatever trained it), moved into the
  // store as its version of step 0 (WeightStore::AdoptWeights' errors);
  // INVALID_ARGUMENT for a spec with init.from_job too.
  absl::StatusOr<shardline::v1::JobStatus> SubmitWithWeights(shardline::v1::JobSpec spec, const std::string& by,
                                                             const std::string& path, uint64_t digest, int64_t step);
  absl::StatusOr<shardline::v1::JobStatus> Get(const std::string& job_id);
  absl::StatusOr<shardline::v1::JobSpec> Spec(const std::string& job_id);
  std::vector<shardline::v1::JobStatus> List();
  // What the job's positions did in their recent steps in [first, last]
  // (0: no bound); NOT_FOUND for no such job.
  absl::StatusOr<shardline::v1::GetTraceResponse> Trace(const std::string& job_id, int64_t first, int64_t last);
  // FAILED_PRECONDITION for a job that has already ended. `by`: who asked
  // (its message: "cancelled by ops"), as for Delete and Drain.
  absl::StatusOr<shardline::v1::JobStatus> Cancel(const std::string& job_id, const std::string& by = kAnOperator);
  // Forgets an ended job: its checkpoint (WeightStore::DeleteJob, first:
  // a coordinator killed midway still lists the job, and deleting it again
  // finishes), then its record, its trace and (the delete observer) its
  // metrics. FAILED_PRECONDITION for a job that has not ended.
  absl::StatusOr<shardline::v1::DeleteJobResponse> Delete(const std::string& job_id,
                                                         const std::string& by = kAnOperator);
  // The plan the spec would get on the idle workers now.
  absl::StatusOr<shardline::v1::PlanResponse> Plan(shardline::v1::JobSpec spec);
  // Which worker runs which stage of a job (names, for messages).
  absl::StatusOr<std::vector<std::string>> StageWorkers(const std::string& job_id);

  // Worker reports. NOT_FOUND: unknown job; FAILED_PRECONDITION: stale epoch
  // or a worker that does not hold that stage; INVALID_ARGUMENT: malformed.
  // Returns true when the worker should stop (the job is no longer running).
  absl::StatusOr<bool> ReportStep(const shardline::v1::ReportStepRequest& report);
  // A shard's upload stream (CoordinatorService's ShardReader): BeginShard
  // checks the sender and opens the upload where earlier streams left it;
  // CheckShard, called as chunks arrive, ends a stream whose epoch went
  // stale; CompleteShard checks the file (length, digest), stores it and
  // returns true when it committed its step. Only the checks take the
  // jobs' lock: writing, fsync and the move into place do not.
  absl::StatusOr<std::unique_ptr<ShardUploads::Writer>> BeginShard(const shardline::v1::ShardHeader& header);
  absl::Status CheckShard(const shardline::v1::ShardHeader& header);
  absl::StatusOr<bool> CompleteShard(const shardline::v1::ShardHeader& header, ShardUploads::Writer& writer);
  // The three in one, for a whole shard in memory (tests); its length and
  // digest are filled in.
  absl::StatusOr<bool> ReportShard(shardline::v1::ShardHeader header, const std::string& bytes);
  // The committed state a position (re)starting after step 1 loads: its
  // tensors by name with their optimizer state (WeightStore::FetchTensors),
  // read outside the jobs' lock.
  absl::StatusOr<common::SafetensorsContents> FetchState(const shardline::v1::FetchStateRequest& request);

  // Workers gone (`why`: "was lost: no heartbeat within its lease", "left:
  // it is shutting down"): each job they ran fails over (Requeue).
  void WorkersLost(const std::vector<WorkerRecord>& lost,
                   const std::string& why = "was lost: no heartbeat within its lease");
  // An operator takes a worker (name or id) out of service: it gets no job
  // until undone, and the job it runs is told to stop a little ahead, at a
  // checkpoint, and moves off it once that step is committed (as Replan;
  // nothing replayed), or with `at_once` fails over at once (from the
  // committed step). Its record; NOT_FOUND for no such live worker.
  absl::StatusOr<WorkerRecord> Drain(const std::string& worker, bool undo, bool at_once = false,
                                     const std::string& by = kAnOperator);
  // An operator's re-plan: the job stops a little ahead (half a second's
  // steps), checkpoints, and moves to the best layout on what is known
  // now from there (a restart at a new epoch; no step lost), whether or
  // not it differs. FAILED_PRECONDITION for a job not running, already
  // re-planning, or ending before it could stop.
  absl::StatusOr<shardline::v1::JobStatus> Replan(const std::string& job_id, const std::string& why);
  // Fails jobs whose stages reported a broken link and whose lost worker, if
  // any, has not been identified within a lease, places waiting jobs
  // whose grace is over, and deletes jobs that ended longer ago than the
  // ended-job lifetime (called by the lease reaper).
  void Tick();
  // How long an ended job is kept before Tick deletes it (Delete: record,
  // checkpoint, trace, metrics); infinite (the default): until an operator
  // deletes it (coordinator flag --delete_ended_jobs_after). Set before
  // serving.
  void SetEndedJobLifetime(absl::Duration lifetime) { ended_job_lifetime_ = lifetime; }
  // Plans and assigns pending jobs that now have enough idle workers.
  void Schedule();
  // The longest a re-planning job waits for the probes of a slowed link's
  // ends (ProbeDoubtedEnds, below).
  static constexpr absl::Duration kReplanProbeWait = absl::Seconds(30);
  // Streams to `mailbox` the job's status as each of its last kRecentSteps
  // completed steps ended (so that a watcher subscribing after a job started
  // still sees every recent step), then its status now and after every change.
  static constexpr size_t kRecentSteps = RunningJob::kRecentSteps;
  absl::Status Watch(const std::string& job_id,
                     std::shared_ptr<StreamMailbox<shardline::v1::JobStatus>> mailbox);

 private:
  StepObserver step_observer_;
  DeleteObserver delete_observer_;
  bool auto_replan_ = true;
  bool grow_back_ = true;
  absl::Duration ended_job_lifetime_ = absl::InfiniteDuration();
  // Tick's work that takes the jobs' lock; returns the ids of the jobs
  // to delete after it.
  std::vector<std::string> CheckJobs();
  absl::StatusOr<RunningJob*> Find(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the job; a running one's workers are told to stop (unless it
  // succeeded) and become idle; waiting jobs may start on them.
  void End(RunningJob& job, shardline::v1::JobState state, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeSucceed(RunningJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Early stopping (train.early_stopping, job_manager_best.cc): what
  // becomes of the versions of the validation steps after `val_before`
  // (the job's best is kept, the others go; returns whether a version that
  // waited for their passes committed), whether the patience ran out
  // with the best version kept (the job then ends), and the job's last
  // version made its best as it ends (returns its end message).
  bool NoteValidationVersions(RunningJob& job, int64_t val_before) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StoppedEarly(const RunningJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string EndAtBest(RunningJob& job, const std::string& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A running job's workers become idle; with `cancel` they are told to stop.
  void ReleaseWorkers(const RunningJob& job, bool cancel) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Failover: the job's workers are told to stop and freed, its uncommitted
  // shards dropped, and the job is RECOVERING, to restart at a new epoch
  // from its committed step on whichever workers are idle (the survivors
  // and any standby; after a lease without enough, on fewer stages).
  void Requeue(RunningJob& job, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The running job of worker `w`, if any, fails over (Requeue), naming
  // the worker and its position: "worker NAME (stage S) <why>".
  void FailOver(const WorkerRecord& w, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's epoch is over: shards of it and earlier ones are refused from
  // now on, and its committed step is the WeightStore's.
  void Fence(RunningJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-planning on a slowdown (job_manager_replan.cc): after each completed
  // step, a job whose steps have slowed for long (StepPace) is checked
  // (every kReplanCheckSteps steps) against the best layout on what is
  // known now (AdviseReplan); where one is clearly faster and saves
  // seconds over the rest of the job, its positions
  // are told to stop after a step a little ahead (Assignment
  // .stop_after_step, with a checkpoint there), and once that step is
  // committed (ReplanIfDue, from CompleteShard) it restarts on the new
  // layout at a new epoch: no step is lost. Jobs with placement "in_order"
  // keep their layout.
  static constexpr int kReplanCheckSteps = 5;
  // The stop step: this many steps past the last completed one, and at
  // least kReplanLeadSeconds of steps.
  static constexpr int kReplanLeadSteps = 2;
  static constexpr double kReplanLeadSeconds = 0.5;
  static constexpr int kReplanMinRemaining = 10;   // steps after the stop that make a move worth it
  // And seconds a move must save over the rest of the job (the slowdown's
  // cost so far to weigh one, the new layout's predicted gain to make it).
  static constexpr double kReplanMinSavingSeconds = 5.0;
  // Steps that slowed this many times more than the running layout's
  // estimate moved since the plan are logged as a slowdown the cost model
  // does not explain.
  static constexpr double kUnexplainedSlowdown = 3.0;
  // The same check, every kReplanCheckSteps steps, once a worker of the
  // job or an idle one got clearly faster during the epoch (RateWatch: its
  // machine was busy a while and is not now; after a check
  // that finds no move, again only once a rate rose further), once a link
  // it could use was found back (LinksBack), and once a worker the epoch
  // did not see idle, or saw idle before another job took it, is, its
  // links with the job's workers measured (it joined the cluster, or
  // another job let it go).
  static constexpr size_t kLinksBackTold = 3;
  void MaybePlanReplan(RunningJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live workers in service a re-plan of `job` could use: its own and
  // the idle ones.
  std::vector<WorkerRecord> WatchedWorkers(const RunningJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The links found back since `job` last looked (RunningJob::
  // link_recoveries_seen, moved past them) that a re-plan of it could use:
  // both ends in `usable` (the names of WatchedWorkers), for people,
  // kLinksBackTold of them at most (the rest counted). Another job's
  // workers' are not its (that job weighs them; once one is let go it is
  // newly idle, below).
  std::vector<std::string> LinksBack(RunningJob& job, const std::set<std::string>& usable)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Of `watched` (WatchedWorkers), the idle ones `job` has not seen idle
  // (RunningJob::idle_seen) whose links with its workers are measured;
  // none while a job waits for workers (it gets them first).
  std::vector<WorkerRecord> NewlyIdle(const RunningJob& job, const std::vector<WorkerRecord>& watched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Growing back (job_manager_replan.cc): after each completed step, a job
  // running on fewer pipeline stages than its spec's (it lost workers and
  // no standby came) is told to stop a little ahead, checkpointed, as for
  // a slowdown, once the idle workers and its own could hold the spec's
  // grid (checked every kReplanCheckSteps steps) and no other job waits
  // for workers; it then restarts on the spec's stages at a new epoch, no
  // step lost. True if it was told to.
  bool MaybeGrowBack(RunningJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What `position`'s report says of the wires it receives on: a link that
  // slowed during the epoch goes into the link table (LinkTable::Observe),
  // so that the re-plan's advice sees it.
  void NoteWirePaces(RunningJob& job, int position, const shardline::v1::ReportStepRequest& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t ReplanStop(const RunningJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the job's positions to stop after `stop`; it moves once committed.
  void StopForReplan(RunningJob& job, int64_t stop, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReplanIfDue(RunningJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once its workers stopped for a re-plan: for each link the job saw slow
  // whose ends are not suspected (LinkTable: which end is slow nothing
  // told), probes of the sender's link to a third worker and of a third
  // worker's to the receiver are queued, for the job to wait for (at most
  // kReplanProbeWait): the slow end's shows slow, and the table suspects
  // it before the new layout is chosen (else a move may keep the slow end
  // and find it slow on its next link, an epoch lost). Those links, with
  // the probes queued for each.
  std::vector<RunningJob::DoubtedLink> ProbeDoubtedEnds(const RunningJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `job` still waits for probes (it is told which): until every
  // doubted link has an end suspected or all its probes in, or the wait
  // is over.
  bool AwaitingProbes(RunningJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The running job of worker `w`, if any, is told to stop a little ahead
  // and moves without it once that step is committed (StopForReplan; the
  // worker must no longer be idle-able: drained). A job already stopping
  // for a re-plan moves then; one ending before it could stop ends on it.
  void MoveOffAtAStep(const WorkerRecord& w, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Saves the job's record; a failure is logged (the job goes on).
  // Takes a job number; `seed` (if any) gives the job's version of step 0
  // and returns the step it comes from (JobStatus.init_step; `init_from`
  // names where); then the job is saved and scheduled.
  absl::StatusOr<shardline::v1::JobStatus> SubmitSeeded(
      shardline::v1::JobSpec spec, const std::string& by, const std::string& init_from,
      const std::function<absl::StatusOr<int64_t>(const std::string& id)>& seed) ABSL_LOCKS_EXCLUDED(mu_);
  // At Recover: a checkpoint of step 0 that no job owns is removed (the
  // starting weights of a submission cut short); another is left, with a
  // warning.
  void ForgetUnownedCheckpoints() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // JobSpec.init.from_job names a job of this coordinator with the same
  // model (NOT_FOUND, FAILED_PRECONDITION naming both models).
  absl::Status CheckInitSource(const shardline::v1::JobSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Save(const RunningJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  WorkerRegistry& registry_;
  WeightStore& weights_;
  CoordinatorStore& store_;
  const Deliver deliver_;
  LinkTable links_;
  absl::Mutex mu_;
  std::map<std::string, RunningJob> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // submission order
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_JOB_MANAGER_H_
