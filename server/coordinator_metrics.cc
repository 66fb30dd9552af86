#include "server/coordinator_metrics.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/init.h"

namespace shardline::server {
using common::MetricLabels;

const std::vector<double>& CoordinatorMetrics::StepBuckets() {
  static const auto* buckets =
      new std::vector<double>{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
  return *buckets;
}

CoordinatorMetrics::CoordinatorMetrics(common::MetricsRegistry& registry, WorkerRegistry& workers, JobManager& jobs)
    : registry_(registry), workers_(workers), jobs_(jobs) {
  registry_.GetGauge("shardline_build_info", "the build: its version in a label; the value is 1",
                     {{"version", std::string(common::Version())}, {"daemon", "coordinator"}})
      .Set(1);
  jobs_.SetStepObserver([this](const shardline::v1::JobStatus& status) { OnStep(status); });
  jobs_.SetDeleteObserver([this](const std::string& job_id) { registry_.RemoveSeries("job_id", job_id); });
  registry_.AddRefresh([this] { Refresh(); });
}

void CoordinatorMetrics::OnStep(const shardline::v1::JobStatus& s) {
  const MetricLabels job = {{"job_id", s.job_id()}};
  double slowest = 0;
  for (const shardline::v1::StageStatus& p : s.stages()) slowest = std::max(slowest, p.step_seconds());
  registry_.GetCounter("shardline_job_steps_total", "training steps the job completed (every position reported)", job)
      .Add(1);
  // tokens_per_s is the step's tokens over its slowest position's time.
  registry_.GetCounter("shardline_job_tokens_total", "tokens the job trained on", job)
      .Add(std::round(s.tokens_per_s() * slowest));
  registry_.GetHistogram("shardline_job_step_seconds", "wall time of a step: its slowest position's", StepBuckets(), job)
      .Observe(slowest);
  registry_.GetGauge("shardline_job_step", "the last step the job completed", job).Set(static_cast<double>(s.step()));
  registry_.GetGauge("shardline_job_loss", "the loss of the job's last step", job).Set(s.loss());
  if (s.val_step() == s.step()) {  // a validation pass after this step (train.eval_every)
    registry_.GetGauge("shardline_job_validation_loss", "the loss of the job's latest validation pass", job)
        .Set(s.val_loss());
    registry_.GetGauge("shardline_job_best_validation_loss",
                       "the loss of the job's best validation pass so far (what early stopping keeps)", job)
        .Set(s.best_val_loss());
    if (s.has_best_val_accuracy()) {
      registry_.GetGauge("shardline_job_best_validation_accuracy",
                         "the exact match of the job's best validation pass so far (addition)", job)
          .Set(s.best_val_accuracy());
    }
    if (s.has_val_matches() && s.val_windows() > 0) {
      registry_.GetGauge("shardline_job_validation_accuracy",
                         "the share of held-out problems the job's latest validation pass answered right "
                         "(exact match: addition)",
                         job)
          .Set(static_cast<double>(s.val_matches()) / static_cast<double>(s.val_windows()));
    }
  }
  registry_.GetGauge("shardline_job_tokens_per_second", "tokens per second of the job's last step", job)
      .Set(s.tokens_per_s());
  for (const shardline::v1::StageStatus& p : s.stages()) {
    const MetricLabels position = {{"job_id", s.job_id()},
                                   {"stage", absl::StrCat(p.stage())},
                                   {"replica", absl::StrCat(p.replica())},
                                   {"tensor_rank", absl::StrCat(p.tensor_rank())}};
    registry_.GetGauge("shardline_position_busy_ratio", "share of the last step the position spent computing",
                       position)
        .Set(p.busy_fraction());
    registry_.GetGauge("shardline_position_bubble_ratio",
                       "share of the last step the position did not compute (waits on neighbours, collectives, "
                       "the schedule's bubble)",
                       position)
        .Set(std::clamp(1.0 - p.busy_fraction(), 0.0, 1.0));
    registry_.GetGauge("shardline_position_step_seconds", "wall time of the last step on the position", position)
        .Set(p.step_seconds());
  }
}

void CoordinatorMetrics::Refresh() {
  std::map<std::string, int> jobs;
  for (int state = shardline::v1::PENDING; state <= shardline::v1::JobState_MAX; ++state) {
    if (shardline::v1::JobState_IsValid(state)) jobs[shardline::v1::JobState_Name(state)] = 0;
  }
  for (const shardline::v1::JobStatus& job : jobs_.List()) ++jobs[shardline::v1::JobState_Name(job.state())];
  for (const auto& [state, count] : jobs) {
    registry_.GetGauge("shardline_jobs", "jobs by state", {{"state", absl::AsciiStrToLower(state)}}).Set(count);
  }
  std::map<std::string, int> workers = {{"idle", 0}, {"busy", 0}, {"draining", 0}, {"drained", 0}, {"lost", 0}};
  for (const WorkerRecord& worker : workers_.List()) ++workers[StateOf(worker)];
  for (const auto& [state, count] : workers) {
    registry_.GetGauge("shardline_workers", "registered workers by state", {{"state", state}}).Set(count);
  }
  const LinkTable& links = jobs_.links();
  const char* help = "link directions queued for probing (queued), and of those being probed now (running)";
  registry_.GetGauge("shardline_link_probes", help, {{"state", "queued"}}).Set(links.pending());
  registry_.GetGauge("shardline_link_probes", help, {{"state", "running"}}).Set(links.probing());
}

}  // namespace shardline::server
