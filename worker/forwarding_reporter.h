// ForwardingReporter passes every call on to the StageReporter it wraps: the
// base of reporters that change or watch only some calls on the way
// (ScrambledReporter, MeteredReporter).
#ifndef SHARDLINE_WORKER_FORWARDING_REPORTER_H_
#define SHARDLINE_WORKER_FORWARDING_REPORTER_H_

#include <string>

#include "worker/stage_reporter.h"

namespace shardline::worker {

class ForwardingReporter : public StageReporter {
 public:
  explicit ForwardingReporter(StageReporter& inner) : inner_(inner) {}

  absl::StatusOr<bool> ReportStep(const shardline::v1::ReportStepRequest& report) override {
    return inner_.ReportStep(report);
  }
  absl::Status ReportShard(const ShardSnapshot& shard, const std::atomic<bool>& cancelled) override {
    return inner_.ReportShard(shard, cancelled);
  }
  absl::StatusOr<common::SafetensorsContents> FetchState(const shardline::v1::FetchStateRequest& request) override {
    return inner_.FetchState(request);
  }
  absl::StatusOr<common::SafetensorsContents> FetchStateFromTwin(
      const std::string& address, const shardline::v1::FetchStateRequest& request) override {
    return inner_.FetchStateFromTwin(address, request);
  }

 protected:
  StageReporter& inner() { return inner_; }

 private:
  StageReporter& inner_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_FORWARDING_REPORTER_H_
