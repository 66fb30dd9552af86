// PipelineGrid is bench_pipeline's p × d × t grid of pipeline stages:
// threads of this process, each position (stage s, replica r, tensor rank
// k) with its own backend (and BLAS thread budget), StageLink service and
// gRPC server on loopback, its stage links (to the same tensor rank of its
// replica's neighbours), and, with d > 1, its data-parallel GrpcCollective,
// with t > 1 its stage's tensor-parallel one, set up as worker daemons set
// them up. RunStep runs one step on every position at once.
#ifndef SHARDLINE_BENCH_PIPELINE_GRID_H_
#define SHARDLINE_BENCH_PIPELINE_GRID_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "shardline/v1/job.pb.h"
#include "worker/backend/backend.h"
#include "worker/collective/timed_collective.h"
#include "worker/collective/grpc_collective.h"
#include "worker/data/data_source.h"
#include "worker/runtime/pipeline_stage.h"
#include "worker/transport/grpc_stage_link.h"
#include "worker/transport/stage_link_service.h"

namespace shardline::bench {

class PipelineGrid {
 public:
  // `cuts`: p + 1 unit boundaries. Each position gets `threads_per_stage`
  // compute threads on `device`. Stops the process on any error.
  PipelineGrid(const shardline::v1::JobSpec& spec, const std::vector<int>& cuts, const std::string& device,
               int threads_per_stage);
  ~PipelineGrid();

  int stages() const { return p_; }
  int replicas() const { return d_; }
  int tensor_ranks() const { return t_; }
  // One step on every position; the results by position (r·p + s)·t + k.
  std::vector<worker::runtime::StageStepResult> RunStep(int64_t step);
  // Bytes received so far by every position's tensor-parallel group, and
  // the seconds its calls took (every position's, added).
  uint64_t TensorBytesReceived() const;
  double TensorSeconds() const;
  // The most tensor bytes one position's links held, and staging slots used.
  uint64_t LinkPeakBytes() const;
  int LinkPeakStagingSlots() const;

 private:
  struct Position {
    std::unique_ptr<worker::transport::StageLinkService> service;
    std::unique_ptr<grpc::Server> server;
    std::string address;
    std::unique_ptr<worker::Backend> backend;
    std::unique_ptr<worker::runtime::ShardRuntime> runtime;
    std::unique_ptr<worker::transport::GrpcStageLink> link;
    std::unique_ptr<worker::collective::GrpcCollective> replicas;
    std::unique_ptr<worker::collective::GrpcCollective> tensor;
    std::unique_ptr<worker::collective::TimedCollective> timed_tensor;  // what the layers call
    std::unique_ptr<worker::runtime::PipelineStage> stage;
  };
  Position& At(int s, int r, int k) { return positions_[static_cast<size_t>((r * p_ + s) * t_ + k)]; }

  const int p_, d_, t_;
  std::unique_ptr<worker::data::DataSource> data_;
  std::vector<Position> positions_;
};

}  // namespace shardline::bench

#endif  // SHARDLINE_BENCH_PIPELINE_GRID_H_
