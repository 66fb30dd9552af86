// The fixture of the coordinator service tests: a coordinator (both
// services) on 127.0.0.1:0 over a state directory of its own, stubs, and
// helpers that register workers (keeping their secrets), submit specs and
// send reports and shards as a worker would.
#ifndef SHARDLINE_TESTS_SERVER_COORDINATOR_SERVICE_FIXTURE_H_
#define SHARDLINE_TESTS_SERVER_COORDINATOR_SERVICE_FIXTURE_H_

#include <grpcpp/grpcpp.h>
#include <chrono>
#include <atomic>
#include <filesystem>
#include <map>
#include "common/job_spec.h"
#include "common/safetensors.h"
#include "common/shard_digest.h"
#include "common/grpc_metadata.h"
#include "gtest/gtest.h"
#include "server/running_job.h"
#include "server/admin_service.h"
#include "server/coordinator_service.h"
#include "server/job_manager.h"

namespace shardline::server::testing {

using grpc::StatusCode;

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/coordinator-service";
    const std::string& dir = dir_;
    std::filesystem::remove_all(dir);
    weights_ = std::move(*WeightStore::Open(dir));
    // Real time, which a test may move ahead (skew_seconds_).
    registry_ = std::make_unique<WorkerRegistry>(absl::Seconds(30),
                                                 [this] { return absl::Now() + absl::Seconds(skew_seconds_.load()); });
    coordinator_ = std::make_unique<CoordinatorService>(*registry_);
    store_ = std::move(*CoordinatorStore::Open(dir + "/coordinator.db"));
    jobs_ = std::make_unique<JobManager>(*registry_, *weights_, *store_,
                                         [this](const std::string& w, shardline::v1::Assignment a) {
                                           coordinator_->Deliver(w, std::move(a));
                                         });
    coordinator_->set_jobs(jobs_.get());
    admin_ = std::make_unique<AdminService>(*jobs_, *registry_, *weights_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddChannelArgument("grpc.so_reuseport", 0);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(coordinator_.get());
    builder.RegisterService(admin_.get());
    server_ = builder.BuildAndStart();
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
    worker_stub_ = shardline::v1::Coordinator::NewStub(channel);
    admin_stub_ = shardline::v1::Admin::NewStub(channel);
  }
  void TearDown() override { server_->Shutdown(); }

