// Where a restarted position gets its state (in-process cluster, real gRPC
// on loopback): a worker of a running job stops; the job restarts from its
// committed step with the survivors where they were, each loading its
// state from its own memory (its last checkpoint snapshot), and the
// standby that takes the lost position from its data-parallel twin when it
// has one (another replica, or another tensor rank of its stage), else from
// the coordinator. The run ends with the weights of a run that lost
// nothing, bit for bit: the reference trainer's, or split over tensor
// ranks, the same grid's uninterrupted.
#include <cmath>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/admin_client.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_cluster.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/trainer/trainer.h"

namespace shardline::server {
namespace {

struct Case {
  int stages;
  int replicas;
  int victim;  // position ((replica · p + stage) · t + tensor rank)
  bool shard_optimizer = false;
  int tensor = 1;
};

class RecoverySourcesTest : public ::testing::TestWithParam<Case> {};

TEST_P(RecoverySourcesTest, SurvivorsLoadFromMemoryAndTheStandbyFromItsTwinOrTheCoordinator) {
  const Case& c = GetParam();
  auto spec = worker::testing::TinySpec(2, 4 * c.replicas);
  spec.mutable_train()->set_steps(600);
  spec.mutable_parallel()->set_pipeline_stages(c.stages);
  spec.mutable_parallel()->set_data_parallel(c.replicas);
  spec.mutable_parallel()->set_shard_optimizer(c.shard_optimizer);
  spec.mutable_parallel()->set_tensor_parallel(c.tensor);
  spec.mutable_parallel()->set_vocab_parallel(c.tensor > 1);  // the lost rank holds a slice of the head
  spec.mutable_checkpoint()->set_every_steps(300);
  // And a standby. Alike workers, reported alike: measured at start-up,
  // concurrently, their rates differ by up to 2× here, and the planner
  // would cut again for the standby.
  auto cluster = testing::InProcessCluster::Start(c.stages * c.replicas * c.tensor + 1, absl::Seconds(5),
                                                  [](worker::WorkerOptions& o) { o.gemm_flops = 1e11; });
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // Steps slowed by this machine's load must not move the job (a re-plan
  // has sources of its own: server_cluster_replan_test).
  (*cluster)->jobs().SetAutoReplan(false);
  client::AdminClient admin((*cluster)->address());
  auto job = admin.Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  // Between the checkpoints of steps 300 and 600: every position's last
  // snapshot is of the committed step.
  shardline::v1::JobStatus before;
  for (int i = 0; i < 6000 && !(before.committed_step() == 300 && before.step() >= 305); ++i) {
    before = admin.Get(job->job_id()).value_or(before);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(before.committed_step(), 300) << before.DebugString();
  ASSERT_LT(before.step(), 600) << "the job ran past its last checkpoint before the stop: make it longer";
  const std::string victim = before.stages(c.victim).worker();  // "t<i>"
  (*cluster)->worker(std::stoi(victim.substr(1))).Stop();

  auto last = admin.Watch(job->job_id(), [](const auto&) {});
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_EQ(last->state(), shardline::v1::SUCCEEDED) << last->message();
  ASSERT_GT(last->plan_epoch(), before.plan_epoch());
  ASSERT_EQ(last->stages_size(), before.stages_size());
  for (int position = 0; position < last->stages_size(); ++position) {
    const auto& stage = last->stages(position);
    SCOPED_TRACE(absl::StrCat("position ", position, " (worker ", stage.worker(), ")"));
    if (position != c.victim) {
      EXPECT_EQ(stage.worker(), before.stages(position).worker()) << "a survivor moved";
      EXPECT_EQ(stage.resumed_from(), "its own memory");
    } else if (c.replicas > 1 || c.tensor > 1) {
      // A twin: the same stage in another replica, or another tensor rank
      // (every rank's snapshot is the stage's whole shard).
      EXPECT_NE(stage.worker(), victim);
      EXPECT_TRUE(absl::StartsWith(stage.resumed_from(), "its twin at 127.0.0.1:")) << stage.resumed_from();
    } else {
      EXPECT_EQ(stage.resumed_from(), "the coordinator");
    }
  }

  auto exported = admin.Export(job->job_id());
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto got = common::ParseSafetensors(*exported);
  ASSERT_TRUE(got.ok()) << got.status();
  // What a run that lost nothing ends with: the trainer's bits; split over
  // tensor ranks (whose sums differ from the trainer's by rounding, which
  // 600 steps at this rate amplify), those of the same grid uninterrupted.
  std::map<std::string, common::Tensor> want;
  if (c.tensor == 1) {
    auto backend = worker::testing::CpuBackend();
    auto reference = worker::trainer::Trainer::Create(spec, *backend);
    ASSERT_TRUE(reference.ok()) << reference.status();
    for (int64_t step = 1; step <= 600; ++step) ASSERT_TRUE((*reference)->TrainStep(step).ok());
    auto weights = (*reference)->runtime().ExportWeights();
    ASSERT_TRUE(weights.ok());
    want = *std::move(weights);
  } else {
    auto clean = testing::InProcessCluster::Start(c.stages * c.replicas * c.tensor, absl::Seconds(5),
                                                  [](worker::WorkerOptions& o) { o.gemm_flops = 1e11; });
    ASSERT_TRUE(clean.ok()) << clean.status();
    client::AdminClient clean_admin((*clean)->address());
    auto clean_job = clean_admin.Submit(spec);
    ASSERT_TRUE(clean_job.ok()) << clean_job.status();
    auto ended = clean_admin.Watch(clean_job->job_id(), [](const auto&) {});
    ASSERT_TRUE(ended.ok() && ended->state() == shardline::v1::SUCCEEDED) << ended->DebugString();
    auto bytes = clean_admin.Export(clean_job->job_id());
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto weights = common::ParseSafetensors(*bytes);
    ASSERT_TRUE(weights.ok());
    want = std::move(weights->tensors);
  }
  ASSERT_EQ(got->tensors.size(), want.size());
  for (const auto& [name, tensor] : want) {
    const auto a = got->tensors.at(name).values<float>();
    const auto b = tensor.values<float>();
    ASSERT_EQ(a.size(), b.size()) << name;
    for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(a[i], b[i]) << name << "[" << i << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(Grids, RecoverySourcesTest,
                         ::testing::Values(Case{2, 2, 3}, Case{2, 2, 0, true}, Case{3, 1, 1}, Case{2, 1, 3, false, 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.stages, "stages_", info.param.replicas, "replicas_",
                                               info.param.tensor, "tensor_lose", info.param.victim,
                                               info.param.shard_optimizer ? "_zero1" : "");
                         });

}  // namespace
}  // namespace shardline::server
