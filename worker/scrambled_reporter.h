// ScrambledReporter is a test hook (shardline-worker
// --test_only_scramble_reports): a StageReporter that sends what a stage
// reports the way a bad network would deliver it, to the reporter it wraps.
// Each step's report is held back and sent after the next one, then that
// next one again (reordered, duplicated); each shard is sent twice. The
// last step's report, and a report of an error, flush what is held. The
// coordinator must apply each report once.
#ifndef SHARDLINE_WORKER_SCRAMBLED_REPORTER_H_
#define SHARDLINE_WORKER_SCRAMBLED_REPORTER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "worker/forwarding_reporter.h"

namespace shardline::worker {

class ScrambledReporter final : public ForwardingReporter {
 public:
  // `last_step`: the job's last step (its report is never held).
  ScrambledReporter(StageReporter& inner, int64_t last_step) : ForwardingReporter(inner), last_step_(last_step) {}

  absl::StatusOr<bool> ReportStep(const shardline::v1::ReportStepRequest& report) override;
  absl::Status ReportShard(const ShardSnapshot& shard, const std::atomic<bool>& cancelled) override;

 private:
  const int64_t last_step_;
  std::optional<shardline::v1::ReportStepRequest> held_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_SCRAMBLED_REPORTER_H_
