#include "server/job_trace.h"

namespace shardline::server {

void JobTrace::Add(int stage, int replica, int tensor_rank, const std::string& worker, uint64_t plan_epoch,
                   int64_t step, const google::protobuf::RepeatedPtrField<shardline::v1::TraceEvent>& events) {
  if (events.empty()) return;
  shardline::v1::PositionTrace& position = positions_[{stage, replica, tensor_rank}];
  position.set_stage(stage);
  position.set_replica(replica);
  position.set_tensor_rank(tensor_rank);
  position.set_worker(worker);
  shardline::v1::PositionTrace::Step* kept = position.add_steps();
  kept->set_step(step);
  kept->set_plan_epoch(plan_epoch);
  *kept->mutable_events() = events;
  if (position.steps_size() > kStepsKept) {
    position.mutable_steps()->DeleteSubrange(0, position.steps_size() - kStepsKept);
  }
}

shardline::v1::GetTraceResponse JobTrace::Get(const std::string& job_id, int64_t first, int64_t last) const {
  shardline::v1::GetTraceResponse response;
  response.set_job_id(job_id);
  for (const auto& [key, position] : positions_) {
    shardline::v1::PositionTrace* out = response.add_positions();
    out->set_stage(position.stage());
    out->set_replica(position.replica());
    out->set_tensor_rank(position.tensor_rank());
    out->set_worker(position.worker());
    for (const shardline::v1::PositionTrace::Step& step : position.steps()) {
      if ((first > 0 && step.step() < first) || (last > 0 && step.step() > last)) continue;
      *out->add_steps() = step;
    }
  }
  return response;
}

}  // namespace shardline::server
