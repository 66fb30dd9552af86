// CoordinatorMetrics: the coordinator's Prometheus metrics. At each scrape,
// jobs and workers by state; at each step a job completes, its steps,
// tokens, step time (the slowest position's) and each position's busy and
// bubble fractions (the share of its step it computed, and the rest: waits
// on neighbours, collectives and the schedule's bubble); a deleted job's
// series go with it. Names and labels
// are listed in docs/operations.md ("Metrics").
#ifndef SHARDLINE_SERVER_COORDINATOR_METRICS_H_
#define SHARDLINE_SERVER_COORDINATOR_METRICS_H_

#include "common/metrics_registry.h"
#include "server/job_manager.h"
#include "server/worker_registry.h"

namespace shardline::server {

class CoordinatorMetrics {
 public:
  // Observes `jobs`' steps (JobManager::SetStepObserver) and adds the
  // scrape-time refresh; all three must outlive it.
  CoordinatorMetrics(common::MetricsRegistry& registry, WorkerRegistry& workers, JobManager& jobs);

  // Step-time histogram buckets, in seconds.
  static const std::vector<double>& StepBuckets();

 private:
  void OnStep(const shardline::v1::JobStatus& status);
  void Refresh();

  common::MetricsRegistry& registry_;
  WorkerRegistry& workers_;
  JobManager& jobs_;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_COORDINATOR_METRICS_H_
