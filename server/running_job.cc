#include "server/running_job.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/eval_shares.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "common/validation_best.h"
#include "glog/logging.h"

namespace shardline::server {

namespace {

double UnixSeconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

}  // namespace

RunningJob::RunningJob(const std::string& id, shardline::v1::JobSpec spec, absl::Time submitted,
                       const std::string& by)
    : spec_(std::move(spec)) {
  status_.set_job_id(id);
  status_.set_submitted_at(UnixSeconds(submitted));
  status_.set_submitted_by(by);
  status_.set_name(spec_.name());
  status_.set_state(shardline::v1::PENDING);
  status_.set_total_steps(spec_.train().steps());
  status_.set_committed_step(-1);
}

RunningJob::RunningJob(shardline::v1::JobSpec spec, shardline::v1::JobStatus saved)
    : spec_(std::move(spec)), status_(std::move(saved)) {
  if (ended()) return;
  const int64_t committed = std::max<int64_t>(status_.committed_step(), 0);
  status_.set_state(shardline::v1::RECOVERING);
  status_.set_step(committed);
  RememberPlacement();
  status_.clear_stages();
  resume_reason_ = "after a coordinator restart";
  status_.set_message(absl::StrCat("resuming ", resume_reason_, " from its committed step ", committed));
}

void RunningJob::Requeue(const std::string& why, absl::Time shrink_after) {
  status_.set_state(shardline::v1::RECOVERING);
  shrink_after_ = shrink_after;
  status_.set_step(std::max<int64_t>(status_.committed_step(), 0));
  RememberPlacement();
  status_.clear_stages();
  workers_.clear();
  reports_.clear();
  pending_failure_.clear();
  resume_reason_ = why;
  status_.set_message(absl::StrCat("recovering (", why, "): resuming at step ", first_step()));
  Publish();
}

void RunningJob::PlanReplan(int64_t step, const std::string& why) {
  replan_step_ = step;
  replan_reason_ = why;
  status_.set_message(absl::StrCat("re-planning after step ", step, ": ", why));
  Publish();
}

void RunningJob::ReplanNow(absl::Time shrink_after) {
  const std::string why = absl::StrCat("re-planning after step ", replan_step_, ": ", replan_reason_);
  Requeue(why, shrink_after);
  previous_workers_.clear();
  previous_cut_.clear();
  replanned_ = true;
}

void RunningJob::RememberPlacement() {
  previous_workers_.clear();
  previous_cut_.clear();
  for (const auto& stage : status_.stages()) {
    previous_workers_.push_back(stage.worker());
    if (stage.replica() == 0) previous_cut_.push_back(stage.unit_begin());
  }
}

shardline::v1::JobSpec RunningJob::running_spec() const {
  shardline::v1::JobSpec spec = common::FoldReplicas(spec_, replicas_);
  spec.mutable_parallel()->set_pipeline_stages(stages_);
  return spec;
}

bool RunningJob::ended() const {
  const shardline::v1::JobState s = status_.state();
  return s == shardline::v1::SUCCEEDED || s == shardline::v1::FAILED || s == shardline::v1::CANCELLED;
}

bool RunningJob::waiting() const {
  return status_.state() == shardline::v1::PENDING || status_.state() == shardline::v1::RECOVERING;
}

void RunningJob::Wait(const std::string& why) {
  if (status_.message() == why) return;
  status_.set_message(why);
  Publish();
}

bool RunningJob::FillMissingTimes(absl::Time now) {
  const bool missing = status_.submitted_at() == 0 || (ended() && status_.ended_at() == 0);
  if (status_.submitted_at() == 0) status_.set_submitted_at(UnixSeconds(now));
  if (ended() && status_.ended_at() == 0) status_.set_ended_at(UnixSeconds(now));
  return missing;
}

void RunningJob::Start(uint64_t epoch, GridPlacement placement, absl::Time now) {
  status_.set_state(shardline::v1::RUNNING);
  if (status_.started_at() == 0) status_.set_started_at(UnixSeconds(now));
  status_.set_plan_epoch(epoch);
  const int asked = spec_.parallel().pipeline_stages();
  const int asked_replicas = std::max(1, spec_.parallel().data_parallel());
  std::string onto;
  if (placement.replicas < asked_replicas) {
    absl::StrAppend(&onto, placement.replicas, " of the spec's ", asked_replicas,
                    " replicas, each running the micro-batches of ", asked_replicas / placement.replicas, ",");
  }
  if (placement.stages < asked) {
    absl::StrAppend(&onto, onto.empty() ? "" : " on ", placement.stages, " of the spec's ", asked,
                    " pipeline stages");
  }
  status_.set_message(!onto.empty()
                          ? absl::StrCat("re-planned onto ", onto, " from step ", first_step(), " (", resume_reason_, ")")
                      : replanned_ ? absl::StrCat("re-planned from step ", first_step(), " (", replan_reason_, ")")
                                   : "");
  replanned_ = false;
  replan_step_ = 0;
  replan_checked_at_ = 0;
  pace_.Reset();
  link_paces_.Reset();
  link_slowed_ = false;
  status_.clear_stages();
  for (shardline::v1::StageStatus& stage : placement.stage_statuses) *status_.add_stages() = std::move(stage);
  status_.set_predicted_step_seconds(placement.predicted_step_seconds);
  status_.set_critical_path(placement.critical_path);
  status_.clear_weighed();
  stages_ = placement.stages;
  replicas_ = placement.replicas;
  tensor_ranks_ = placement.tensor_ranks;
  workers_ = std::move(placement.workers);
  flops_per_step_ = std::move(placement.flops_per_step);
  flops_per_step_.resize(workers_.size());
  optimizer_parameters_ = std::move(placement.optimizer_parameters);
  optimizer_parameters_.resize(workers_.size());
  reports_.assign(workers_.size(), {});
  pending_failure_.clear();
  Publish();
}

void RunningJob::NoteWeighed(const std::string& why) {
  status_.set_weighed(absl::StrCat("at step ", status_.step(), ": ", why));  // published with the next step
}

void RunningJob::End(shardline::v1::JobState state, const std::string& message, absl::Time now) {
  if (ended()) return;
  status_.set_state(state);
  status_.set_message(message);
  status_.set_ended_at(UnixSeconds(now));
  Publish();
}

absl::StatusOr<int> RunningJob::CheckSender(uint64_t epoch, int stage, int replica, int tensor_rank,
                                            const std::string& worker_id) const {
  if (epoch != status_.plan_epoch()) {
    return absl::FailedPreconditionError(absl::StrCat("plan epoch ", epoch, " is stale; job ", status_.job_id(),
                                                      " is at epoch ", status_.plan_epoch()));
  }
  if (stage < 0 || stage >= stages_) {
    return absl::InvalidArgumentError(absl::StrCat("job ", status_.job_id(), " has no stage ", stage));
  }
  if (replica < 0 || replica >= replicas_) {
    return absl::InvalidArgumentError(absl::StrCat("job ", status_.job_id(), " has no replica ", replica));
  }
  if (tensor_rank < 0 || tensor_rank >= tensor_ranks_) {
    return absl::InvalidArgumentError(absl::StrCat("job ", status_.job_id(), " has no tensor rank ", tensor_rank));
  }
  const int position = PositionOf(stage, replica, tensor_rank);
  if (!worker_id.empty() && workers_[position] != worker_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_id, " does not hold ", PositionLabel(position), " of ", status_.job_id()));
  }
  return position;
}

