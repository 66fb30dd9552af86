// Stage links over gRPC on loopback, in whole pipelines: a 3-stage pipeline
// whose stages talk through StageLink.Exchange must train exactly like the
// reference trainer, with tensors split into many chunks; half-precision and
// 8-bit wires; received bytes and page faults in the step report; tensors
// travel through staging slots that come back, within a staging budget.
// (One link at a time: grpc_stage_link_connect_test.cc; misbehaving peers:
// stage_link_service_test.cc.)
#include <grpcpp/grpcpp.h>

#include <sys/mman.h>

#include <map>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/int8_blocks.h"
#include "gtest/gtest.h"
#include "tests/testing/local_pipeline.h"
#include "tests/worker/nn/nn_test_util.h"
#include "tests/worker/transport/stage_link_test_util.h"
#include "worker/runtime/pipeline_stage.h"
#include "worker/trainer/trainer.h"

namespace shardline::worker::transport {
namespace {

using runtime::LargestLinkTensorBytes;
using runtime::PipelineStage;
using runtime::ScheduleKind;
using runtime::ShardRuntime;
using runtime::StageStepResult;

// Runs 3 steps of a 3-stage pipeline (cut at units 1 and 3) over gRPC;
// returns the losses.
std::vector<double> GrpcPipelineLosses(const shardline::v1::JobSpec& spec, common::DType wire);

TEST(GrpcStageLinkTest, ThreeStagePipelineMatchesTheReferenceTrainer) {
  auto spec = testing::TinySpec(3, 6);
  spec.mutable_parallel()->set_pipeline_stages(3);
  auto backend = testing::CpuBackend();
  auto reference = trainer::Trainer::Create(spec, *backend);
  ASSERT_TRUE(reference.ok());
  const std::vector<double> losses = GrpcPipelineLosses(spec, common::DType::kF32);
  ASSERT_EQ(losses.size(), 3u);
  for (int step = 1; step <= 3; ++step) {
    auto want = (*reference)->TrainStep(step);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(losses[step - 1], want->loss) << "step " << step;
  }
}

// bf16 on the wire: exactly what the in-process links give with the same
// rounding, and within 1% of the f32 run.
TEST(GrpcStageLinkTest, Bf16WireMatchesTheLocalRoundingAndStaysCloseToF32) {
  auto spec = testing::TinySpec(3, 6);
  spec.mutable_parallel()->set_pipeline_stages(3);
  spec.mutable_parallel()->set_wire_dtype("bf16");
  const std::vector<double> grpc_losses = GrpcPipelineLosses(spec, common::DType::kBF16);
  auto local = shardline::testing::LocalPipeline::Create(spec, {1, 3});
  ASSERT_TRUE(local.ok()) << local.status();
  auto backend = testing::CpuBackend();
  spec.mutable_parallel()->set_wire_dtype("f32");
  auto reference = trainer::Trainer::Create(spec, *backend);
  ASSERT_TRUE(reference.ok());
  ASSERT_EQ(grpc_losses.size(), 3u);
  for (int step = 1; step <= 3; ++step) {
    auto got = (*local)->RunStep(step);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(grpc_losses[step - 1], got->back().loss) << "step " << step;
    auto f32 = (*reference)->TrainStep(step);
    ASSERT_TRUE(f32.ok());
    EXPECT_NEAR(grpc_losses[step - 1], f32->loss, 1e-2 * f32->loss) << "step " << step;
  }
}

// Runs `steps` steps of a pipeline cut at `cuts` (first unit of each stage,
// then the unit count) over gRPC, each stage's staging slots from `memory`
// (plain host memory when unset); every stage's result of every step.
std::vector<std::vector<StageStepResult>> RunGrpcPipeline(const shardline::v1::JobSpec& spec,
                                                          common::DType wire, std::vector<int> cuts,
                                                          int steps, std::optional<HostMemory> memory = {},
                                                          WireCodec codec = WireCodec::kAsIs) {
  const auto config = nn::ModelConfig::FromSpec(spec.model());
  const auto optimizer = nn::OptimizerConfig::FromSpec(spec.train());
  auto data = data::CreateDataSource(spec);
  if (!data.ok()) {
    ADD_FAILURE() << data.status();
    return {};
  }
  cuts.push_back(config.units());
  const int p = static_cast<int>(cuts.size()) - 1;
  const int m = spec.train().micro_batches();

  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<ShardRuntime>> runtimes;
  std::vector<std::unique_ptr<GrpcStageLink>> links;
  std::vector<std::unique_ptr<PipelineStage>> stages;
  for (int s = 0; s < p; ++s) servers.push_back(StartServer());
  for (int s = 0; s < p; ++s) {
    backends.push_back(testing::CpuBackend());
    auto runtime = ShardRuntime::Create(*backends[s], config, cuts[s], cuts[s + 1], 5, optimizer);
    if (!runtime.ok()) {
      ADD_FAILURE() << runtime.status();
      return {};
    }
    runtimes.push_back(std::move(*runtime));
    GrpcStageLinkOptions options = Options(s, p, servers[s].get(), s ? servers[s - 1].get() : nullptr);
    options.staging_slot_bytes = LargestLinkTensorBytes(spec);
    if (memory.has_value()) options.staging_memory = *memory;
    options.to_next = options.to_previous = codec;
    auto link = GrpcStageLink::Create(options);
    if (!link.ok()) {
      ADD_FAILURE() << link.status();
      return {};
    }
    links.push_back(std::move(*link));
    auto stage = PipelineStage::Create(*runtimes[s], data->get(), *links[s],
                                       {ScheduleKind::kOneFOneB, p, s, m, spec.train().global_batch(), wire});
    if (!stage.ok()) {
      ADD_FAILURE() << stage.status();
      return {};
    }
    stages.push_back(std::move(*stage));
  }
  std::vector<std::vector<StageStepResult>> out;
  for (int step = 1; step <= steps; ++step) {
    std::vector<absl::StatusOr<StageStepResult>> results(p, absl::UnknownError(""));
    std::vector<std::thread> threads;
    for (int s = 0; s < p; ++s) threads.emplace_back([&, s] { results[s] = stages[s]->RunStep(step); });
    for (auto& t : threads) t.join();
    std::vector<StageStepResult> step_results;
    for (auto& r : results) {
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) step_results.push_back(*r);
    }
    if (step_results.size() != results.size()) break;
    out.push_back(std::move(step_results));
  }
  links.clear();
  for (auto& s : servers) s->server->Shutdown();
  return out;
}

std::vector<double> GrpcPipelineLosses(const shardline::v1::JobSpec& spec, common::DType wire) {
  std::vector<double> losses;
  for (const auto& step : RunGrpcPipeline(spec, wire, {0, 1, 3}, 3)) {
    EXPECT_EQ(step.front().grad_norm, step.back().grad_norm);
    losses.push_back(step.back().loss);
  }
  return losses;
}

// Host memory straight from the kernel, in 4 KiB pages (no transparent huge
// pages): nothing has touched it, so writing N pages of it makes N minor
// page faults.
HostMemory FreshPages() {
  auto sizes = std::make_shared<std::map<void*, size_t>>();
  auto mu = std::make_shared<absl::Mutex>();
  HostMemory memory;
  memory.allocate = [sizes, mu](size_t bytes) -> absl::StatusOr<void*> {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return absl::ResourceExhaustedError("mmap");
    ::madvise(p, bytes, MADV_NOHUGEPAGE);
    absl::MutexLock lock(mu.get());
    (*sizes)[p] = bytes;
    return p;
  };
  memory.release = [sizes, mu](void* p) {
    absl::MutexLock lock(mu.get());
    ::munmap(p, sizes->at(p));
    sizes->erase(p);
  };
  return memory;
}

// The step report's received bytes and page faults (the coordinator's
// "minor faults per GiB received"): a stage that receives a tensor into
// staging slots nobody has touched must fault in every page of it.
TEST(GrpcStageLinkTest, AStepCountsTheBytesItReceivedAndThePageFaultsTheyCost) {
  auto spec = testing::TinySpec(/*micro_batches=*/2, /*global_batch=*/128);
  spec.mutable_model()->set_context(16);
  spec.mutable_model()->set_d_model(256);
  spec.mutable_model()->set_n_heads(4);
  spec.mutable_parallel()->set_pipeline_stages(2);
  // 64 sequences × 9 tokens ("37+85=" and three answer digits) × 256
  // floats: 576 KiB per micro-batch each way.
  auto data = data::CreateDataSource(spec);
  ASSERT_TRUE(data.ok());
  ASSERT_EQ((*data)->TrainBatch(1, 0, 64).value().t, 9);
  const uint64_t tensor_bytes = 64 * 9 * 256 * sizeof(float);
  const auto results = RunGrpcPipeline(spec, common::DType::kF32, {0, 2}, 1, FreshPages());
  ASSERT_EQ(results.size(), 1u);
  for (const StageStepResult& stage : results[0]) {
    // Activations in on the last stage, gradients in on the first: two
    // micro-batches of payload (targets and norms travel in frame headers).
    EXPECT_EQ(stage.received_bytes, 2 * tensor_bytes) << "stage " << &stage - &results[0][0];
    EXPECT_GE(stage.minor_faults, static_cast<int64_t>(tensor_bytes / 4096))
        << "the first tensor landed in fresh pages: at least one fault per 4 KiB page";
  }
}

// 8-bit blocks on both directions of every link (parallel.wire_dtype
// "int8"): each tensor crosses as Int8BlocksBytes of payload, about a
// quarter of f32's, and a 3-stage pipeline's losses stay within 1% of the
// f32 reference's, without matching it (the values were quantized).
TEST(GrpcStageLinkTest, Int8LinksCarryAQuarterOfTheBytesAndStayCloseToF32) {
  auto spec = testing::TinySpec(/*micro_batches=*/2, /*global_batch=*/128);
  spec.mutable_model()->set_context(16);
  spec.mutable_model()->set_d_model(256);
  spec.mutable_model()->set_n_heads(4);
  spec.mutable_parallel()->set_pipeline_stages(2);
  const size_t values = 64 * 9 * 256;  // a micro-batch's activation (or gradient)
  const auto results = RunGrpcPipeline(spec, common::DType::kF32, {0, 2}, 1, {}, WireCodec::kInt8Blocks);
  ASSERT_EQ(results.size(), 1u);
  for (const StageStepResult& stage : results[0]) {
    EXPECT_EQ(stage.received_bytes, 2 * common::Int8BlocksBytes(values)) << "stage " << &stage - &results[0][0];
    EXPECT_LT(stage.received_bytes, 2 * values * sizeof(float) * 27 / 100);
  }

  auto three = testing::TinySpec(3, 6);
  three.mutable_parallel()->set_pipeline_stages(3);
  auto backend = testing::CpuBackend();
  auto reference = trainer::Trainer::Create(three, *backend);
  ASSERT_TRUE(reference.ok());
  const auto steps = RunGrpcPipeline(three, common::DType::kF32, {0, 1, 3}, 3, {}, WireCodec::kInt8Blocks);
  ASSERT_EQ(steps.size(), 3u);
  bool differs = false;
  for (int step = 1; step <= 3; ++step) {
    auto want = (*reference)->TrainStep(step);
    ASSERT_TRUE(want.ok());
    const double got = steps[step - 1].back().loss;
    EXPECT_NEAR(got, want->loss, 1e-2 * want->loss) << "step " << step;
    differs = differs || got != want->loss;
  }
  EXPECT_TRUE(differs) << "8-bit links gave the f32 losses exactly: were the values quantized at all?";
}

// Tensors a stage sends are written into the link's staging slots and go
// out without a copy; received ones land in the receiver's slots; slots come
// back once written or dropped; a tensor too large for a slot uses the heap.
TEST(GrpcStageLinkTest, TensorsTravelThroughStagingSlotsThatComeBack) {
  auto server = StartServer();
  ExchangeOptions receiving = Exchange(absl::Seconds(5));
  auto receive_pool = StagingPool::Create(4096, 4, PlainHostMemory());
  ASSERT_TRUE(receive_pool.ok());
  receiving.receive_pool = *receive_pool;
  auto receiver = server->service->Expect("job-1", 7, 0, receiving);
  GrpcStageLinkOptions options = Options(1, 2, server.get(), server.get(), 7, absl::Seconds(2));
  options.staging_slot_bytes = 4096;
  auto link = GrpcStageLink::Create(options);
  ASSERT_TRUE(link.ok());
  for (int i = 0; i < 40; ++i) {  // more than the link's slots: they must come back
    HostBuffer values = (*link)->OutgoingBuffer(StageMessage::Kind::kGradient, 1000);
    EXPECT_TRUE(values.staged()) << "message " << i;
    for (size_t j = 0; j < values.size(); ++j) values[j] = static_cast<float>(i * j);
    StageMessage gradient;
    gradient.kind = StageMessage::Kind::kGradient;
    gradient.step = i;
    gradient.values = std::move(values);
    const HostBuffer sent = gradient.values;
    ASSERT_TRUE((*link)->SendToPrevious(std::move(gradient)).ok());
    auto received = receiver->Receive();
    ASSERT_TRUE(received.ok()) << received.status();
    EXPECT_TRUE(received->values.staged());
    EXPECT_EQ(received->values, sent);
  }
  EXPECT_GE((*link)->PeakStagingSlots(), 1);
  EXPECT_EQ((*receive_pool)->free_slots(), 4) << "every received slot was let go";

  HostBuffer large = (*link)->OutgoingBuffer(StageMessage::Kind::kGradient, 2000);
  EXPECT_FALSE(large.staged()) << "8000 bytes do not fit a 4096-byte slot";
  for (size_t j = 0; j < large.size(); ++j) large[j] = static_cast<float>(j);
  StageMessage gradient;
  gradient.kind = StageMessage::Kind::kGradient;
  gradient.values = large;
  ASSERT_TRUE((*link)->SendToPrevious(gradient).ok());
  auto received = receiver->Receive();
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_FALSE(received->values.staged());
  EXPECT_EQ(received->values, large);
  link->reset();
  server->server->Shutdown();
}

// A budget smaller than the pools would like shrinks them; when every slot
// is taken, or none fits the budget at all, tensors use the heap and still
// travel.
TEST(GrpcStageLinkTest, AStagingBudgetShrinksThePoolsAndTheHeapTakesTheRest) {
  auto server = StartServer();
  auto receiver = server->service->Expect("job-1", 7, 0, Exchange(absl::Seconds(5)));
  GrpcStageLinkOptions options = Options(1, 2, server.get(), server.get());
  options.staging_slot_bytes = 4096;
  options.staging_budget_bytes = 4 * 4096;  // room for 4 of the 21 slots one neighbour wants
  auto link = GrpcStageLink::Create(options);
  ASSERT_TRUE(link.ok()) << link.status();
  HostBuffer first = (*link)->OutgoingBuffer(StageMessage::Kind::kGradient, 1000);
  HostBuffer second = (*link)->OutgoingBuffer(StageMessage::Kind::kGradient, 1000);
  EXPECT_TRUE(first.staged());
  EXPECT_FALSE(second.staged()) << "the one sending slot is taken";
  for (HostBuffer* values : {&first, &second}) {
    for (size_t j = 0; j < values->size(); ++j) (*values)[j] = static_cast<float>(j);
    StageMessage gradient;
    gradient.kind = StageMessage::Kind::kGradient;
    gradient.values = std::move(*values);
    ASSERT_TRUE((*link)->SendToPrevious(std::move(gradient)).ok());
    auto received = receiver->Receive();
    ASSERT_TRUE(received.ok()) << received.status();
    EXPECT_EQ(received->values.size(), 1000u);
    EXPECT_EQ(received->values[999], 999.0f);
  }
  link->reset();

  options.job_id = "job-2";
  options.staging_budget_bytes = 4096;  // not even one slot per pool
  auto no_slots = GrpcStageLink::Create(options);
  ASSERT_TRUE(no_slots.ok()) << no_slots.status();
  EXPECT_FALSE((*no_slots)->OutgoingBuffer(StageMessage::Kind::kGradient, 1000).staged());
  EXPECT_EQ((*no_slots)->PeakStagingSlots(), 0);
  no_slots->reset();
  server->server->Shutdown();
}

}  // namespace
}  // namespace shardline::worker::transport
