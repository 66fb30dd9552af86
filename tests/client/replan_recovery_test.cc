// Re-planned recoveries through the real binaries: a drained worker's job
// moving off it at a checkpointed step, and jobs that lost workers running
// on fewer stages or replicas and growing back when a worker returns, each
// ending with the weights of shardline-train bit for bit.
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/admin_client.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/client/process_cluster.h"
#include "tests/client/recovery_test_util.h"

namespace shardline::client {
namespace {

using testing::ExpectSucceedsWith;
using testing::SubmitPastACheckpoint;
using testing::TempDir;
using testing::TrainReference;
using testing::WaitFor;
using testing::WriteSpec;

// shardline-train's weights on a spec of `steps` on `stages` × `replicas`,
// and a cluster of `workers` running the spec's job past its first
// checkpoint.
struct Started {
  common::SafetensorsContents reference;
  std::unique_ptr<testing::ProcessCluster> cluster;
  std::unique_ptr<AdminClient> admin;
  shardline::v1::JobStatus running;
};
void Start(const std::string& name, int steps, int stages, int replicas, int workers, Started* out) {
  const std::string dir = TempDir(name);
  const std::string spec_path = WriteSpec(dir, name, steps, stages, replicas);
  absl::StatusOr<common::SafetensorsContents> reference = TrainReference(dir, spec_path);
  ASSERT_TRUE(reference.ok()) << reference.status();
  out->reference = *std::move(reference);
  // No re-plan for slowed steps: under load one came before the re-plan a
  // test makes and watches for (a drain's), and took its place.
  out->cluster =
      testing::ProcessCluster::Start(name + "-cluster", {workers, "", 3000, {}, {"--replan_on_slowdown=false"}});
  ASSERT_NE(out->cluster, nullptr);
  out->admin = std::make_unique<AdminClient>(out->cluster->address());
  ASSERT_NO_FATAL_FAILURE(SubmitPastACheckpoint(*out->admin, spec_path, &out->running));
}

// shardctl drain of a busy worker: its job stops at a checkpointed step a
// little ahead and moves from there onto the standby, nothing replayed, and
// ends with the reference's weights; the worker stays registered, drained,
// until undrained.
TEST(ReplanRecoveryTest, ADrainedWorkersJobMovesToTheStandbyAndEndsBitForBit) {
  // Long enough that the drain's stop (half a second's steps ahead) comes before its end.
  Started started;
  ASSERT_NO_FATAL_FAILURE(Start("drain", 1500, 2, 1, 3, &started));
  auto& cluster = started.cluster;
  AdminClient& admin = *started.admin;
  const shardline::v1::JobStatus& running = started.running;
  const std::string job_id = running.job_id();
  const std::string victim = running.stages(1).worker();
  const testing::CtlRun drain = cluster->Ctl({"drain", victim});
  ASSERT_EQ(drain.ended, "exited with status 0") << drain.err;
  EXPECT_NE(drain.out.find(" draining "), std::string::npos) << "its job runs on to the stop: " << drain.out;
  const shardline::v1::JobStatus moved = WaitFor(admin, job_id, 60, [&](const auto& s) {
    return s.plan_epoch() != running.plan_epoch() && s.state() != shardline::v1::RECOVERING;
  });
  EXPECT_NE(moved.message().find(absl::StrCat("re-planned from step ", moved.committed_step() + 1)), std::string::npos)
      << "from its stop, nothing replayed: " << moved.message();
  EXPECT_NE(moved.message().find("was drained by an operator"), std::string::npos) << moved.message();

  shardline::v1::JobStatus after;
  ASSERT_NO_FATAL_FAILURE(ExpectSucceedsWith(admin, job_id, started.reference, &after));
  EXPECT_GT(after.plan_epoch(), running.plan_epoch());
  for (const auto& stage : after.stages()) EXPECT_NE(stage.worker(), victim);

  const testing::CtlRun workers = cluster->Ctl({"get", "workers"});
  bool listed = false;
  for (const std::string& line : workers.lines()) {
    if (line.rfind(victim + " ", 0) == 0) {
      listed = true;
      EXPECT_NE(line.find(" drained "), std::string::npos) << line;
    }
  }
  EXPECT_TRUE(listed) << workers.out;
  const testing::CtlRun undrain = cluster->Ctl({"undrain", victim});
  ASSERT_EQ(undrain.ended, "exited with status 0") << undrain.err;
  EXPECT_NE(undrain.out.find(" idle "), std::string::npos) << undrain.out;
  EXPECT_EQ(cluster->Ctl({"drain", "nobody"}).ended, "exited with status 3") << "no such worker";
}

// A 3-stage job whose worker is drained with no standby re-plans onto two
// stages a lease later; once the worker is undrained the job moves back
// onto three at a step boundary, and ends with the reference's weights bit
// for bit (both moves are restarts from a committed step).
TEST(ReplanRecoveryTest, AJobThatLostAStageGrowsBackWhenAWorkerReturnsAndEndsBitForBit) {
  Started started;
  ASSERT_NO_FATAL_FAILURE(Start("grow", 600, 3, 1, 3, &started));
  auto& cluster = started.cluster;
  AdminClient& admin = *started.admin;
  const shardline::v1::JobStatus& running = started.running;
  const std::string job_id = running.job_id();
  const std::string victim = running.stages(1).worker();
  ASSERT_EQ(cluster->Ctl({"drain", victim}).ended, "exited with status 0");
  const shardline::v1::JobStatus shrunk = WaitFor(admin, job_id, 60, [&](const auto& s) {
    return s.state() != shardline::v1::RECOVERING && s.plan_epoch() != running.plan_epoch();
  });
  ASSERT_EQ(shrunk.state(), shardline::v1::RUNNING) << shrunk.message();
  ASSERT_EQ(shrunk.stages_size(), 2) << shrunk.message();
  EXPECT_NE(shrunk.message().find("re-planned onto 2 of the spec's 3 pipeline stages"), std::string::npos)
      << shrunk.message();
  ASSERT_EQ(cluster->Ctl({"undrain", victim}).ended, "exited with status 0");
  const shardline::v1::JobStatus grown = WaitFor(admin, job_id, 60, [&](const auto& s) {
    return s.plan_epoch() != shrunk.plan_epoch() && s.state() != shardline::v1::RECOVERING;
  });
  ASSERT_EQ(grown.state(), shardline::v1::RUNNING) << grown.message();
  EXPECT_EQ(grown.stages_size(), 3);
  EXPECT_NE(grown.message().find("1 worker is idle: back onto the spec's 3 pipeline stages from 2"),
            std::string::npos)
      << grown.message();
  bool returned = false;
  for (const auto& stage : grown.stages()) returned |= stage.worker() == victim;
  EXPECT_TRUE(returned) << "the undrained worker holds a stage again";
  shardline::v1::JobStatus after;
  ASSERT_NO_FATAL_FAILURE(ExpectSucceedsWith(admin, job_id, started.reference, &after));
  EXPECT_EQ(after.plan_epoch(), grown.plan_epoch()) << "no further move";
}

// A data-parallel job (one stage, two replicas) whose worker is drained
// with no standby runs on the other alone a lease later, that replica
// running both replicas' micro-batch groups, summed apart; undrained, the
// worker gets its replica back at a step boundary; the job ends with the
// reference's weights bit for bit.
TEST(ReplanRecoveryTest, ADataParallelJobThatLostAReplicaRunsOnFewerAndGrowsBackBitForBit) {
  Started started;
  ASSERT_NO_FATAL_FAILURE(Start("fold", 2000, 1, 2, 2, &started));
  auto& cluster = started.cluster;
  AdminClient& admin = *started.admin;
  const shardline::v1::JobStatus& running = started.running;
  const std::string job_id = running.job_id();
  ASSERT_EQ(running.stages_size(), 2);
  const std::string victim = running.stages(1).worker();
  ASSERT_EQ(cluster->Ctl({"drain", victim}).ended, "exited with status 0");
  const shardline::v1::JobStatus folded = WaitFor(admin, job_id, 60, [&](const auto& s) {
    return s.state() != shardline::v1::RECOVERING && s.plan_epoch() != running.plan_epoch();
  });
  ASSERT_EQ(folded.state(), shardline::v1::RUNNING) << folded.message();
  ASSERT_EQ(folded.stages_size(), 1) << folded.message();
  EXPECT_NE(folded.stages(0).worker(), victim);
  EXPECT_NE(folded.message().find("re-planned onto 1 of the spec's 2 replicas, each running the micro-batches of 2"),
            std::string::npos)
      << folded.message();
  // A few steps on one replica, then the worker comes back.
  const shardline::v1::JobStatus on_one = WaitFor(admin, job_id, 60, [&](const auto& s) {
    return s.plan_epoch() != folded.plan_epoch() || s.step() >= folded.step() + 5;
  });
  ASSERT_EQ(on_one.plan_epoch(), folded.plan_epoch()) << on_one.message();
  ASSERT_EQ(cluster->Ctl({"undrain", victim}).ended, "exited with status 0");
  const shardline::v1::JobStatus grown = WaitFor(admin, job_id, 60, [&](const auto& s) {
    return s.plan_epoch() != folded.plan_epoch() && s.state() != shardline::v1::RECOVERING;
  });
  ASSERT_EQ(grown.state(), shardline::v1::RUNNING) << grown.message();
  EXPECT_EQ(grown.stages_size(), 2);
  EXPECT_NE(grown.message().find("1 worker is idle: back onto the spec's 2 replicas from 1"), std::string::npos)
      << grown.message();
  shardline::v1::JobStatus after;
  ASSERT_NO_FATAL_FAILURE(ExpectSucceedsWith(admin, job_id, started.reference, &after));
}

}  // namespace
}  // namespace shardline::client
