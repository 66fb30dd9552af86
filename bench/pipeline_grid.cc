#include "bench/pipeline_grid.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/bench_report.h"
#include "bench/loopback_server.h"
#include "common/job_spec.h"
#include "worker/backend/backend_factory.h"
#include "worker/runtime/gradient_buckets.h"
#include "worker/runtime/stage_sender.h"
#include "worker/transport/staging_pool.h"

namespace shardline::bench {

PipelineGrid::PipelineGrid(const shardline::v1::JobSpec& spec, const std::vector<int>& cuts,
                           const std::string& device, int threads_per_stage)
    : p_(spec.parallel().pipeline_stages()),
      d_(std::max(1, spec.parallel().data_parallel())),
      t_(std::max(1, spec.parallel().tensor_parallel())) {
  const auto config = worker::nn::ModelConfig::FromSpec(spec.model());
  const auto optimizer = worker::nn::OptimizerConfig::FromSpec(spec.train());
  auto data = worker::data::CreateDataSource(spec);
  BENCH_CHECK_OK(data.status());
  data_ = std::move(*data);
  positions_.resize(static_cast<size_t>(p_ * d_ * t_));
  for (Position& at : positions_) {
    at.service = std::make_unique<worker::transport::StageLinkService>();
    LoopbackServer server = StartLoopbackServer(*at.service);
    at.server = std::move(server.server);
    at.address = server.address;
  }
  const size_t bucket = static_cast<size_t>(spec.parallel().bucket_mib() * (1 << 20));
  auto group_options = [&](Position& at, std::string name, int rank, std::vector<std::string> peers, size_t slot) {
    worker::collective::GrpcCollectiveOptions group;
    group.job_id = "bench";
    group.plan_epoch = 1;
    group.group = std::move(name);
    group.rank = rank;
    group.peer_addresses = std::move(peers);
    group.service = at.service.get();
    group.staging_slot_bytes = slot;
    group.staging_memory = worker::transport::HostStagingMemory(*at.backend);
    auto collective = worker::collective::GrpcCollective::Create(*at.backend, group);
    BENCH_CHECK_OK(collective.status());
    return std::move(*collective);
  };
  for (int r = 0; r < d_; ++r) {
    for (int s = 0; s < p_; ++s) {
      for (int k = 0; k < t_; ++k) {
        Position& at = At(s, r, k);
        auto backend = worker::CreateBackend(device, {threads_per_stage});
        BENCH_CHECK_OK(backend.status());
        at.backend = std::move(*backend);
        worker::nn::TensorParallel tp;
        if (t_ > 1) {
          std::vector<std::string> peers;
          for (int j = 0; j < t_; ++j) peers.push_back(At(s, r, j).address);
          at.tensor = group_options(at, absl::StrCat("tensor-", s, ".replica-", r), k, std::move(peers),
                                    worker::runtime::LargestLinkTensorBytes(spec));
          at.timed_tensor = std::make_unique<worker::collective::TimedCollective>(*at.tensor);
          tp = {k, t_, at.timed_tensor.get(), common::VocabParallel(spec)};
        }
        auto runtime = worker::runtime::ShardRuntime::Create(*at.backend, config, cuts[s], cuts[s + 1],
                                                             spec.train().seed(), optimizer, tp);
        BENCH_CHECK_OK(runtime.status());
        at.runtime = std::move(*runtime);
        worker::transport::GrpcStageLinkOptions link;
        link.job_id = "bench";
        link.plan_epoch = 1;
        link.stage = s;
        link.stages = p_;
        link.service = at.service.get();
        if (s > 0) link.upstream_address = At(s - 1, r, k).address;
        link.staging_slot_bytes = worker::runtime::LargestLinkTensorBytes(spec);
        link.staging_memory = worker::transport::HostStagingMemory(*at.backend);  // as a worker's
        if (at.backend->host_staging_pinned()) link.extra_send_slots = worker::runtime::StageSender::kDefaultMaxQueued;
        auto created = worker::transport::GrpcStageLink::Create(link);
        BENCH_CHECK_OK(created.status());
        at.link = std::move(*created);
        if (d_ > 1) {
          std::vector<std::string> peers;
          for (int q = 0; q < d_; ++q) peers.push_back(At(s, q, k).address);
          at.replicas = group_options(at, absl::StrCat("stage-", s, ".tensor-", k), r, std::move(peers),
                                      worker::runtime::GradientBuckets::LargestChunkBytes(
                                          bucket, d_, spec.parallel().shard_optimizer()));
        }
        worker::runtime::PipelineStageOptions options;
        const auto schedule = worker::runtime::ParseScheduleKind(spec.parallel().schedule());
        BENCH_CHECK_OK(schedule.status());
        options.schedule = *schedule;
        options.stages = p_;
        options.stage = s;
        options.micro_batches = spec.train().micro_batches();
        options.global_batch = spec.train().global_batch();
        options.replica = r;
        options.replicas = d_;
        options.bucket_bytes = bucket;
        options.shard_optimizer = spec.parallel().shard_optimizer();
        options.tensor_rank = k;
        options.tensor_size = t_;
        auto stage = worker::runtime::PipelineStage::Create(*at.runtime, data_.get(), *at.link, options,
                                                            at.replicas.get(), at.timed_tensor.get());
        BENCH_CHECK_OK(stage.status());
        at.stage = std::move(*stage);
      }
    }
  }
}

uint64_t PipelineGrid::TensorBytesReceived() const {
  uint64_t bytes = 0;
  for (const Position& at : positions_) bytes += at.tensor != nullptr ? at.tensor->BytesReceived() : 0;
  return bytes;
}

double PipelineGrid::TensorSeconds() const {
  double seconds = 0;
  for (const Position& at : positions_) seconds += at.timed_tensor != nullptr ? at.timed_tensor->seconds() : 0;
  return seconds;
}

PipelineGrid::~PipelineGrid() {
  for (Position& at : positions_) {
    at.stage.reset();
    at.replicas.reset();
    at.timed_tensor.reset();
    at.tensor.reset();
    at.link.reset();
  }
  for (Position& at : positions_) at.server->Shutdown();
}

std::vector<worker::runtime::StageStepResult> PipelineGrid::RunStep(int64_t step) {
  std::vector<absl::StatusOr<worker::runtime::StageStepResult>> results(positions_.size(),
                                                                        absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < positions_.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = positions_[i].stage->RunStep(step); });
  }
  for (auto& t : threads) t.join();
  std::vector<worker::runtime::StageStepResult> out;
  for (auto& r : results) {
    BENCH_CHECK_OK(r.status());
    out.push_back(*r);
  }
  return out;
}

uint64_t PipelineGrid::LinkPeakBytes() const {
  uint64_t peak = 0;
  for (const Position& at : positions_) peak = std::max(peak, at.link->PeakHeldBytes());
  return peak;
}

int PipelineGrid::LinkPeakStagingSlots() const {
  int peak = 0;
  for (const Position& at : positions_) peak = std::max(peak, at.link->PeakStagingSlots());
  return peak;
}

}  // namespace shardline::bench
