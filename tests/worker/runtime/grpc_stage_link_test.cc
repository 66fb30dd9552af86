// Stage links over gRPC on loopback: a 3-stage pipeline whose stages talk
// through StageLink.Exchange must train exactly like the reference trainer,
// with tensors split into many chunks; bad peers (stale epoch, unknown job,
// a second connection, malformed frames, frames beyond their credit) get a
// clear status and the service keeps serving; a slow receiver holds a fast
// sender to bounded memory; a dead upstream worker fails the step promptly.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/worker/nn/nn_test_util.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "shardline/v1/stage_link.grpc.pb.h"
#include "tests/testing/local_pipeline.h"
#include "worker/runtime/grpc_stage_link.h"
#include "worker/runtime/pipeline_stage.h"
#include "worker/runtime/stage_link_service.h"
#include "worker/trainer/trainer.h"

namespace shardline::worker::runtime {
namespace {

using shardline::v1::StageFrame;

struct Server {
  std::unique_ptr<StageLinkService> service = std::make_unique<StageLinkService>();
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

std::unique_ptr<Server> StartServer() {
  auto s = std::make_unique<Server>();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddChannelArgument("grpc.so_reuseport", 0);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  s->service->RegisterWith(builder);
  s->server = builder.BuildAndStart();
  EXPECT_NE(port, 0);
  s->address = absl::StrCat("127.0.0.1:", port);
  return s;
}

ExchangeOptions Exchange(absl::Duration timeout) {
  ExchangeOptions o;
  o.timeout = timeout;
  o.chunk_bytes = 1000;  // force many chunks per tensor
  return o;
}

GrpcStageLinkOptions Options(int stage, int stages, Server* own, Server* upstream,
                             uint64_t epoch = 7, absl::Duration timeout = absl::Seconds(30)) {
  GrpcStageLinkOptions o;
  o.job_id = "job-1";
  o.plan_epoch = epoch;
  o.stage = stage;
  o.stages = stages;
  o.service = own->service.get();
  if (upstream != nullptr) o.upstream_address = upstream->address;
  o.exchange = Exchange(timeout);
  return o;
}

// Runs 3 steps of a 3-stage pipeline over gRPC; returns the losses.
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

std::vector<double> GrpcPipelineLosses(const shardline::v1::JobSpec& spec, common::DType wire) {
  const auto config = nn::ModelConfig::FromSpec(spec.model());
  const auto optimizer = nn::OptimizerConfig::FromSpec(spec.train());
  auto data = data::CreateDataSource(spec);
  if (!data.ok()) {
    ADD_FAILURE() << data.status();
    return {};
  }
  const int cuts[4] = {0, 1, 3, config.units()};

  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<ShardRuntime>> runtimes;
  std::vector<std::unique_ptr<GrpcStageLink>> links;
  std::vector<std::unique_ptr<PipelineStage>> stages;
  for (int s = 0; s < 3; ++s) servers.push_back(StartServer());
  for (int s = 0; s < 3; ++s) {
    backends.push_back(testing::CpuBackend());
    auto runtime = ShardRuntime::Create(*backends[s], config, cuts[s], cuts[s + 1], 5, optimizer);
    if (!runtime.ok()) {
      ADD_FAILURE() << runtime.status();
      return {};
    }
    runtimes.push_back(std::move(*runtime));
    GrpcStageLinkOptions options = Options(s, 3, servers[s].get(), s ? servers[s - 1].get() : nullptr);
    options.exchange.wire = wire;
    options.staging_slot_bytes = LargestLinkTensorBytes(spec);
    auto link = GrpcStageLink::Create(options);
    if (!link.ok()) {
      ADD_FAILURE() << link.status();
      return {};
    }
    links.push_back(std::move(*link));
    auto stage = PipelineStage::Create(*runtimes[s], data->get(), *links[s],
                                       {ScheduleKind::kOneFOneB, 3, s, 3, 6});
    if (!stage.ok()) {
      ADD_FAILURE() << stage.status();
      return {};
    }
    stages.push_back(std::move(*stage));
  }
  std::vector<double> losses;
  for (int step = 1; step <= 3; ++step) {
    std::vector<absl::StatusOr<StageStepResult>> results(3, absl::UnknownError(""));
    std::vector<std::thread> threads;
    for (int s = 0; s < 3; ++s) threads.emplace_back([&, s] { results[s] = stages[s]->RunStep(step); });
    for (auto& t : threads) t.join();
    for (auto& r : results) EXPECT_TRUE(r.ok()) << r.status();
    if (!results[2].ok()) break;
    EXPECT_EQ(results[0]->grad_norm, results[2]->grad_norm);
    losses.push_back(results[2]->loss);
  }
  links.clear();
  for (auto& s : servers) s->server->Shutdown();
  return losses;
}

// A raw Exchange call, for playing a misbehaving peer.
class RawPeer {
 public:
  explicit RawPeer(const std::string& address)
      : stub_(shardline::v1::StageLink::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    stream_ = stub_->Exchange(&context_);
  }
  bool Write(const StageFrame& frame) { return stream_->Write(frame); }
  grpc::Status Finish() {
    stream_->WritesDone();
    StageFrame ignored;
    while (stream_->Read(&ignored)) {
    }
    return stream_->Finish();
  }

