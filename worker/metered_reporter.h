// MeteredReporter passes a stage's reports on to the reporter it wraps and
// counts them into the worker's Prometheus metrics on the way: steps, step
// time, compute (busy) time and the busy and bubble fractions of the last
// step, the time of each phase of its steps (from the step's trace: waits
// on neighbours and on collectives among them), stage-link and collective
// bytes received, link memory held, checkpoint time and uploads. Names are
// listed in docs/operations.md ("Metrics"). One stage calls it at a time.
#ifndef SHARDLINE_WORKER_METERED_REPORTER_H_
#define SHARDLINE_WORKER_METERED_REPORTER_H_

#include <map>
#include <string>

#include "common/metrics_registry.h"
#include "worker/forwarding_reporter.h"

namespace shardline::worker {

class MeteredReporter final : public ForwardingReporter {
 public:
  MeteredReporter(StageReporter& inner, common::MetricsRegistry& metrics);

  absl::StatusOr<bool> ReportStep(const shardline::v1::ReportStepRequest& report) override;
  absl::Status ReportShard(const ShardSnapshot& shard, const std::atomic<bool>& cancelled) override;

 private:
  common::MetricsRegistry& metrics_;
  std::map<std::string, common::Counter*> phase_seconds_;  // by phase, as met
  common::Counter& steps_;
  common::Counter& failed_steps_;
  common::Histogram& step_seconds_;
  common::Counter& busy_seconds_;
  common::Gauge& busy_ratio_;
  common::Gauge& bubble_ratio_;
  common::Counter& link_bytes_;
  common::Counter& collective_bytes_;
  common::Counter& tensor_collective_bytes_;
  common::Counter& tensor_collective_seconds_;
  common::Gauge& link_peak_bytes_;
  common::Counter& checkpoint_seconds_;
  common::Counter& uploads_;
  common::Counter& upload_bytes_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_METERED_REPORTER_H_