std::string RunningJob::PositionLabel(int position) const {
  const Position at = PositionAt(position);
  std::string label = absl::StrCat("stage ", at.stage);
  if (replicas_ > 1) absl::StrAppend(&label, " of replica ", at.replica);
  if (tensor_ranks_ > 1) absl::StrAppend(&label, replicas_ > 1 ? "," : " of", " tensor rank ", at.tensor_rank);
  return label;
}

std::string RunningJob::PositionName(int position) const {
  return absl::StrCat(PositionLabel(position), " (worker ", status_.stages(position).worker(), ")");
}

absl::Status RunningJob::AddReport(int position, const shardline::v1::ReportStepRequest& report) {
  const int64_t step = report.step();
  if (step <= status_.step()) return absl::OkStatus();  // a retried report
  if (!reports_[position].count(step)) {
    const Position at = PositionAt(position);
    trace_.Add(at.stage, at.replica, at.tensor_rank, status_.stages(position).worker(), status_.plan_epoch(), step,
               report.trace());
  }
  auto held = reports_[position].find(step);
  if (held == reports_[position].end()) {
    reports_[position][step] = report;
  } else if (report.shard_digest() != 0) {
    // Sent again with its checkpoint's digest (a stop the worker heard of
    // after the step's end: StageJob's re-plan).
    held->second.set_shard_digest(report.shard_digest());
  }
  for (const auto& reports : reports_) {
    if (!reports.count(step)) return absl::OkStatus();
  }
  // Every position of a stage holds the same shard at a checkpoint (its
  // replicas' are copies; its tensor ranks put their slices together).
  // A position without a digest had not heard of a re-plan's stop yet:
  // its digest comes again with the checkpoint, maybe after the step.
  for (int position = 0; position < static_cast<int>(reports_.size()); ++position) {
    const Position at = PositionAt(position);
    const uint64_t want = reports_[PositionOf(at.stage, 0, 0)].at(step).shard_digest();
    const uint64_t got = reports_[position].at(step).shard_digest();
    if (got != want && got != 0 && want != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the replicas of stage ", at.stage, " diverged at step ", step, ": ", PositionLabel(position),
          "'s shard differs from replica 0's (digest ", absl::Hex(got), " vs ", absl::Hex(want), ")"));
    }
  }
  return CompleteStep(step);
}

