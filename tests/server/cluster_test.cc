// Whole jobs through the daemons (coordinator and workers in-process, real
// gRPC on loopback): for 1 to 4 stages, both schedules, and p × d grids of
// data-parallel replicas (gradients summed over gRPC), the per-step
// losses the coordinator reports and the weights it exports equal the
// reference trainer's bit for bit (the same arithmetic: see
// pipeline_equivalence_test.cc); a cancelled job frees its workers.
#include <cmath>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "client/admin_client.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/testing/exported_weights.h"
#include "tests/testing/in_process_cluster.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/runtime/pipeline_stage.h"
#include "worker/trainer/trainer.h"

namespace shardline::server {
namespace {

struct Case {
  int stages;
  std::string schedule;
  int micro_batches;
  int replicas = 1;
};

class ClusterTest : public ::testing::TestWithParam<Case> {};

TEST_P(ClusterTest, DistributedTrainingEqualsTheReference) {
  const Case& c = GetParam();
  auto spec = worker::testing::TinySpec(c.micro_batches, 2 * c.micro_batches * c.replicas);
  spec.mutable_train()->set_steps(6);
  spec.mutable_parallel()->set_pipeline_stages(c.stages);
  spec.mutable_parallel()->set_schedule(c.schedule);
  spec.mutable_parallel()->set_data_parallel(c.replicas);
  spec.mutable_train()->mutable_optimizer()->set_grad_clip(1.0);  // the global norm matters
  spec.mutable_checkpoint()->set_every_steps(4);
  auto cluster = testing::InProcessCluster::Start(c.stages * c.replicas);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  client::AdminClient admin((*cluster)->address());
  auto submitted = admin.Submit(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  std::map<int64_t, double> losses;
  auto last = admin.Watch(submitted->job_id(), [&](const shardline::v1::JobStatus& s) {
    if (s.step() > 0) losses[s.step()] = s.loss();
  });
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_EQ(last->state(), shardline::v1::SUCCEEDED) << last->message();
  // What a stage's links held: at least one micro-batch's tensor, at most
  // what credits and queues allow both neighbours (docs/protocol.md).
  const uint64_t tensor = worker::runtime::LargestLinkTensorBytes(spec);
  const uint64_t most = 2 * (2 * 8 + 16) * tensor;  // max_waiting 8, window 16 frames of ≥ 1 tensor each
  // Every position of the p × d grid, each on its own worker.
  ASSERT_EQ(last->stages_size(), c.stages * c.replicas);
  std::set<std::string> workers;
  for (const auto& stage : last->stages()) workers.insert(stage.worker());
  EXPECT_EQ(static_cast<int>(workers.size()), c.stages * c.replicas);
  for (const auto& stage : last->stages()) {
    // (Faults per GiB of a real receive: grpc_stage_link_test, where the
    // staging memory is fresh pages; here the process's allocator decides.)
    if (c.stages > 1) {
      EXPECT_GT(stage.link_peak_bytes(), 0) << "stage " << stage.stage();
      EXPECT_LE(static_cast<uint64_t>(stage.link_peak_bytes()), most) << "stage " << stage.stage();
    } else {
      EXPECT_EQ(stage.link_peak_bytes(), 0) << "a single stage has no links";
      EXPECT_EQ(stage.minor_faults_per_gib(), 0.0) << "nothing received: no figure per GiB";
    }
    const int64_t bound = c.schedule == "1f1b" ? std::min(c.stages - stage.stage(), c.micro_batches)
                          : c.schedule == "zb"   ? std::min(c.stages - stage.stage() + 1, c.micro_batches)
                                                 : c.micro_batches;
    EXPECT_EQ(stage.peak_slots(), bound) << "stage " << stage.stage();
  }

  auto backend = worker::testing::CpuBackend();
  auto reference = worker::trainer::Trainer::Create(spec, *backend);
  ASSERT_TRUE(reference.ok());
  // The watch replays the recent steps, so it sees every one even when the
  // job ran ahead of the subscription.
  for (int64_t step = 1; step <= 6; ++step) {
    auto want = (*reference)->TrainStep(step);
    ASSERT_TRUE(want.ok());
    ASSERT_TRUE(losses.count(step)) << "no status for step " << step;
    EXPECT_EQ(losses[step], want->loss) << "step " << step;
  }
  auto exported = admin.Export(submitted->job_id());
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto want = (*reference)->runtime().ExportWeights();
  ASSERT_TRUE(want.ok());
  testing::ExpectSameWeights(*exported, *want);
}

INSTANTIATE_TEST_SUITE_P(Pipelines, ClusterTest,
                         ::testing::Values(Case{1, "1f1b", 2}, Case{2, "gpipe", 3}, Case{3, "1f1b", 4},
                                           Case{4, "1f1b", 5}, Case{4, "gpipe", 2}, Case{1, "1f1b", 2, 2},
                                           Case{2, "1f1b", 3, 2}, Case{3, "gpipe", 2, 2}, Case{1, "1f1b", 1, 4},
                                           Case{3, "zb", 4}, Case{2, "zb", 3, 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.stages, "stages_", info.param.replicas, "replicas_",
                                               info.param.schedule, "_m", info.param.micro_batches);
                         });

// Tensor parallelism through the daemons: each stage split over two
// workers (the tensor group's all-reduces over gRPC, GrpcCollective), each
// rank's link to the same rank of the next stage; the 2-stage grid with the
// embedding and the head vocabulary-parallel too, and its stages handing
// each other parts of tensors (scatter/gather, the receiving group's
// all-gather over gRPC) as across hosts; the losses within 1e-5 of
// the reference trainer's (the split sums change a GEMM's order) and the
// exported weights, one global layout, within 1e-5 of the model's size.
TEST(ClusterTensorParallelTest, ASplitGridMatchesTheReferenceWithinTolerance) {
  for (const auto& [stages, replicas, vocab_parallel] : {std::tuple{2, 1, true}, std::tuple{1, 2, false}}) {
    SCOPED_TRACE(absl::StrCat(stages, " stages × ", replicas, " replicas × 2 tensor ranks",
                              vocab_parallel ? ", vocabulary-parallel" : ""));
    auto spec = worker::testing::TinySpec(2, 4 * replicas);
    spec.mutable_train()->set_steps(8);
    spec.mutable_train()->mutable_optimizer()->set_lr(0.001);
    spec.mutable_train()->mutable_optimizer()->set_grad_clip(1.0);
    spec.mutable_parallel()->set_pipeline_stages(stages);
    spec.mutable_parallel()->set_data_parallel(replicas);
    spec.mutable_parallel()->set_tensor_parallel(2);
    spec.mutable_parallel()->set_vocab_parallel(vocab_parallel);
    if (stages > 1) spec.mutable_parallel()->set_stage_link_layout("scatter_gather");
    spec.mutable_checkpoint()->set_every_steps(4);
    auto cluster = testing::InProcessCluster::Start(stages * replicas * 2);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    client::AdminClient admin((*cluster)->address());
    auto submitted = admin.Submit(spec);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    std::map<int64_t, double> losses;
    auto last = admin.Watch(submitted->job_id(), [&](const shardline::v1::JobStatus& s) {
      if (s.step() > 0) losses[s.step()] = s.loss();
    });
    ASSERT_TRUE(last.ok()) << last.status();
    ASSERT_EQ(last->state(), shardline::v1::SUCCEEDED) << last->message();
    ASSERT_EQ(last->stages_size(), stages * replicas * 2);
    auto backend = worker::testing::CpuBackend();
    auto reference = worker::trainer::Trainer::Create(spec, *backend);
    ASSERT_TRUE(reference.ok());
    for (int64_t step = 1; step <= 8; ++step) {
      auto want = (*reference)->TrainStep(step);
      ASSERT_TRUE(want.ok());
      ASSERT_TRUE(losses.count(step)) << "no status for step " << step;
      EXPECT_NEAR(losses[step], want->loss, 1e-5 * want->loss) << "step " << step;
    }
    auto exported = admin.Export(submitted->job_id());
    ASSERT_TRUE(exported.ok()) << exported.status();
    auto got = common::ParseSafetensors(*exported);
    auto want = (*reference)->runtime().ExportWeights();
    ASSERT_TRUE(got.ok() && want.ok());
    ASSERT_EQ(got->tensors.size(), want->size()) << "every tensor once, whole";
    double gap = 0, size = 0;
    for (const auto& [name, tensor] : *want) {
      ASSERT_EQ(got->tensors.at(name).shape(), tensor.shape()) << name;
      const auto a = got->tensors.at(name).values<float>();
      const auto b = tensor.values<float>();
      for (size_t i = 0; i < b.size(); ++i) {
        gap += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
        size += static_cast<double>(b[i]) * b[i];
      }
    }
    EXPECT_LE(std::sqrt(gap), 1e-5 * std::sqrt(size));
  }
}

TEST(ClusterCancelTest, ACancelledJobFreesItsWorkers) {
  auto spec = worker::testing::TinySpec(2, 4);
  spec.mutable_train()->set_steps(100000);
  spec.mutable_parallel()->set_pipeline_stages(2);
  auto cluster = testing::InProcessCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  client::AdminClient admin((*cluster)->address());
  auto job = admin.Submit(spec);
  ASSERT_TRUE(job.ok());
  for (int i = 0; i < 500 && admin.Get(job->job_id())->step() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto cancelled = admin.Cancel(job->job_id());
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), shardline::v1::CANCELLED);
  // The same workers take the next job.
  spec.mutable_train()->set_steps(3);
  auto next = admin.Submit(spec);
  ASSERT_TRUE(next.ok());
  auto last = admin.Watch(next->job_id(), [](const auto&) {});
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->state(), shardline::v1::SUCCEEDED) << last->message();
}

}  // namespace
}  // namespace shardline::server
