// StepWirePaces: what a position's streams measured of their wires during
// one step (transport/wire_pace.h), for the step's report: the stage link's
// two neighbours and each data-parallel twin, those that sent frames back
// to back in the step. The coordinator tells a link that slowed from them.
#ifndef SHARDLINE_WORKER_STEP_WIRE_PACES_H_
#define SHARDLINE_WORKER_STEP_WIRE_PACES_H_

#include <functional>
#include <vector>

#include "shardline/v1/coordinator.pb.h"
#include "worker/collective/collective.h"
#include "worker/transport/stage_link.h"

namespace shardline::worker {

class StepWirePaces {
 public:
  // `replicas`: the stage's data-parallel group, rank r being replica r
  // (null: none); both must outlive this.
  StepWirePaces(transport::StageLink& link, collective::Collective* replicas);

  // Before a step.
  void Begin();
  // What came since Begin, into `report`.
  void AddTo(shardline::v1::ReportStepRequest& report) const;

 private:
  struct Source {
    shardline::v1::WirePace::Peer peer;
    int replica = 0;
    std::function<transport::WirePace()> read;
    transport::WirePace before;
  };
  std::vector<Source> sources_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_STEP_WIRE_PACES_H_