absl::Status RunningJob::CompleteStep(int64_t step) {
  const int p = stages_;
  double slowest = 0, loss = 0;
  int64_t tokens = 0;
  for (size_t position = 0; position < reports_.size(); ++position) {
    const shardline::v1::ReportStepRequest& rep = reports_[position].at(step);
    slowest = std::max(slowest, rep.step_seconds());
    auto* status = status_.mutable_stages(static_cast<int>(position));
    status->set_busy_fraction(rep.step_seconds() > 0 ? rep.busy_seconds() / rep.step_seconds() : 0.0);
    status->set_peak_slots(rep.peak_slots());
    const double gib = static_cast<double>(rep.received_bytes()) / (1 << 30);
    status->set_minor_faults_per_gib(gib > 0 ? rep.minor_faults() / gib : 0.0);
    status->set_link_peak_bytes(rep.link_peak_bytes());
    status->set_step_seconds(rep.step_seconds());
    if (!rep.resumed_from().empty()) status->set_resumed_from(rep.resumed_from());
    if (rep.checkpoint_seconds() > 0) {
      status->set_checkpoint_seconds(rep.checkpoint_seconds());
      status->set_checkpoint_wait_seconds(rep.checkpoint_wait_seconds());
    }
  }
  // The step's loss and tokens: the replicas' last stages', in rank order
  // (tensor rank 0's: every rank computes them).
  // A replica standing for several of the spec's gives each one's loss:
  // added one by one, as the spec's replicas' would be.
  for (int r = 0; r < replicas_; ++r) {
    const shardline::v1::ReportStepRequest& rep = reports_[PositionOf(p - 1, r, 0)].at(step);
    if (rep.group_losses_size() == 0) loss += rep.loss();
    for (double group_loss : rep.group_losses()) loss += group_loss;
    tokens += rep.tokens();
  }
  const shardline::v1::ReportStepRequest& last = reports_[PositionOf(p - 1, 0, 0)].at(step);
  if (common::EvaluatesAfter(spec_, step)) {
    RETURN_IF_ERROR(NoteValidation(step));
  }
  status_.set_step(step);
  status_.set_loss(loss);
  status_.set_lr(last.lr());
  status_.set_grad_norm(last.grad_norm());
  status_.set_tokens_per_s(slowest > 0 ? tokens / slowest : 0.0);
  status_.set_step_seconds(slowest);
  pace_.Note(slowest);
  for (auto& reports : reports_) reports.erase(reports.begin(), reports.upper_bound(step));
  recent_steps_.push_back(status_);
  if (recent_steps_.size() > kRecentSteps) recent_steps_.pop_front();
  Publish();
  return absl::OkStatus();
}