  // d_model 1024: a model whose shard may be the 128 MiB the upload tests send.
  shardline::v1::JobSpec Spec(int stages = 1, int d_model = 16) {
    auto spec = common::ParseJobSpec(R"({"name": "t",
      "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 16, "n_heads": 2, "n_layers": 1},
      "data": {"kind": "addition", "digits": 2},
      "train": {"steps": 5, "global_batch": 2, "micro_batches": 1, "seed": 1,
                "optimizer": {"kind": "adamw", "lr": 0.01}}})");
    spec->mutable_parallel()->set_pipeline_stages(stages);
    spec->mutable_model()->set_d_model(d_model);
    return *spec;
  }
  grpc::Status Register(const std::string& name, std::string* id = nullptr, double flops = 1e9,
                        const std::string& address = "127.0.0.1:1") {
    grpc::ClientContext context;
    shardline::v1::RegisterRequest request;
    request.set_name(name);
    request.mutable_capabilities()->set_listen_address(address);
    request.mutable_capabilities()->set_gemm_flops(flops);
    request.mutable_capabilities()->set_memory_bytes(int64_t{1} << 30);
    shardline::v1::RegisterResponse response;
    grpc::Status status = worker_stub_->Register(&context, request, &response);
    if (id != nullptr) *id = response.worker_id();
    if (status.ok()) secrets_[response.worker_id()] = response.worker_secret();
    if (status.ok()) last_worker_ = response.worker_id();
    return status;
  }
  // The call carries `worker_id`'s registration secret (the last one
  // registered's when empty), as a worker's calls do.
  void Sign(grpc::ClientContext& context, const std::string& worker_id = "") {
    context.AddMetadata(common::kWorkerSecretKey, secrets_[worker_id.empty() ? last_worker_ : worker_id]);
  }
  shardline::v1::JobStatus Submit(const shardline::v1::JobSpec& spec, grpc::Status* status) {
    grpc::ClientContext context;
    shardline::v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    shardline::v1::JobStatus response;
    *status = admin_stub_->SubmitJob(&context, request, &response);
    return response;
  }
  grpc::Status ReportStep(const shardline::v1::ReportStepRequest& r) {
    grpc::ClientContext context;
    Sign(context, r.worker_id());
    shardline::v1::ReportStepResponse response;
    return worker_stub_->ReportStep(&context, r, &response);
  }
  grpc::Status ReportShard(const std::vector<shardline::v1::ShardChunk>& chunks,
                           shardline::v1::ReportShardResponse* response = nullptr) {
    grpc::ClientContext context;
    Sign(context, chunks.empty() ? "" : chunks[0].header().worker_id());
    shardline::v1::ReportShardResponse ignored;
    auto writer = worker_stub_->ReportShard(&context, response != nullptr ? response : &ignored);
    for (const auto& c : chunks) {
      if (!writer->Write(c)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }
  // A stage's shard file of a few MiB, and a stream's chunks of it from
  // `offset` to `end` (the first carrying the header).
  static std::string ShardFile(int64_t rows = 512) {
    common::SafetensorsContents c;
    c.tensors.emplace("blocks.0.mlp.fc.weight", *common::Tensor::Zeros(common::DType::kF32, {rows, 1024}));
    c.tensors.emplace("optimizer.m.blocks.0.mlp.fc.weight", *common::Tensor::Zeros(common::DType::kF32, {rows, 1024}));
    c.tensors.at("blocks.0.mlp.fc.weight").values<float>()[7] = 0.5f;
    return *common::SerializeSafetensors(c);
  }
  std::vector<shardline::v1::ShardChunk> Chunks(const shardline::v1::JobStatus& job, const std::string& file,
                                                       int64_t offset, int64_t end) {
    std::vector<shardline::v1::ShardChunk> chunks(1);
    auto* h = chunks[0].mutable_header();
    h->set_job_id(job.job_id());
    h->set_worker_id(last_worker_);
    h->set_plan_epoch(job.plan_epoch());
    h->set_stages(1);
    h->set_step(5);
    h->set_total_bytes(static_cast<int64_t>(file.size()));
    h->set_digest(common::ShardDigest::Of(file));
    h->set_offset(offset);
    for (int64_t at = offset; at < end; at += 1 << 20) {
      if (at > offset) chunks.emplace_back();
      chunks.back().set_data(file.substr(at, std::min<int64_t>(1 << 20, end - at)));
    }
    return chunks;
  }
  // A heartbeat of `worker_id`, signed; its answer (the call must succeed).
  shardline::v1::HeartbeatResponse Beat(const std::string& worker_id) {
    grpc::ClientContext context;
    Sign(context, worker_id);
    shardline::v1::HeartbeatRequest request;
    request.set_worker_id(worker_id);
    shardline::v1::HeartbeatResponse response;
    EXPECT_TRUE(worker_stub_->Heartbeat(&context, request, &response).ok());
    return response;
  }
  // Every direction between `names` measured at `bytes_per_second`.
  void MeasureAll(const std::vector<std::string>& names, double bytes_per_second) {
    for (const std::string& from : names) {
      std::vector<LinkRecord> measured;
      for (const std::string& to : names) {
        if (to == from) continue;
        LinkRecord& link = measured.emplace_back();
        link.to = to;
        link.bytes_per_second = bytes_per_second;
        link.rtt_seconds = 1e-4;
      }
      jobs_->links().Record(from, std::move(measured));
    }
  }
  bool StillServing() {
    grpc::ClientContext context;
    shardline::v1::ListJobsResponse response;
    return admin_stub_->ListJobs(&context, shardline::v1::ListJobsRequest(), &response).ok();
  }

  std::string dir_;
  std::atomic<int64_t> skew_seconds_{0};
  std::unique_ptr<WeightStore> weights_;
  std::unique_ptr<CoordinatorStore> store_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<CoordinatorService> coordinator_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<AdminService> admin_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<shardline::v1::Coordinator::Stub> worker_stub_;
  std::map<std::string, std::string> secrets_;  // by worker id
  std::string last_worker_;
  std::unique_ptr<shardline::v1::Admin::Stub> admin_stub_;
};

}  // namespace shardline::server::testing

#endif  // SHARDLINE_TESTS_SERVER_COORDINATOR_SERVICE_FIXTURE_H_