 private:
  std::unique_ptr<shardline::v1::StageLink::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<StageFrame, StageFrame>> stream_;
};

StageFrame Hello(const std::string& job, uint64_t epoch, int stage) {
  StageFrame f;
  f.mutable_hello()->set_job_id(job);
  f.mutable_hello()->set_plan_epoch(epoch);
  f.mutable_hello()->set_stage(stage);
  f.set_credit(4);
  return f;
}

TEST(GrpcStageLinkTest, WrongPeersGetClearStatusesAndTheServiceKeepsServing) {
  auto server = StartServer();
  auto stream = server->service->Expect("job-1", 7, 0, Exchange(absl::Seconds(5)));

  RawPeer unknown_job(server->address);
  unknown_job.Write(Hello("job-2", 7, 1));
  EXPECT_EQ(unknown_job.Finish().error_code(), grpc::StatusCode::NOT_FOUND);

  RawPeer stale(server->address);
  stale.Write(Hello("job-1", 6, 1));
  const grpc::Status stale_status = stale.Finish();
  EXPECT_EQ(stale_status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(stale_status.error_message().find("epoch 6"), std::string::npos);

  RawPeer no_hello(server->address);
  StageFrame data;
  data.set_kind(StageFrame::GRADIENT);
  no_hello.Write(data);
  EXPECT_EQ(no_hello.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // A real link with a stale epoch learns why it was refused.
  auto stale_link = GrpcStageLink::Create(Options(1, 2, server.get(), server.get(), /*epoch=*/5));
  ASSERT_TRUE(stale_link.ok());
  auto refused = (*stale_link)->ReceiveFromPrevious();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("epoch 5"), std::string::npos) << refused.status();
  stale_link->reset();

  // The right peer still connects, and a second one for the same stage is refused.
  auto good = GrpcStageLink::Create(Options(1, 2, server.get(), server.get()));
  ASSERT_TRUE(good.ok());
  StageMessage gradient;
  gradient.kind = StageMessage::Kind::kGradient;
  gradient.step = 1;
  gradient.values = {1.0f, 2.0f, 3.0f};
  ASSERT_TRUE((*good)->SendToPrevious(gradient).ok());
  auto received = stream->Receive();
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->values, gradient.values);
  RawPeer second(server->address);
  second.Write(Hello("job-1", 7, 1));
  EXPECT_EQ(second.Finish().error_code(), grpc::StatusCode::ALREADY_EXISTS);
  good->reset();
  server->server->Shutdown();
}

TEST(GrpcStageLinkTest, OtherMethodsAreUnimplementedAndTheServiceKeepsServing) {
  auto server = StartServer();
  auto stub = shardline::v1::Coordinator::NewStub(
      grpc::CreateChannel(server->address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  shardline::v1::RegisterResponse response;
  EXPECT_EQ(stub->Register(&context, {}, &response).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  auto stream = server->service->Expect("job-1", 7, 0, Exchange(absl::Seconds(5)));
  RawPeer no_credit(server->address);
  StageFrame hello = Hello("job-1", 7, 1);
  hello.clear_credit();
  no_credit.Write(hello);
  EXPECT_EQ(no_credit.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "a hello must grant credit";
  server->server->Shutdown();
}

// Single-frame gradients from a raw peer that ignores the credit it was given.
TEST(GrpcStageLinkTest, AFrameBeyondTheGrantedCreditEndsTheStream) {
  auto server = StartServer();
  ExchangeOptions options = Exchange(absl::Seconds(5));
  options.window_frames = 2;
  options.max_waiting = 1;  // the stage takes nothing: no credit comes back
  auto stream = server->service->Expect("job-1", 7, 0, options);
  RawPeer greedy(server->address);
  ASSERT_TRUE(greedy.Write(Hello("job-1", 7, 1)));
  StageFrame gradient;
  gradient.set_kind(StageFrame::GRADIENT);
  gradient.set_dtype(shardline::v1::DTYPE_F32);
  gradient.set_chunk_count(1);
  for (int i = 0; i < 3; ++i) greedy.Write(gradient);
  EXPECT_EQ(greedy.Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // What arrived under credit is still there; then the reason.
  EXPECT_TRUE(stream->Receive().ok());
  EXPECT_TRUE(stream->Receive().ok());
  EXPECT_EQ(stream->Receive().status().code(), absl::StatusCode::kResourceExhausted);

  // Granting absurd credit is a confused peer too.
  auto second = server->service->Expect("job-2", 7, 0, options);
  RawPeer generous(server->address);
  ASSERT_TRUE(generous.Write(Hello("job-2", 7, 1)));
  StageFrame grant;
  grant.set_credit(1u << 31);
  generous.Write(grant);
  EXPECT_EQ(generous.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  server->server->Shutdown();
}

// A sender much faster than its receiver: what either side holds stays
// bounded (the sender's Send waits, then times out), nothing is lost or
// reordered, and a message far larger than the credit window still flows.
TEST(GrpcStageLinkTest, ASlowReceiverBoundsWhatAFastSenderMayQueue) {
  auto server = StartServer();
  ExchangeOptions options = Exchange(absl::Milliseconds(300));
  options.chunk_bytes = 4096;
  options.window_frames = 2;
  options.max_waiting = 3;
  auto receiver = server->service->Expect("job-1", 7, 0, options);
  GrpcStageLinkOptions sender_options = Options(1, 2, server.get(), server.get());
  sender_options.exchange = options;
  auto sender = GrpcStageLink::Create(sender_options);
  ASSERT_TRUE(sender.ok());

  auto gradient = [](int i, size_t floats) {
    StageMessage m;
    m.kind = StageMessage::Kind::kGradient;
    m.step = i;
    m.values = std::vector<float>(floats, static_cast<float>(i));
    return m;
  };
  int sent = 0;
  absl::Status status;
  while (sent < 100 && (status = (*sender)->SendToPrevious(gradient(sent, 1000))).ok()) ++sent;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  // The receiver holds at most max_waiting messages plus a window of frames;
  // the sender queues at most max_waiting more.
  EXPECT_GE(sent, 3);
  EXPECT_LE(sent, 2 * 3 + 2);
  EXPECT_LE(receiver->peak_waiting_received(), 3u + 2u);
  for (int i = 0; i < sent; ++i) {
    auto m = receiver->Receive();
    ASSERT_TRUE(m.ok()) << "message " << i << ": " << m.status();
    EXPECT_EQ(m->step, i);
    EXPECT_EQ(m->values, gradient(i, 1000).values);
  }
  // 400 KiB in 4 KiB frames through a window of 2: the grants keep it going.
  const StageMessage large = gradient(sent, 100'000);
  ASSERT_TRUE((*sender)->SendToPrevious(large).ok());
  auto m = receiver->Receive();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->values, large.values);
  sender->reset();
  server->server->Shutdown();
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

TEST(GrpcStageLinkTest, MalformedFramesEndTheStreamWithInvalidArgument) {
  auto server = StartServer();
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE(variant);
    const std::string job = absl::StrCat("bad-", variant);
    auto stream = server->service->Expect(job, 1, 0, Exchange(absl::Seconds(5)));
    RawPeer peer(server->address);
    ASSERT_TRUE(peer.Write(Hello(job, 1, 1)));
    StageFrame f;
    f.set_kind(StageFrame::GRADIENT);
    f.set_dtype(shardline::v1::DTYPE_F32);
    f.set_elements(4);
    f.set_chunk_count(2);
    f.set_payload(std::string(8, '\0'));
    if (variant == 0) f.set_dtype(shardline::v1::DTYPE_I32);        // not a wire dtype
    if (variant == 1) f.set_chunk_index(1);                          // chunk out of order
    if (variant == 2) f.set_payload(std::string(20, '\0'));          // more bytes than elements
    if (variant == 3) f.set_kind(static_cast<StageFrame::Kind>(42));  // unknown kind
    peer.Write(f);
    EXPECT_EQ(peer.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(stream->Receive().status().code(), absl::StatusCode::kInvalidArgument);
  }
  server->server->Shutdown();
}

TEST(GrpcStageLinkTest, TheDownstreamStageMayConnectBeforeTheUpstreamOneIsReady) {
  auto upstream = StartServer();
  auto own = StartServer();
  // The downstream worker got its assignment first: its link starts connecting
  // while the upstream worker has not registered the job yet (NOT_FOUND).
  auto link = GrpcStageLink::Create(Options(1, 2, own.get(), upstream.get()));
  ASSERT_TRUE(link.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  auto expectation = upstream->service->Expect("job-1", 7, 0, Exchange(absl::Seconds(10)));
  StageMessage activation;
  activation.kind = StageMessage::Kind::kActivation;
  activation.values = {4.0f, 5.0f};
  ASSERT_TRUE(expectation->Send(std::make_shared<StageMessage>(activation)).ok());
  auto received = (*link)->ReceiveFromPrevious();
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->values, activation.values);
  EXPECT_EQ((*link)->BytesReceived(), 2 * sizeof(float)) << "payload bytes, for the step report";
  link->reset();
  upstream->server->Shutdown();
  own->server->Shutdown();
}

TEST(GrpcStageLinkTest, ALostUpstreamWorkerFailsTheReceiverPromptly) {
  auto upstream = StartServer();
  auto own = StartServer();
  auto expectation = upstream->service->Expect("job-1", 7, 0, Exchange(absl::Seconds(30)));
  auto link = GrpcStageLink::Create(Options(1, 2, own.get(), upstream.get()));
  ASSERT_TRUE(link.ok());
  StageMessage hello_traffic;
  hello_traffic.kind = StageMessage::Kind::kGradient;
  ASSERT_TRUE((*link)->SendToPrevious(hello_traffic).ok());
  ASSERT_TRUE(expectation->Receive().ok());
  const auto start = std::chrono::steady_clock::now();
  std::thread kill([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    upstream->server->Shutdown(std::chrono::system_clock::now());  // the worker dies
  });
  auto received = (*link)->ReceiveFromPrevious();
  kill.join();
  EXPECT_FALSE(received.ok());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  link->reset();
  own->server->Shutdown();
}

}  // namespace
}  // namespace shardline::worker::runtime
