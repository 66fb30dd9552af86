#include "worker/step_wire_paces.h"

namespace shardline::worker {

StepWirePaces::StepWirePaces(transport::StageLink& link, collective::Collective* replicas) {
  sources_.push_back({shardline::v1::WirePace::PREVIOUS_STAGE, 0, [&link] { return link.PaceFromPrevious(); }, {}});
  sources_.push_back({shardline::v1::WirePace::NEXT_STAGE, 0, [&link] { return link.PaceFromNext(); }, {}});
  if (replicas == nullptr) return;
  for (int r = 0; r < replicas->size(); ++r) {
    if (r == replicas->rank()) continue;
    sources_.push_back({shardline::v1::WirePace::REPLICA, r, [replicas, r] { return replicas->PaceFrom(r); }, {}});
  }
}

void StepWirePaces::Begin() {
  for (Source& s : sources_) s.before = s.read();
}

void StepWirePaces::AddTo(shardline::v1::ReportStepRequest& report) const {
  for (const Source& s : sources_) {
    const transport::WirePace step = s.read().Since(s.before);
    if (step.bytes == 0 || step.nanos == 0) continue;
    shardline::v1::WirePace* pace = report.add_wire_paces();
    pace->set_peer(s.peer);
    if (s.peer == shardline::v1::WirePace::REPLICA) pace->set_replica(s.replica);
    pace->set_bytes(static_cast<int64_t>(step.bytes));
    pace->set_seconds(static_cast<double>(step.nanos) * 1e-9);
  }
}

}  // namespace shardline::worker
