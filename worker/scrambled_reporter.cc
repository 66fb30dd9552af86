#include "worker/scrambled_reporter.h"

#include "common/status_macros.h"

namespace shardline::worker {

absl::StatusOr<bool> ScrambledReporter::ReportStep(const shardline::v1::ReportStepRequest& report) {
  const bool flush = report.step() >= last_step_ || !report.error().empty();
  if (!held_.has_value() && !flush) {
    held_ = report;
    return false;
  }
  ASSIGN_OR_RETURN(bool stop, inner().ReportStep(report));
  if (held_.has_value()) {
    ASSIGN_OR_RETURN(const bool held_stop, inner().ReportStep(*held_));
    held_.reset();
    ASSIGN_OR_RETURN(const bool again_stop, inner().ReportStep(report));
    stop = stop || held_stop || again_stop;
  }
  return stop;
}

absl::Status ScrambledReporter::ReportShard(const ShardSnapshot& shard, const std::atomic<bool>& cancelled) {
  RETURN_IF_ERROR(inner().ReportShard(shard, cancelled));
  return inner().ReportShard(shard, cancelled);
}

}  // namespace shardline::worker
