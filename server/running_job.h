// RunningJob is one job's record at the coordinator: its spec, status and
// state (PENDING → RUNNING at a plan epoch → SUCCEEDED / FAILED /
// CANCELLED; RUNNING → RECOVERING → RUNNING at a new epoch after a loss or
// a coordinator restart), the grid it runs on, its positions' step reports until every
// position has reported a step (then the step completes: its loss is the
// replicas' last-stage losses added in rank order; at a checkpoint the
// replicas' shard digests must agree), the watchers of its status and the
// statuses of its last completed steps. Telling workers and the registry
// is JobManager's; this only keeps the record. Not thread-safe (the
// JobManager's mutex guards every job).
#ifndef SHARDLINE_SERVER_RUNNING_JOB_H_
#define SHARDLINE_SERVER_RUNNING_JOB_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/random_token.h"
#include "common/validation_best.h"
#include "server/grid_placement.h"
#include "server/job_trace.h"
#include "server/link_pace.h"
#include "server/rate_watch.h"
#include "server/step_pace.h"
#include "server/stream_mailbox.h"
#include "shardline/v1/admin.pb.h"
#include "shardline/v1/coordinator.pb.h"
#include "shardline/v1/job.pb.h"

namespace shardline::server {

class RunningJob {
 public:
  // Watchers get the statuses of this many last completed steps first.
  static constexpr size_t kRecentSteps = 256;

  // PENDING, submitted at `submitted` by `by`.
  RunningJob(const std::string& id, shardline::v1::JobSpec spec, absl::Time submitted, const std::string& by);
  // As saved (CoordinatorStore): an ended job as it ended; one that had
  // not ended RECOVERING, to resume from its committed step.
  RunningJob(shardline::v1::JobSpec spec, shardline::v1::JobStatus saved);

  const shardline::v1::JobSpec& spec() const { return spec_; }
  const shardline::v1::JobStatus& status() const { return status_; }
  bool running() const { return status_.state() == shardline::v1::RUNNING; }
  bool ended() const;
  // PENDING or RECOVERING: to be placed.
  bool waiting() const;
  // Worker ids by position ((replica · p + stage) · t + tensor rank) while it runs.
  const std::vector<std::string>& workers() const { return workers_; }
  // The plan's forward and backward FLOPs of `position` in a step.
  double flops_per_step(int position) const { return flops_per_step_[static_cast<size_t>(position)]; }
  double optimizer_parameters(int position) const { return optimizer_parameters_[static_cast<size_t>(position)]; }
  int stages() const { return stages_; }
  int replicas() const { return replicas_; }  // the plan's: fewer than the spec's where it shrank
  // How many of the spec's replicas each of the plan's stands for
  // (Assignment.replica_groups): 1 unless it shrank to fewer replicas.
  // The spec as the plan runs it: its stages, and its replicas folded
  // (common::FoldReplicas), as the assignments carry it.
  shardline::v1::JobSpec running_spec() const;
  int replica_groups() const { return std::max(1, spec_.parallel().data_parallel()) / std::max(1, replicas_); }
  int tensor_ranks() const { return tensor_ranks_; }
  struct Position {
    int stage = 0;
    int replica = 0;
    int tensor_rank = 0;
  };
  Position PositionAt(int position) const {
    const int t = tensor_ranks_, p = stages_;
    return {(position / t) % p, position / (t * p), position % t};
  }
  int PositionOf(int stage, int replica, int tensor_rank) const {
    return (replica * stages_ + stage) * tensor_ranks_ + tensor_rank;
  }

