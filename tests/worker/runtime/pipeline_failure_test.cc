// A pipeline whose stage dies or hangs fails the step on every other stage
// with a clear error, within the link deadline: never a silent hang.
#include <chrono>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/testing/deferred_copy_backend.h"
#include "tests/testing/local_pipeline.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/data/data_source.h"

namespace shardline::worker::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// Runs stages 0 and 2 of a 3-stage pipeline; stage 1 never runs (dead or
// hung). `kill_after` > 0 closes stage 1's links then, as the connections
// of a killed process close.
void RunWithoutMiddleStage(absl::Duration link_timeout, absl::Duration kill_after,
                           absl::StatusCode expected) {
  auto spec = testing::TinySpec(4, 8);
  auto pipeline = shardline::testing::LocalPipeline::Create(spec, {1, 2}, link_timeout);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  absl::StatusOr<StageStepResult> first = absl::UnknownError(""), last = absl::UnknownError("");
  const auto start = Clock::now();
  std::thread t0([&] { first = (*pipeline)->stage(0).RunStep(1); });
  std::thread t2([&] { last = (*pipeline)->stage(2).RunStep(1); });
  if (kill_after > absl::ZeroDuration()) {
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(kill_after));
    (*pipeline)->links().CloseAll("stage 1 (worker w1) was lost");
  }
  t0.join();
  t2.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_FALSE(first.ok());
  ASSERT_FALSE(last.ok());
  EXPECT_EQ(first.status().code(), expected) << first.status();
  EXPECT_EQ(last.status().code(), expected) << last.status();
  if (expected == absl::StatusCode::kUnavailable) {
    EXPECT_NE(first.status().message().find("w1"), std::string::npos) << first.status();
  }
  // The last stage says what it waited for, and from whom.
  EXPECT_NE(last.status().message().find("stage 2 waiting for the activation of step 1 micro-batch 0 from stage 1"),
            std::string::npos)
      << last.status();
  EXPECT_LT(seconds, absl::ToDoubleSeconds(link_timeout) + 5.0);
  // The failed step freed its activations.
  EXPECT_EQ((*pipeline)->runtime(0).slots_held(), 0u);
  EXPECT_EQ((*pipeline)->runtime(2).slots_held(), 0u);
}

TEST(PipelineFailureTest, LostNeighbourFailsTheStepPromptly) {
  RunWithoutMiddleStage(absl::Seconds(30), absl::Milliseconds(100), absl::StatusCode::kUnavailable);
}

TEST(PipelineFailureTest, SilentNeighbourHitsTheDeadline) {
  RunWithoutMiddleStage(absl::Milliseconds(300), absl::ZeroDuration(),
                        absl::StatusCode::kDeadlineExceeded);
}

// Holds slot `k` of the second stage's runtime (a 2-stage TinySpec(4, 8)
// pipeline), so that the schedule's forward pass of micro-batch k fails there.
void OccupySecondStageSlot(shardline::testing::LocalPipeline& pipeline, int k) {
  std::vector<float> x(2 * 9 * 16);
  ShardRuntime::Inputs in{2, 9, {}, {}, 1.0f, x};
  std::vector<int32_t> targets(18, -1);
  in.targets = targets;
  ASSERT_TRUE(pipeline.runtime(1).Forward(k, in).ok());
}

TEST(PipelineFailureTest, AFailingStageStopsTheOthers) {
  auto spec = testing::TinySpec(4, 8);
  auto pipeline = shardline::testing::LocalPipeline::Create(spec, {2});
  ASSERT_TRUE(pipeline.ok());
  ASSERT_TRUE((*pipeline)->RunStep(1).ok());
  // Occupy a slot the schedule will use: stage 1's forward of micro-batch 0 fails.
  OccupySecondStageSlot(**pipeline, 0);
  if (HasFatalFailure()) return;
  const auto start = Clock::now();
  auto result = (*pipeline)->RunStep(2);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kAlreadyExists) << result.status();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
}