absl::Status RunningJob::NoteValidation(int64_t step) {
  // A pass run again after a restart from an earlier commit was noted the
  // first time (with the same bits): the latest and best passes stay, and
  // early stopping counts each pass once.
  if (step <= status_.val_step()) return absl::OkStatus();
  // Each replica ran its share of the pass (common/eval_shares.h); its last
  // stage (tensor rank 0's: every rank computes the same) reports its
  // batches' losses, added back in batch order as shardline-train adds them.
  std::vector<absl::Span<const double>> shares;
  int64_t windows = 0, matches = 0;
  bool exact_match = false;
  for (int r = 0; r < replicas_; ++r) {
    const shardline::v1::ReportStepRequest& rep = reports_[PositionOf(stages_ - 1, r, 0)].at(step);
    shares.push_back(absl::MakeConstSpan(rep.eval_losses().data(), static_cast<size_t>(rep.eval_losses_size())));
    windows += rep.eval_windows();
    exact_match = exact_match || rep.has_eval_matches();
    matches += rep.eval_matches();
  }
  absl::StatusOr<double> loss = common::SumEvalShares(shares);
  if (!loss.ok()) {
    const std::string why =
        absl::StrCat("the validation pass after step ", step, " cannot be added up: ", loss.status().message());
    // Early stopping cannot follow the passes without it (nor commit the
    // versions that wait for it).
    if (common::StopsEarly(spec_)) return absl::FailedPreconditionError(why);
    LOG(ERROR) << "job " << status_.job_id() << ": " << why << " (not kept)";
    return absl::OkStatus();
  }
  // The accuracy as shardline-train divides it (trainer.cc), so early
  // stopping on it compares the same bits.
  common::ValidationPass pass{*loss, std::nullopt};
  if (exact_match) pass.accuracy = static_cast<double>(matches) / static_cast<double>(windows);
  common::ValidationBest best = validation_best();
  common::NoteValidationPass(spec_.train().early_stopping(), step, pass, best);
  status_.set_best_val_step(best.step);
  status_.set_best_val_loss(best.pass.loss);
  if (best.pass.accuracy.has_value()) {
    status_.set_best_val_accuracy(*best.pass.accuracy);
  } else {
    status_.clear_best_val_accuracy();
  }
  status_.set_passes_since_best(best.passes_since);
  status_.set_val_loss(*loss);
  status_.set_val_step(step);
  status_.set_val_windows(windows);
  if (exact_match) {
    status_.set_val_matches(matches);
  } else {
    status_.clear_val_matches();
  }
  return absl::OkStatus();
}

void RunningJob::Commit(int64_t step, int64_t bytes) {
  status_.set_committed_step(step);
  status_.set_checkpoint_bytes(bytes);
  Publish();
}

bool RunningJob::finished() const {
  return status_.step() == status_.total_steps() && status_.committed_step() == status_.total_steps();
}

void RunningJob::NoteLinkFailure(const std::string& message, absl::Time deadline) {
  if (!pending_failure_.empty()) return;
  pending_failure_ = message;
  failure_deadline_ = deadline;
  status_.set_message("a stage lost its link; checking whether a worker was lost");
  Publish();
}

bool RunningJob::TakeLinkRetry() {
  if (status_.committed_step() > link_retries_since_) {
    link_retries_ = 0;
    link_retries_since_ = status_.committed_step();
  }
  return link_retries_++ < kLinkRetries;
}

absl::Status RunningJob::Watch(std::shared_ptr<StreamMailbox<shardline::v1::JobStatus>> mailbox) {
  watchers_.erase(std::remove_if(watchers_.begin(), watchers_.end(), [](const auto& w) { return w->closed(); }),
                  watchers_.end());
  if (watchers_.size() >= kMaxWatchers) {
    return absl::ResourceExhaustedError(absl::StrCat("job ", status_.job_id(), " already has ", watchers_.size(),
                                                     " watchers, the most it takes"));
  }
  for (const shardline::v1::JobStatus& past : recent_steps_) {
    if (past.step() < status_.step()) mailbox->Push(past);  // the current step comes with the status now
  }
  mailbox->Push(status_);
  if (!ended()) watchers_.push_back(std::move(mailbox));
  return absl::OkStatus();
}

void RunningJob::Publish() {
  std::vector<std::shared_ptr<StreamMailbox<shardline::v1::JobStatus>>> alive;
  for (auto& watcher : watchers_) {
    if (watcher->Push(status_)) alive.push_back(std::move(watcher));
  }
  watchers_ = ended() ? decltype(alive)() : std::move(alive);
}

}  // namespace shardline::server