  // Still waiting, for `why` (watchers hear of a change only).
  void Wait(const std::string& why);
  // RUNNING at `epoch` on `placement` from `now` (the job's start time,
  // the first time).
  void Start(uint64_t epoch, GridPlacement placement, absl::Time now);
  // The step a (re)start runs first: one after the committed version.
  int64_t first_step() const { return std::max<int64_t>(status_.committed_step(), 0) + 1; }
  // A running job lost a position (`why` names the worker): RECOVERING,
  // to restart at a new epoch from the committed step (first_step()), on
  // fewer pipeline stages from `shrink_after` on if that many workers are
  // not idle by then.
  void Requeue(const std::string& why, absl::Time shrink_after);
  // Why a RECOVERING job restarts.
  const std::string& resume_reason() const { return resume_reason_; }
  // The job's link token (128 random bits, made with the record: a
  // coordinator restart makes a new one), in every assignment of every
  // plan: workers' hellos and twins' fetches carry it. Per job, not per
  // plan, so that a survivor knows it before its new assignment arrives
  // (a twin may ask it for its snapshot first). Never persisted or shown.
  const std::string& link_token() const { return link_token_; }
  // The names of the workers that held each position before it stopped
  // (none for a fresh job): a restart keeps them there where it can.
  const std::vector<std::string>& previous_workers() const { return previous_workers_; }
  // And the cut they held (each stage's first unit).
  const std::vector<int>& previous_cut() const { return previous_cut_; }
  // Re-planning on a slowdown (JobManager): the positions run up to
  // `step`, checkpoint it and stop; once it is committed the job moves to
  // a new plan (ReplanNow), chosen afresh. `why` says what slowed.
  void PlanReplan(int64_t step, const std::string& why);
  int64_t replan_step() const { return replan_step_; }  // 0: none planned
  // RECOVERING for the planned re-plan, its previous placement forgotten
  // (the new one is searched afresh, on the rates measured now).
  void ReplanNow(absl::Time shrink_after);
  // Before the re-plan's new layout is chosen, the links it saw slow whose
  // ends are in doubt, each with the probes that tell which end is slow
  // ((from, to) by worker name; JobManager queued them): the job waits for
  // them until `until`.
  using Probe = std::pair<std::string, std::string>;
  struct DoubtedLink {
    Probe link;
    std::vector<Probe> probes;
  };
  void AwaitProbes(std::vector<DoubtedLink> doubted, absl::Time until) {
    doubted_ = std::move(doubted);
    probes_until_ = until;
  }
  const std::vector<DoubtedLink>& doubted_links() const { return doubted_; }
  absl::Time probes_until() const { return probes_until_; }
  void ClearDoubtedLinks() { doubted_.clear(); }
  // The epoch's step times (CompleteStep notes each).
  const StepPace& pace() const { return pace_; }
  // Its workers' and the idle ones' rates during the epoch (JobManager
  // starts it with the epoch).
  RateWatch& rate_watch() { return rate_watch_; }
  // The epoch's links, as their receiving ends report them (JobManager).
  LinkPaces& link_paces() { return link_paces_; }
  // A link of the epoch was found slower than before (JobManager).
  bool link_slowed() const { return link_slowed_; }
  void set_link_slowed(bool slowed) { link_slowed_ = slowed; }
  // The idle workers the epoch began with or has weighed a move onto (by
  // name; JobManager), while they stay idle: one idle and not among them
  // joined the cluster, or another job let it go.
  std::set<std::string>& idle_seen() { return idle_seen_; }
  const std::set<std::string>& idle_seen() const { return idle_seen_; }
  // LinkTable::recoveries() when the job last looked at the links found
  // back (or the epoch began): one since that it could use, and a move
  // back onto it is weighed.
  uint64_t link_recoveries_seen() const { return link_recoveries_seen_; }
  void set_link_recoveries_seen(uint64_t n) { link_recoveries_seen_ = n; }
  // A move was weighed at the last step and not made, for `why`
  // (JobStatus.weighed; cleared as an epoch starts).
  void NoteWeighed(const std::string& why);
  // The step of the epoch's last re-plan check (JobManager throttles them).
  int64_t replan_checked_at() const { return replan_checked_at_; }
  void set_replan_checked_at(int64_t step) { replan_checked_at_ = step; }
  // From when a RECOVERING job may restart on fewer stages than its spec's
  // (never for a fresh job). A restored one gets `at`.
  absl::Time shrink_after() const { return shrink_after_; }
  void AllowShrinkAt(absl::Time at) { shrink_after_ = at; }
  // The job's new state, ended at `now`; no further change once it has ended.
  void End(shardline::v1::JobState state, const std::string& message, absl::Time now);
  // A job saved by a coordinator that kept no times: `now` as when it was
  // submitted and, if it has ended, ended. True if it lacked them.
  bool FillMissingTimes(absl::Time now);

  // The position of (stage, replica, tensor rank), if `worker_id` (any,
  // when empty) holds it at `epoch`: FAILED_PRECONDITION for a stale epoch
  // or another worker, INVALID_ARGUMENT for a stage, replica or tensor rank
  // the job lacks.
  absl::StatusOr<int> CheckSender(uint64_t epoch, int stage, int replica, int tensor_rank,
                                  const std::string& worker_id) const;
  // "stage 1", "stage 1 of replica 2", "stage 1 of replica 2, tensor rank
  // 1" (the parts the grid has), without and with its worker.
  std::string PositionLabel(int position) const;
  std::string PositionName(int position) const;

