// WorkerStateService serves a worker's StateCache to its data-parallel
// twins (WorkerState.FetchState): the snapshot of the asked step streamed
// from memory in 1 MiB chunks, as the coordinator streams its committed
// version. gRPC adapter only: the snapshot stays alive while it streams.
// Thread-safe.
#ifndef SHARDLINE_WORKER_WORKER_STATE_SERVICE_H_
#define SHARDLINE_WORKER_WORKER_STATE_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "shardline/v1/stage_link.grpc.pb.h"
#include "worker/state_cache.h"

namespace shardline::worker {

class WorkerStateService final : public shardline::v1::WorkerState::CallbackService {
 public:
  explicit WorkerStateService(StateCache& cache) : cache_(cache) {}

  grpc::ServerWriteReactor<shardline::v1::ShardChunk>* FetchState(
      grpc::CallbackServerContext* context, const shardline::v1::FetchStateRequest* request) override;

 private:
  StateCache& cache_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_WORKER_STATE_SERVICE_H_
