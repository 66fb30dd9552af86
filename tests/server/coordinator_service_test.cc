// Bad input never takes the coordinator down: every malformed or stale
// request gets a clear gRPC status and the next request is served.
#include <grpcpp/grpcpp.h>

#include <chrono>
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

namespace shardline::server {
namespace {

using grpc::StatusCode;

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/coordinator-service";
    const std::string& dir = dir_;
    std::filesystem::remove_all(dir);
    weights_ = std::move(*WeightStore::Open(dir));
    registry_ = std::make_unique<WorkerRegistry>(absl::Seconds(30));
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
  grpc::Status Register(const std::string& name, std::string* id = nullptr, double flops = 1e9) {
    grpc::ClientContext context;
    shardline::v1::RegisterRequest request;
    request.set_name(name);
    request.mutable_capabilities()->set_listen_address("127.0.0.1:1");
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
  bool StillServing() {
    grpc::ClientContext context;
    shardline::v1::ListJobsResponse response;
    return admin_stub_->ListJobs(&context, shardline::v1::ListJobsRequest(), &response).ok();
  }

  std::string dir_;
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

TEST_F(CoordinatorServiceTest, InvalidSpecsAreRefusedNamingTheField) {
  auto spec = Spec();
  spec.mutable_model()->set_n_heads(5);
  grpc::Status status;
  Submit(spec, &status);
  EXPECT_EQ(status.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("model.n_heads"), std::string::npos) << status.error_message();
  spec = Spec(7);  // more stages than units
  Submit(spec, &status);
  EXPECT_EQ(status.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(StillServing());
}

TEST_F(CoordinatorServiceTest, UnknownJobsAreNotFound) {
  grpc::ClientContext c1, c2, c3;
  shardline::v1::GetJobRequest request;
  request.set_job_id("job-404");
  shardline::v1::JobStatus status;
  EXPECT_EQ(admin_stub_->GetJob(&c1, request, &status).error_code(), StatusCode::NOT_FOUND);
  EXPECT_EQ(admin_stub_->CancelJob(&c2, request, &status).error_code(), StatusCode::NOT_FOUND);
  auto reader = admin_stub_->ExportWeights(&c3, request);
  shardline::v1::ExportChunk chunk;
  while (reader->Read(&chunk)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), StatusCode::NOT_FOUND);
  grpc::ClientContext c4;
  auto watch = admin_stub_->WatchJob(&c4, request);
  while (watch->Read(&status)) {
  }
  EXPECT_EQ(watch->Finish().error_code(), StatusCode::NOT_FOUND);
  shardline::v1::ReportStepRequest report;
  report.set_job_id("job-404");
  report.set_worker_id("worker-1");
  report.set_step(1);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::NOT_FOUND);
  EXPECT_TRUE(StillServing());
}

TEST_F(CoordinatorServiceTest, WorkerRegistrationIsValidated) {
  EXPECT_TRUE(Register("w0").ok());
  EXPECT_EQ(Register("w0").error_code(), StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(Register("bad name!").error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Register("w1", nullptr, /*flops=*/0).error_code(), StatusCode::INVALID_ARGUMENT);
  grpc::ClientContext context;
  shardline::v1::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id("worker-99");
  shardline::v1::HeartbeatResponse response;
  EXPECT_EQ(worker_stub_->Heartbeat(&context, heartbeat, &response).error_code(), StatusCode::NOT_FOUND);
  grpc::ClientContext watch_context;
  shardline::v1::WatchAssignmentsRequest watch;
  watch.set_worker_id("worker-99");
  auto reader = worker_stub_->WatchAssignments(&watch_context, watch);
  shardline::v1::Assignment assignment;
  while (reader->Read(&assignment)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), StatusCode::NOT_FOUND);
  EXPECT_TRUE(StillServing());
}

TEST_F(CoordinatorServiceTest, StaleOrForeignReportsAreRefused) {
  std::string worker;
  ASSERT_TRUE(Register("w0", &worker).ok());
  grpc::Status status;
  const shardline::v1::JobStatus job = Submit(Spec(), &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(job.state(), shardline::v1::RUNNING);
  shardline::v1::ReportStepRequest report;
  report.set_job_id(job.job_id());
  report.set_plan_epoch(job.plan_epoch());
  report.set_worker_id(worker);
  report.set_step(1);
  report.set_plan_epoch(job.plan_epoch() + 1);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::FAILED_PRECONDITION) << "stale epoch";
  report.set_plan_epoch(job.plan_epoch());
  report.set_worker_id("worker-77");
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::NOT_FOUND) << "no such worker";
  report.set_worker_id(worker);
  report.set_stage(3);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::INVALID_ARGUMENT);
  report.set_stage(0);
  report.set_step(99);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::INVALID_ARGUMENT);
  report.set_step(1);
  EXPECT_TRUE(ReportStep(report).ok());
  EXPECT_TRUE(ReportStep(report).ok()) << "a retried report is fine";

  shardline::v1::ShardChunk chunk;
  auto* header = chunk.mutable_header();
  header->set_job_id(job.job_id());
  header->set_worker_id(worker);
  header->set_plan_epoch(job.plan_epoch());
  header->set_stages(1);
  header->set_step(1);
  header->set_total_bytes(10);
  chunk.set_data(std::string(10, 'x'));  // not a safetensors file
  EXPECT_EQ(ReportShard({chunk}).error_code(), StatusCode::DATA_LOSS) << "another digest than the header's";
  header->set_digest(common::ShardDigest::Of(chunk.data()));
  EXPECT_EQ(ReportShard({chunk}).error_code(), StatusCode::INVALID_ARGUMENT) << "garbage bytes";
  header->set_total_bytes(100);
  EXPECT_EQ(ReportShard({chunk}).error_code(), StatusCode::INVALID_ARGUMENT) << "truncated";
  shardline::v1::ShardChunk headless;
  headless.set_data("abc");
  EXPECT_EQ(ReportShard({headless}).error_code(), StatusCode::INVALID_ARGUMENT) << "no header";
  header->set_total_bytes(int64_t{1} << 40);
  EXPECT_EQ(ReportShard({chunk}).error_code(), StatusCode::INVALID_ARGUMENT) << "absurd size";
  // Under the 16 GiB a shard may be, but more than this stage's weights and
  // optimizer state: refused before a byte is stored.
  header->set_total_bytes(int64_t{1} << 30);
  chunk.clear_data();
  grpc::Status big = ReportShard({chunk});
  EXPECT_EQ(big.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(big.error_message().find("optimizer state are at most"), std::string::npos) << big.error_message();

  // A stage error fails the job with the stage and worker named.
  report.set_step(2);
  report.set_error("the backend ran out of memory");
  report.set_error_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(ReportStep(report).ok());
  grpc::ClientContext context;
  shardline::v1::GetJobRequest get;
  get.set_job_id(job.job_id());
  shardline::v1::JobStatus after;
  ASSERT_TRUE(admin_stub_->GetJob(&context, get, &after).ok());
  EXPECT_EQ(after.state(), shardline::v1::FAILED);
  EXPECT_NE(after.message().find("stage 0 (worker w0)"), std::string::npos) << after.message();
  EXPECT_TRUE(StillServing());
}

