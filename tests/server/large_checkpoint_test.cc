// A shard of more than 1 GiB (weights and AdamW state) checkpoints while
// training goes on: the stage stands still only to copy it into host
// memory allocated ahead (checkpoint_seconds in its step reports, under
// one step's time), and the upload, with a deadline per chunk far shorter
// than the whole transfer, runs in the background and commits (in-process
// cluster, real gRPC on loopback). Waiting for the previous upload, when
// checkpoints come faster than uploads, is reported apart
// (checkpoint_wait_seconds) and not judged here: its length is the disk's.
#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/admin_client.h"
#include "common/job_spec.h"
#include "common/safetensors.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_cluster.h"

namespace shardline::server {
namespace {

TEST(LargeCheckpointTest, AGibibyteShardCheckpointsWithoutStoppingTraining) {
  // 92M parameters in one stage (embedding and head 32768 × 1024 each):
  // weights, m and v make a 1.1 GB shard.
  auto spec = common::ParseJobSpec(R"({"name": "large",
    "model": {"kind": "gpt", "vocab_size": 32768, "context": 16, "d_model": 1024, "n_heads": 8, "n_layers": 2},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": 6, "global_batch": 4, "micro_batches": 1, "seed": 3,
              "optimizer": {"kind": "adamw", "lr": 0.001}},
    "checkpoint": {"every_steps": 3}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  // 2 s per chunk: the old single deadline for the whole stream could not
  // have carried a gibibyte (and the coordinator's fsync of it) in that.
  auto cluster = testing::InProcessCluster::Start(1, absl::Seconds(5), [](worker::WorkerOptions& options) {
    options.rpc_deadline = absl::Seconds(2);
  });
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  client::AdminClient admin((*cluster)->address());
  auto submitted = admin.Submit(*spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  std::map<int64_t, shardline::v1::StageStatus> steps;
  auto last = admin.Watch(submitted->job_id(), [&](const shardline::v1::JobStatus& s) {
    if (s.step() > 0 && s.stages_size() == 1) steps[s.step()] = s.stages(0);
  });
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_EQ(last->state(), shardline::v1::SUCCEEDED) << last->message();
  EXPECT_EQ(last->committed_step(), 6);
  ASSERT_EQ(steps.size(), 6u);

  std::vector<double> step_seconds;
  for (const auto& [step, stage] : steps) step_seconds.push_back(stage.step_seconds());
  std::sort(step_seconds.begin(), step_seconds.end());
  const double median = step_seconds[step_seconds.size() / 2];
  for (int64_t step : {3, 6}) {
    const double stood_still = steps.at(step).checkpoint_seconds();
    EXPECT_GT(stood_still, 0) << "step " << step << " is a checkpoint";
    EXPECT_LE(stood_still, median) << "the checkpoint of step " << step << " held training for " << stood_still
                                   << " s; a step takes " << median << " s";
    LOG(INFO) << "checkpoint of step " << step << ": " << stood_still << " s snapshot, "
              << steps.at(step).checkpoint_wait_seconds() << " s waiting for the previous upload; steps take "
              << median << " s";
  }
  auto exported = admin.Export(submitted->job_id());
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto weights = common::ParseSafetensors(*exported);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->metadata.at("step"), "6");
  size_t bytes = 0;
  for (const auto& [name, tensor] : weights->tensors) bytes += tensor.byte_size();
  EXPECT_GT(3 * bytes, size_t{1} << 30) << "the shard (weights, m, v) is not over a gibibyte";
}

}  // namespace
}  // namespace shardline::server