  // Keeps a step report of `position` (one of a step already complete is
  // a retry, ignored) and completes the step once every position reported
  // it. FAILED_PRECONDITION, naming the stage, when the replicas' shard
  // digests disagree at a checkpoint (the job should fail).
  absl::Status AddReport(int position, const shardline::v1::ReportStepRequest& report);
  // The weights of `step` are committed, in files of `bytes` bytes.
  void Commit(int64_t step, int64_t bytes);
  // It starts from the weights of job `from` at its step `step` (JobSpec.init).
  void SetInit(const std::string& from, int64_t step) {
    status_.set_init_from(from);
    status_.set_init_step(step);
  }
  // What the positions did in their recent steps (AddReport keeps it).
  const JobTrace& trace() const { return trace_; }
  // Every step run and the last one's weights committed.
  bool finished() const;
  // Its best validation pass so far (JobStatus.best_val_*).
  common::ValidationBest validation_best() const { return common::BestOf(status_); }

  // A stage lost its link (usually a neighbour died): the failure to report
  // if no lost worker is named before `deadline`. Only the first counts.
  void NoteLinkFailure(const std::string& message, absl::Time deadline);
  bool link_failure_pending() const { return !pending_failure_.empty(); }
  bool link_failure_due(absl::Time now) const { return !pending_failure_.empty() && now >= failure_deadline_; }
  const std::string& pending_failure() const { return pending_failure_; }
  // A broken link with nobody lost is retried from the committed step up to
  // kLinkRetries times in a row without a newer commit; true while allowed
  // (and counts this one).
  static constexpr int kLinkRetries = 3;
  bool TakeLinkRetry();

  // Streams to `mailbox` the recent steps' statuses, the status now and,
  // unless the job has ended, every later one.
  // RESOURCE_EXHAUSTED while kMaxWatchers streams watch the job.
  absl::Status Watch(std::shared_ptr<StreamMailbox<shardline::v1::JobStatus>> mailbox);
  static constexpr size_t kMaxWatchers = 64;

 private:
  // FAILED_PRECONDITION where the job cannot go on (NoteValidation).
  absl::Status CompleteStep(int64_t step);
  // The validation pass after `step` from the replicas' last-stage reports;
  // FAILED_PRECONDITION for one that cannot be added up in a job that
  // stops early (logged and left out otherwise).
  absl::Status NoteValidation(int64_t step);
  void Publish();

  shardline::v1::JobSpec spec_;
  shardline::v1::JobStatus status_;
  int stages_ = 0;    // p
  int replicas_ = 1;  // d
  int tensor_ranks_ = 1;  // t
  std::vector<std::string> workers_;
  std::vector<double> flops_per_step_;        // by position
  std::vector<double> optimizer_parameters_;  // by position
  // Per position, its reports of the steps not yet complete everywhere.
  std::vector<std::map<int64_t, shardline::v1::ReportStepRequest>> reports_;
  std::vector<std::shared_ptr<StreamMailbox<shardline::v1::JobStatus>>> watchers_;
  std::deque<shardline::v1::JobStatus> recent_steps_;  // as each of the last steps ended
  JobTrace trace_;
  std::string pending_failure_;
  absl::Time failure_deadline_;
  int link_retries_ = 0;            // in a row, since the committed step below
  int64_t link_retries_since_ = -1;
  std::string resume_reason_;
  const std::string link_token_ = common::RandomToken();
  std::vector<std::string> previous_workers_;
  std::vector<int> previous_cut_;
  void RememberPlacement();  // previous_workers_ and previous_cut_ from the stages now
  StepPace pace_;
  RateWatch rate_watch_;
  LinkPaces link_paces_;
  bool link_slowed_ = false;
  uint64_t link_recoveries_seen_ = 0;
  std::set<std::string> idle_seen_;
  int64_t replan_step_ = 0;
  int64_t replan_checked_at_ = 0;
  std::string replan_reason_;
  bool replanned_ = false;  // the epoch starting next comes from a re-plan
  std::vector<DoubtedLink> doubted_;
  absl::Time probes_until_;
  absl::Time shrink_after_ = absl::InfiniteFuture();
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_RUNNING_JOB_H_
