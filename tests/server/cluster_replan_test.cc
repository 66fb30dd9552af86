// A re-plan of a running job through the daemons (coordinator and workers
// in-process, real gRPC on loopback): the positions stop after the step
// the coordinator names, checkpoint it, and the job goes on from the next
// step at a new epoch; every step's loss and the exported weights still
// equal the reference trainer's bit for bit, and no step is lost or run
// twice.
#include <map>
#include <thread>

#include "client/admin_client.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/testing/exported_weights.h"
#include "tests/testing/in_process_cluster.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/trainer/trainer.h"

namespace shardline::server {
namespace {

TEST(ClusterReplanTest, AJobMovesAtAStepBoundaryAndStillEqualsTheReference) {
  constexpr int64_t kSteps = 600;
  auto spec = worker::testing::TinySpec(2, 8);
  spec.mutable_train()->set_steps(kSteps);
  spec.mutable_parallel()->set_pipeline_stages(2);
  spec.mutable_parallel()->set_data_parallel(2);
  spec.mutable_checkpoint()->set_every_steps(0);  // the stop makes its own checkpoint
  auto cluster = testing::InProcessCluster::Start(4);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  client::AdminClient admin((*cluster)->address());
  auto submitted = admin.Submit(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  for (int i = 0; i < 1000 && admin.Get(submitted->job_id())->step() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ((*cluster)->jobs().Replan("job-404", "test").status().code(), absl::StatusCode::kNotFound);
  auto replanning = (*cluster)->jobs().Replan(submitted->job_id(), "asked by the test");
  ASSERT_TRUE(replanning.ok()) << replanning.status();
  const std::string message = replanning->message();
  const size_t at = message.find("re-planning after step ");
  ASSERT_NE(at, std::string::npos) << message;
  const int64_t stop = std::stoll(message.substr(at + 23));
  ASSERT_LT(stop, kSteps);
  EXPECT_EQ((*cluster)->jobs().Replan(submitted->job_id(), "again").status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "one re-plan at a time";

  std::map<int64_t, double> losses;
  std::map<uint64_t, int64_t> first_step_of_epoch;
  bool replanned = false;
  auto last = admin.Watch(submitted->job_id(), [&](const shardline::v1::JobStatus& s) {
    if (s.step() > 0 && s.state() == shardline::v1::RUNNING) losses[s.step()] = s.loss();
    if (s.state() == shardline::v1::RUNNING && !first_step_of_epoch.count(s.plan_epoch())) {
      first_step_of_epoch[s.plan_epoch()] = s.step();
    }
    replanned = replanned || s.message().find("re-planned from step " + std::to_string(stop + 1)) !=
                                 std::string::npos;
  });
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_EQ(last->state(), shardline::v1::SUCCEEDED) << last->message();
  EXPECT_TRUE(replanned) << "no status said the job re-planned from step " << stop + 1;
  EXPECT_GT(last->plan_epoch(), submitted->plan_epoch()) << "a new epoch";
  EXPECT_EQ(first_step_of_epoch.size(), 2u) << "one move";

  auto backend = worker::testing::CpuBackend();
  auto reference = worker::trainer::Trainer::Create(spec, *backend);
  ASSERT_TRUE(reference.ok());
  for (int64_t step = 1; step <= kSteps; ++step) {
    auto want = (*reference)->TrainStep(step);
    ASSERT_TRUE(want.ok());
    if (losses.count(step)) {
      ASSERT_EQ(losses[step], want->loss) << "step " << step;
    }
  }
  EXPECT_TRUE(losses.count(stop) && losses.count(stop + 1)) << "the steps on either side of the move";
  auto exported = admin.Export(submitted->job_id());
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto want = (*reference)->runtime().ExportWeights();
  ASSERT_TRUE(want.ok());
  testing::ExpectSameWeights(*exported, *want);
}

}  // namespace
}  // namespace shardline::server