// A shard stream that broke is resumed by the next one from the bytes the
// coordinator holds: a stream starting elsewhere is told where, at once.
TEST_F(CoordinatorServiceTest, ABrokenShardUploadResumesWhereTheCoordinatorsCopyEnds) {
  std::string worker;
  ASSERT_TRUE(Register("w0", &worker).ok());
  grpc::Status status;
  const shardline::v1::JobStatus job = Submit(Spec(1, 1024), &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string file = ShardFile();
  const int64_t half = static_cast<int64_t>(file.size()) / 2 + 3;
  shardline::v1::ReportShardResponse response;
  EXPECT_EQ(ReportShard(Chunks(job, file, 0, half), &response).error_code(), StatusCode::INVALID_ARGUMENT)
      << "a stream that ends short";
  EXPECT_FALSE(response.stored());

  response.Clear();
  ASSERT_TRUE(ReportShard(Chunks(job, file, 0, static_cast<int64_t>(file.size())), &response).ok());
  EXPECT_FALSE(response.stored());
  EXPECT_EQ(response.resume_offset(), half) << "where the coordinator's copy ends";

  response.Clear();
  status = ReportShard(Chunks(job, file, half, static_cast<int64_t>(file.size())), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(response.stored());
  EXPECT_TRUE(response.committed());
  ASSERT_EQ(*weights_->CommittedStep(job.job_id()), 5);
  auto exported = weights_->ExportWeights(job.job_id(), {});
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->tensors.at("blocks.0.mlp.fc.weight").values<float>()[7], 0.5f);

  response.Clear();
  ASSERT_TRUE(ReportShard(Chunks(job, file, 0, static_cast<int64_t>(file.size())), &response).ok())
      << "the same shard again is fine";
  EXPECT_TRUE(response.stored());
  EXPECT_FALSE(response.committed());
}

// A stream whose job moved on (here: cancelled) ends at its next chunk
// instead of after the whole shard: of 128 MiB, the worker cannot write
// all (HTTP/2's windows hold far less).
TEST_F(CoordinatorServiceTest, AShardStreamEndsAtItsNextChunkOnceItsEpochIsStale) {
  std::string worker;
  ASSERT_TRUE(Register("w0", &worker).ok());
  grpc::Status status;
  const shardline::v1::JobStatus job = Submit(Spec(1, 1024), &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string file = ShardFile(16 << 10);
  std::vector<shardline::v1::ShardChunk> chunks = Chunks(job, file, 0, static_cast<int64_t>(file.size()));
  ASSERT_GT(chunks.size(), 2u);
  grpc::ClientContext context;
  Sign(context);
  shardline::v1::ReportShardResponse response;
  auto writer = worker_stub_->ReportShard(&context, &response);
  ASSERT_TRUE(writer->Write(chunks[0]));
  // Once the coordinator has begun the upload, its file is there.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (std::filesystem::is_empty(dir_ + "/.uploads")) {
    ASSERT_LT(absl::Now(), give_up) << "the first stream never began its upload";
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(jobs_->Cancel(job.job_id()).ok());
  size_t written = 1;
  while (written < chunks.size() && writer->Write(chunks[written])) ++written;
  EXPECT_LT(written, chunks.size()) << "the coordinator read the stale stream to its end";
  writer->WritesDone();
  status = writer->Finish();
  EXPECT_EQ(status.error_code(), StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_NE(status.error_message().find("not running"), std::string::npos) << status.error_message();
  EXPECT_FALSE(response.stored());
  EXPECT_TRUE(StillServing());
}

// A worker whose assignment stream broke watches again: the new stream gets
// the assignment the coordinator made while no stream was open, and one made
// later (issue 13's first defect: the closed mailbox used to be reused, so
// the worker never got an assignment again).
TEST_F(CoordinatorServiceTest, AWorkerWatchingAgainAfterItsStreamBrokeGetsItsAssignments) {
  std::string worker;
  ASSERT_TRUE(Register("w0", &worker).ok());
  auto watch = [&](grpc::ClientContext& context) {
    shardline::v1::WatchAssignmentsRequest request;
    request.set_worker_id(worker);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    Sign(context);
    return worker_stub_->WatchAssignments(&context, request);
  };
  {
    grpc::ClientContext first;
    auto reader = watch(first);
    first.TryCancel();  // the stream breaks
    shardline::v1::Assignment ignored;
    while (reader->Read(&ignored)) {
    }
    (void)reader->Finish();
  }
  absl::SleepFor(absl::Milliseconds(200));  // the coordinator has seen it go
  grpc::Status status;
  const shardline::v1::JobStatus job = Submit(Spec(), &status);  // assigned while no stream is open
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(job.state(), shardline::v1::RUNNING);
  grpc::ClientContext second;
  auto reader = watch(second);
  shardline::v1::Assignment assignment;
  ASSERT_TRUE(reader->Read(&assignment)) << "the assignment never came on the new stream";
  EXPECT_EQ(assignment.job_id(), job.job_id());
  EXPECT_EQ(assignment.plan_epoch(), job.plan_epoch());
  EXPECT_FALSE(assignment.cancel());
  // And what comes later (here: the cancellation) reaches it too.
  grpc::ClientContext cancel_context;
  shardline::v1::GetJobRequest cancel;
  cancel.set_job_id(job.job_id());
  shardline::v1::JobStatus cancelled;
  ASSERT_TRUE(admin_stub_->CancelJob(&cancel_context, cancel, &cancelled).ok());
  ASSERT_TRUE(reader->Read(&assignment));
  EXPECT_EQ(assignment.job_id(), job.job_id());
  EXPECT_TRUE(assignment.cancel());
  second.TryCancel();
  while (reader->Read(&assignment)) {
  }
  (void)reader->Finish();
}

// The hostile-client probes: a 1 MB job name, 1 MB ids (their errors echoed
// the whole input and came back RESOURCE_EXHAUSTED), a huge worker
// description, a report with no worker id and absurd numbers. Each gets a
// short INVALID_ARGUMENT, and the coordinator serves on.
TEST_F(CoordinatorServiceTest, OversizedAndForgedRequestsGetShortClearErrors) {
  const std::string mb(1 << 20, 'j');
  grpc::ClientContext c1;
  shardline::v1::GetJobRequest get;
  get.set_job_id(mb);
  shardline::v1::JobStatus status;
  grpc::Status got = admin_stub_->GetJob(&c1, get, &status);
  EXPECT_EQ(got.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(got.error_message().size(), 100u) << got.error_message().substr(0, 200);

  auto spec = Spec();
  spec.set_name(mb);
  grpc::Status submitted;
  Submit(spec, &submitted);
  EXPECT_EQ(submitted.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(submitted.error_message().size(), 100u);

  grpc::ClientContext c2;
  shardline::v1::RegisterRequest request;
  request.set_name("w9");
  request.mutable_capabilities()->set_listen_address("127.0.0.1:1");
  request.mutable_capabilities()->set_gemm_flops(1e9);
  request.mutable_capabilities()->set_memory_bytes(int64_t{1} << 30);
  request.mutable_capabilities()->set_description(std::string(2 << 20, 'd'));
  shardline::v1::RegisterResponse registered;
  got = worker_stub_->Register(&c2, request, &registered);
  EXPECT_EQ(got.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(got.error_message().find("capabilities.description"), std::string::npos) << got.error_message();

  std::string worker;
  ASSERT_TRUE(Register("w0", &worker).ok());
  const shardline::v1::JobStatus job = Submit(Spec(), &submitted);
  ASSERT_TRUE(submitted.ok());
  shardline::v1::ReportStepRequest report;
  report.set_job_id(job.job_id());
  report.set_plan_epoch(job.plan_epoch());
  report.set_step(1);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::INVALID_ARGUMENT) << "no worker id";
  report.set_worker_id(worker);
  report.set_step_seconds(-5e300);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::INVALID_ARGUMENT) << "negative seconds";
  report.set_step_seconds(0.1);
  report.set_tokens(-1);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::INVALID_ARGUMENT) << "negative tokens";
  report.set_tokens(24);
  EXPECT_TRUE(ReportStep(report).ok());
  EXPECT_TRUE(StillServing());
}

// Watchers of one job are bounded; a stream that went away frees its place.
TEST_F(CoordinatorServiceTest, AJobTakesABoundedNumberOfWatchers) {
  ASSERT_TRUE(Register("w0").ok());
  grpc::Status submitted;
  const shardline::v1::JobStatus job = Submit(Spec(), &submitted);
  ASSERT_TRUE(submitted.ok());
  shardline::v1::GetJobRequest request;
  request.set_job_id(job.job_id());
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<shardline::v1::JobStatus>>> watches;
  shardline::v1::JobStatus status;
  for (size_t i = 0; i < RunningJob::kMaxWatchers; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    watches.push_back(admin_stub_->WatchJob(contexts.back().get(), request));
    ASSERT_TRUE(watches.back()->Read(&status)) << "watcher " << i;
  }
  grpc::ClientContext extra;
  auto refused = admin_stub_->WatchJob(&extra, request);
  while (refused->Read(&status)) {
  }
  EXPECT_EQ(refused->Finish().error_code(), StatusCode::RESOURCE_EXHAUSTED);
  contexts[0]->TryCancel();
  (void)watches[0]->Finish();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  bool admitted = false;
  while (!admitted && absl::Now() < give_up) {
    grpc::ClientContext again;
    auto watch = admin_stub_->WatchJob(&again, request);
    admitted = watch->Read(&status);
    again.TryCancel();
    (void)watch->Finish();
    if (!admitted) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(admitted) << "a cancelled watcher's place is free again";
  for (auto& c : contexts) c->TryCancel();
  for (size_t i = 1; i < watches.size(); ++i) (void)watches[i]->Finish();
}

// The hostile-client probe: ReportStep with an empty worker_id was accepted
// for every stage, and forged shards committed. A worker's calls must carry
// its registration's secret, and only a position's own worker may report it.
TEST_F(CoordinatorServiceTest, ReportsAndShardsComeOnlyFromThePositionsWorkerWithItsSecret) {
  std::string holder, other;
  ASSERT_TRUE(Register("w0", &holder).ok());
  grpc::Status submitted;
  const shardline::v1::JobStatus job = Submit(Spec(), &submitted);
  ASSERT_TRUE(submitted.ok());
  ASSERT_TRUE(Register("w1", &other).ok());  // idle: holds no position
  shardline::v1::ReportStepRequest report;
  report.set_job_id(job.job_id());
  report.set_plan_epoch(job.plan_epoch());
  report.set_worker_id(holder);
  report.set_step(1);
  report.set_tokens(24);

  grpc::ClientContext unsigned_call;
  shardline::v1::ReportStepResponse response;
  EXPECT_EQ(worker_stub_->ReportStep(&unsigned_call, report, &response).error_code(), StatusCode::UNAUTHENTICATED)
      << "no secret";
  grpc::ClientContext signed_by_other;
  Sign(signed_by_other, other);
  EXPECT_EQ(worker_stub_->ReportStep(&signed_by_other, report, &response).error_code(), StatusCode::UNAUTHENTICATED)
      << "another worker's secret";
  report.set_worker_id(other);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::FAILED_PRECONDITION) << "its own secret, not its position";

  const std::string file = ShardFile(4);
  std::vector<shardline::v1::ShardChunk> chunks = Chunks(job, file, 0, static_cast<int64_t>(file.size()));
  chunks[0].mutable_header()->set_worker_id(other);
  EXPECT_EQ(ReportShard(chunks).error_code(), StatusCode::FAILED_PRECONDITION) << "a shard of a position it lacks";
  chunks[0].mutable_header()->set_worker_id(holder);
  grpc::ClientContext forged;
  Sign(forged, other);
  shardline::v1::ReportShardResponse stored;
  auto writer = worker_stub_->ReportShard(&forged, &stored);
  for (const auto& c : chunks) writer->Write(c);
  writer->WritesDone();
  EXPECT_EQ(writer->Finish().error_code(), StatusCode::UNAUTHENTICATED) << "the holder's id, another's secret";
  EXPECT_FALSE(stored.stored());

  grpc::ClientContext heartbeat;
  shardline::v1::HeartbeatRequest beat;
  beat.set_worker_id(holder);
  shardline::v1::HeartbeatResponse beat_response;
  EXPECT_EQ(worker_stub_->Heartbeat(&heartbeat, beat, &beat_response).error_code(), StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(StillServing());
}

}  // namespace
}  // namespace shardline::server