// Under the zero-bubble schedule a step that fails midway has slots between
// a backward pass's input part and its weight part: the failure frees them
// on every stage, as it frees slots between forward and backward.
TEST(PipelineFailureTest, AFailedZeroBubbleStepFreesSlotsBetweenTheirParts) {
  auto spec = testing::TinySpec(4, 8);
  spec.mutable_parallel()->set_schedule("zb");
  auto pipeline = shardline::testing::LocalPipeline::Create(spec, {2});
  ASSERT_TRUE(pipeline.ok());
  ASSERT_TRUE((*pipeline)->RunStep(1).ok());
  // Stage 1's forward of micro-batch 2 fails, after both stages have run
  // the input parts of micro-batches 0 and 1 (stage 1: F0 B0 F1 B1 W0 F2).
  OccupySecondStageSlot(**pipeline, 2);
  if (HasFatalFailure()) return;
  auto result = (*pipeline)->RunStep(2);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kAlreadyExists) << result.status();
  EXPECT_EQ((*pipeline)->runtime(0).slots_held(), 0u);
  EXPECT_EQ((*pipeline)->runtime(1).slots_held(), 0u);
}

// A neighbour at another wire precision (a mixed-up deployment) is refused
// by name, not misread.
TEST(PipelineFailureTest, ATensorAtAnotherWirePrecisionIsRefused) {
  auto spec = testing::TinySpec(4, 8);
  auto pipeline = shardline::testing::LocalPipeline::Create(spec, {2}, absl::Seconds(5));
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  transport::StageMessage m;
  m.kind = transport::StageMessage::Kind::kActivation;
  m.step = 1;
  m.micro_batch = 0;
  m.batch = 2;
  m.t = 9;
  m.values = transport::HostBuffer::Zeros(2 * 9 * 16);
  m.dtype = common::DType::kBF16;
  ASSERT_TRUE((*pipeline)->links().channels[0]->Push(std::move(m)).ok());  // stage 0 → 1
  auto result = (*pipeline)->stage(1).RunStep(1);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  EXPECT_NE(result.status().message().find("in bf16, the job's wire precision is f32"), std::string::npos)
      << result.status();
}

// Stage 0's link to a next stage that is alive but stopped reading: a send
// blocks until the link is closed (or a minute passes); the gradient never
// comes, once a send is blocked.
class StuckNeighbourLink final : public transport::StageLink {
 public:
  absl::Status SendToNext(transport::StageMessage) override {
    if (!send_blocked_.HasBeenNotified()) send_blocked_.Notify();
    absl::MutexLock lock(&mu_);
    auto closed = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !closed_.empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&closed), absl::Minutes(1))) {
      return absl::DeadlineExceededError("the next stage took nothing for a minute");
    }
    return absl::UnavailableError(closed_);
  }
  absl::StatusOr<transport::StageMessage> ReceiveFromNext() override {
    send_blocked_.WaitForNotificationWithTimeout(absl::Seconds(30));
    return absl::UnavailableError("no gradient: the next stage stopped answering");
  }
  absl::StatusOr<transport::StageMessage> ReceiveFromPrevious() override {
    return absl::FailedPreconditionError("stage 0 has no previous stage");
  }
  absl::Status SendToPrevious(transport::StageMessage) override {
    return absl::FailedPreconditionError("stage 0 has no previous stage");
  }
  void Close(const std::string& reason) override {
    absl::MutexLock lock(&mu_);
    closed_ = reason.empty() ? "closed" : reason;
  }

 private:
  absl::Notification send_blocked_;
  absl::Mutex mu_;
  std::string closed_ ABSL_GUARDED_BY(mu_);
};

// A stage whose step failed while its sender was blocked handing a tensor to
// a neighbour that stopped reading closes its link when it goes, so its
// teardown (and the worker's next job) does not wait out the link timeout.
TEST(PipelineFailureTest, AFailedStageLetsGoOfItsLinkAtOnce) {
  auto spec = testing::TinySpec(4, 8);
  const auto config = nn::ModelConfig::FromSpec(spec.model());
  // Copies to the host finish later, as on a GPU: sends go through the sender's thread.
  shardline::testing::DeferredCopyBackend backend(absl::Milliseconds(20));
  auto runtime = ShardRuntime::Create(backend, config, 0, 2, spec.train().seed(),
                                      nn::OptimizerConfig::FromSpec(spec.train()));
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  auto data = data::CreateDataSource(spec);
  ASSERT_TRUE(data.ok()) << data.status();
  StuckNeighbourLink link;
  PipelineStageOptions options{ScheduleKind::kOneFOneB, 2, 0, spec.train().micro_batches(),
                               spec.train().global_batch(), common::DType::kF32};
  auto stage = PipelineStage::Create(**runtime, data->get(), link, options);
  ASSERT_TRUE(stage.ok()) << stage.status();
  auto result = (*stage)->RunStep(1);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  const auto start = Clock::now();
  stage->reset();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
}

}  // namespace
}  // namespace shardline::worker::runtime
