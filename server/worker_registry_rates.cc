// WorkerRegistry's rates (worker_registry.h): what its workers' job
// reports achieved, the rates to plan with, and re-measuring an idle
// worker's GEMM rate once its reports said it was slower than its probe.
#include <algorithm>
#include <cmath>

#include "common/median.h"
#include "glog/logging.h"
#include "server/worker_registry.h"

namespace shardline::server {
namespace {

// A moving average's next value.
void Average(double value, double& average, int64_t& reports) {
  average = reports == 0 ? value : (1 - kAchievedRateWeight) * average + kAchievedRateWeight * value;
  ++reports;
}

}  // namespace

double PlanningFlops(const WorkerRecord& w) {
  return w.planning_flops > 0 ? w.planning_flops : w.capabilities.gemm_flops();
}

double PredictingFlops(const WorkerRecord& w) {
  return w.predicting_flops > 0 ? w.predicting_flops : PlanningFlops(w);
}

double WorkerRegistry::MedianRatioLocked() const {
  std::vector<double> ratios;
  for (const auto& [id, w] : workers_) {
    if (!w.lost && w.achieved_reports >= kMinAchievedReports) {
      ratios.push_back(w.achieved_flops / w.capabilities.gemm_flops());
    }
  }
  return ratios.empty() ? 1 : common::Median(ratios);
}

bool WorkerRegistry::SlowerThanProbe(const WorkerRecord& w, double ratio) {
  return w.achieved_reports >= kMinAchievedReports &&
         w.achieved_flops < (1 - kRateDisagreement) * w.capabilities.gemm_flops() * ratio;
}

std::vector<WorkerRecord> WorkerRegistry::List() {
  std::vector<WorkerRecord> out;
  double ratio = 1;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, w] : workers_) out.push_back(w);
    ratio = MedianRatioLocked();
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.order < b.order; });
  std::vector<double> optimizer_rates;  // of the live workers that have one
  for (const WorkerRecord& w : out) {
    if (!w.lost && w.optimizer_reports >= kMinAchievedReports) optimizer_rates.push_back(w.optimizer_rate);
  }
  const double optimizer_rate = common::Median(optimizer_rates);
  for (WorkerRecord& w : out) {
    const bool achieved = w.achieved_reports >= kMinAchievedReports;
    w.planning_flops = w.capabilities.gemm_flops() * ratio;
    if (achieved && std::fabs(w.achieved_flops / w.planning_flops - 1) > kRateDisagreement) {
      w.planning_flops = w.achieved_flops;  // its reports disagree with its probe
    }
    // Never faster than its probe: a worker idle between short passes may
    // run them in bursts above its sustained rate (a CPU quota's slack), and
    // a light stage's figure would flatter it on a heavier one.
    w.predicting_flops = achieved ? std::min(w.achieved_flops, w.capabilities.gemm_flops()) : w.planning_flops;
    w.planning_optimizer_rate = w.optimizer_reports >= kMinAchievedReports ? w.optimizer_rate : optimizer_rate;
  }
  return out;
}

std::vector<WorkerRecord> WorkerRegistry::Idle() {
  std::vector<WorkerRecord> out;
  for (WorkerRecord& w : List()) {
    if (!w.lost && !w.drained && w.job_id.empty()) out.push_back(std::move(w));
  }
  return out;
}

void WorkerRegistry::NoteAchievedRate(const std::string& worker_id, double flops_per_second) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.lost) return;
  WorkerRecord& w = it->second;
  if (!(flops_per_second > 0) || !std::isfinite(flops_per_second) ||
      flops_per_second > 100 * w.capabilities.gemm_flops()) {
    return;
  }
  Average(flops_per_second, w.achieved_flops, w.achieved_reports);
  if (w.compute_rebased && w.achieved_reports >= kMinAchievedReports) {
    // The first reports since a fresh probe set the old ones aside: slower
    // again, the probe misled (its machine is slower on real layers than on
    // one large product): wait longer before believing the next one.
    w.compute_rebased = false;
    const bool misled = SlowerThanProbe(w, MedianRatioLocked());
    w.compute_probe_wait = misled ? std::min(2 * w.compute_probe_wait, kComputeProbeMaxWait) : kComputeProbeWait;
    if (misled) {
      LOG(INFO) << "worker " << w.name << " reports " << w.achieved_flops / 1e9
                << " GFLOP/s again after its fresh GEMM probe: its probe overstates it; the next ask waits "
                << absl::FormatDuration(w.compute_probe_wait) << " idle";
    }
  }
}

void WorkerRegistry::NoteOptimizerRate(const std::string& worker_id, double parameters_per_second) {
  if (!(parameters_per_second > 0) || !std::isfinite(parameters_per_second)) return;
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.lost) return;
  Average(parameters_per_second, it->second.optimizer_rate, it->second.optimizer_reports);
}

bool WorkerRegistry::AskComputeProbe(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return false;
  WorkerRecord& w = it->second;
  const absl::Time now = clock_();
  if (w.lost || w.drained || !w.job_id.empty() || now - w.idle_since < kComputeProbeIdle ||
      now < w.compute_probe_after || w.achieved_reports < kMinAchievedReports) {
    return false;
  }
  // The median walks every worker: looked at once a kComputeProbeIdle, not
  // on every heartbeat (its reports do not move while it is idle).
  if (!SlowerThanProbe(w, MedianRatioLocked())) {
    w.compute_probe_after = now + kComputeProbeIdle;
    return false;
  }
  w.compute_probe_after = now + w.compute_probe_wait;
  LOG(INFO) << "worker " << w.name << " is idle and its jobs' reports said " << w.achieved_flops / 1e9
            << " GFLOP/s, slower than its GEMM probe (" << w.capabilities.gemm_flops() / 1e9
            << " GFLOP/s) says: asking it to measure again";
  return true;
}

bool WorkerRegistry::NoteComputeProbe(const std::string& worker_id, double gemm_flops) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return false;
  WorkerRecord& w = it->second;
  if (w.lost || !w.job_id.empty()) return false;  // a probe beside a job's passes reads low
  if (gemm_flops < (1 - kRateDisagreement) * w.capabilities.gemm_flops()) {
    LOG(INFO) << "worker " << w.name << " measured " << gemm_flops / 1e9 << " GFLOP/s, still below the "
              << w.capabilities.gemm_flops() / 1e9 << " it registered with: its reports stand";
    return false;
  }
  LOG(WARNING) << "worker " << w.name << " measured " << gemm_flops / 1e9 << " GFLOP/s again (its jobs reported "
               << w.achieved_flops / 1e9 << "): as fast as when it registered; its slower reports are set aside";
  w.achieved_flops = 0;
  w.achieved_reports = 0;
  w.optimizer_rate = 0;
  w.optimizer_reports = 0;
  w.compute_rebased = true;
  return true;
}

}  // namespace shardline::server
