// The collective groups a worker's position joins for one assignment, over
// its StageLink service: with replicas, its stage's data-parallel group
// (the copies of this stage and tensor rank in the other replicas; the
// gradient buckets' chunks size its staging slots); with tensor
// parallelism, its stage's tensor-parallel group in this replica (the
// all-reduces of a micro-batch's activations). Either may be absent.
// Closing both interrupts any call in flight; a position whose job ran to
// its end leaves both in order (GrpcCollective::Leave), so that a peer
// still waiting for its last frames gets them.
#ifndef SHARDLINE_WORKER_GRPC_JOB_GROUPS_H_
#define SHARDLINE_WORKER_GRPC_JOB_GROUPS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "shardline/v1/coordinator.pb.h"
#include "worker/backend/backend.h"
#include "worker/collective/grpc_collective.h"
#include "worker/transport/stage_link_service.h"

namespace shardline::worker {

struct JobGroups {
  std::unique_ptr<collective::GrpcCollective> replicas;  // null with one replica of its own
  std::unique_ptr<collective::GrpcCollective> tensor;    // null with one tensor rank
  void Close(const std::string& why) {
    if (replicas != nullptr) replicas->Close(why);
    if (tensor != nullptr) tensor->Close(why);
  }
  void Leave() {
    if (replicas != nullptr) replicas->Leave();
    if (tensor != nullptr) tensor->Leave();
  }
};

// What a neighbouring stage may send on a stage link of the assignment's
// job: a micro-batch's activations or gradients and its targets.
transport::FrameLimits StageLinkFrameLimits(const shardline::v1::Assignment& a);
// What a rank of its groups may send: a bucket of the stage's gradients (at
// most all its parameters), a micro-batch's activations, or the loss parts.
transport::FrameLimits CollectiveFrameLimits(const shardline::v1::Assignment& a);

absl::StatusOr<JobGroups> CreateJobGroups(const shardline::v1::Assignment& a, Backend& backend,
                                          transport::StageLinkService& service,
                                          const transport::ExchangeOptions& exchange);

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_GRPC_JOB_GROUPS_H_
