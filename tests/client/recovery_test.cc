// Recovery through the real binaries, as separate processes on loopback:
// the coordinator killed with SIGKILL mid-run and started again on the same
// state dir resumes the job from its committed version, and the job ends
// with exactly the weights of an uninterrupted shardline-train run; earlier
// jobs are still served and no id is handed out twice; any one worker
// killed with SIGKILL at a random moment, with or without a standby, and the
// job ends with those weights too.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/admin_client.h"
#include "common/file_util.h"
#include "common/job_spec.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/client/process_cluster.h"
#include "tests/client/process_test_util.h"
#include "tests/client/recovery_test_util.h"

namespace shardline::client {
namespace {

using testing::ExpectSameWeights;
using testing::TempDir;
using testing::TrainReference;
using testing::WaitFor;
using testing::WriteSpec;

TEST(RecoveryTest, AKilledCoordinatorRestartedOnItsStateResumesTheJobBitForBit) {
  const std::string dir = TempDir("recovery-coordinator");
  constexpr int kSteps = 120;
  const std::string spec_path = WriteSpec(dir, "resumed", kSteps);
  auto reference = TrainReference(dir, spec_path);
  ASSERT_TRUE(reference.ok()) << reference.status();

  auto cluster = testing::ProcessCluster::Start("recovery-coordinator-cluster", {2, "", 3000});
  ASSERT_NE(cluster, nullptr);
  AdminClient admin(cluster->address());
  // An earlier job, finished before the restart.
  auto early_spec = common::LoadJobSpec(WriteSpec(dir, "early", 10));
  ASSERT_TRUE(early_spec.ok());
  auto early = admin.Submit(*early_spec);
  ASSERT_TRUE(early.ok()) << early.status();
  ASSERT_EQ(WaitFor(admin, early->job_id(), 60, [](const auto& s) { return s.state() == shardline::v1::SUCCEEDED; })
                .state(),
            shardline::v1::SUCCEEDED);
  auto early_weights = admin.Export(early->job_id());
  ASSERT_TRUE(early_weights.ok()) << early_weights.status();
  std::set<std::string> ids_before;
  auto listed = admin.ListWorkers();
  ASSERT_TRUE(listed.ok()) << listed.status();
  for (const auto& w : listed->workers()) ids_before.insert(w.worker_id());

  auto spec = common::LoadJobSpec(spec_path);
  ASSERT_TRUE(spec.ok());
  auto job = admin.Submit(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  // Past its first checkpoint, mid-run: the coordinator dies.
  const shardline::v1::JobStatus before =
      WaitFor(admin, job->job_id(), 60, [](const auto& s) { return s.committed_step() >= 10 || s.step() >= 15; });
  ASSERT_EQ(before.state(), shardline::v1::RUNNING) << before.message();
  ASSERT_LT(before.step(), kSteps) << "the job ended before the kill: make it longer";
  cluster->KillCoordinator();
  ASSERT_TRUE(cluster->RestartCoordinator());

  // The job resumes at a new epoch and ends with the reference's weights.
  const shardline::v1::JobStatus after =
      WaitFor(admin, job->job_id(), 120, [](const auto& s) { return s.state() != shardline::v1::RUNNING &&
                                                                    s.state() != shardline::v1::RECOVERING; });
  ASSERT_EQ(after.state(), shardline::v1::SUCCEEDED)
      << after.message() << "\n" << common::ReadFile(cluster->dir() + "/coordinator1.log").value_or("");
  EXPECT_GT(after.plan_epoch(), before.plan_epoch());
  auto exported = admin.Export(job->job_id());
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto weights = common::ParseSafetensors(*exported);
  ASSERT_TRUE(weights.ok()) << weights.status();
  ExpectSameWeights(*reference, *weights);

  // The earlier job is served as it was; ids continue.
  EXPECT_EQ(admin.Get(early->job_id())->state(), shardline::v1::SUCCEEDED);
  auto early_again = admin.Export(early->job_id());
  ASSERT_TRUE(early_again.ok()) << early_again.status();
  EXPECT_EQ(*early_again, *early_weights);
  auto next = admin.Submit(*early_spec);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->job_id(), "job-3");
  listed = admin.ListWorkers();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->workers_size(), 2);
  for (const auto& w : listed->workers()) EXPECT_EQ(ids_before.count(w.worker_id()), 0u) << w.worker_id();
  WaitFor(admin, next->job_id(), 60, [](const auto& s) { return s.state() == shardline::v1::SUCCEEDED; });
}

// kill -9 of the worker at `victim` of a p × d grid at a moment drawn from
// `random` past the first checkpoint (a step, then a few ms into it: some
// micro-batch),
// with a standby registered or not: the job restarts from its committed
// step on the survivors and the standby, or without one a lease later on
// the survivors with one stage fewer per replica (one stage: fewer
// replicas), and ends with `reference`'s weights bit for bit.
void ExpectAKilledWorkerRecovers(const std::string& spec_path, int stages, int replicas, int victim, bool standby,
                                 const common::SafetensorsContents& reference, std::mt19937& random) {
  const int kill_step = std::uniform_int_distribution<int>(12, 60)(random);
  const int delay_ms = std::uniform_int_distribution<int>(0, 8)(random);
  SCOPED_TRACE(absl::StrCat(stages, " × ", replicas, ", kill -9 of position ", victim, " ", delay_ms,
                            " ms after step ", kill_step, ", ", standby ? "a standby" : "no standby"));
  auto cluster = testing::ProcessCluster::Start(absl::StrCat("kill-", stages, "x", replicas, "-", victim, "-", standby),
                                                {stages * replicas + (standby ? 1 : 0), "", 3000});
  ASSERT_NE(cluster, nullptr);
  AdminClient admin(cluster->address());
  auto spec = common::LoadJobSpec(spec_path);
  ASSERT_TRUE(spec.ok());
  auto job = admin.Submit(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  // (The checkpoint of step 10 is uploaded in the background: it may
  // commit a few steps later.)
  const shardline::v1::JobStatus checkpointed = WaitFor(
      admin, job->job_id(), 60, [&](const auto& s) { return s.step() >= kill_step && s.committed_step() >= 10; });
  ASSERT_EQ(checkpointed.state(), shardline::v1::RUNNING) << checkpointed.message();
  ASSERT_GE(checkpointed.committed_step(), 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  const std::string killed = checkpointed.stages(victim).worker();
  ::kill(cluster->worker_pid(killed.back() - '0'), SIGKILL);
  const shardline::v1::JobStatus at_kill = *admin.Get(job->job_id());
  ASSERT_NE(at_kill.state(), shardline::v1::SUCCEEDED) << "the job ended before the kill: make it longer";
  const shardline::v1::JobStatus after = WaitFor(admin, job->job_id(), 120, [&](const auto& s) {
    return s.plan_epoch() != checkpointed.plan_epoch() && (s.state() == shardline::v1::SUCCEEDED ||
                                                           s.state() == shardline::v1::FAILED ||
                                                           s.state() == shardline::v1::CANCELLED);
  });
  ASSERT_EQ(after.state(), shardline::v1::SUCCEEDED) << after.message();
  EXPECT_GT(after.plan_epoch(), checkpointed.plan_epoch());
  // Without a standby: one stage fewer per replica, or with one stage,
  // half the replicas, each running two replicas' micro-batch groups.
  EXPECT_EQ(after.stages_size(), standby ? stages * replicas : stages > 1 ? (stages - 1) * replicas : replicas / 2);
  for (const auto& stage : after.stages()) EXPECT_NE(stage.worker(), killed);
  auto exported = admin.Export(job->job_id());
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto weights = common::ParseSafetensors(*exported);
  ASSERT_TRUE(weights.ok()) << weights.status();
  ExpectSameWeights(reference, *weights);
}

// Every position of a p × d grid killed in turn, each with and without a
// standby (a bounded loop of runs; the moments are random, the seed logged),
// on a spec of `steps`.
void ExpectEveryKilledPositionRecovers(const std::string& name, int stages, int replicas, int steps = 200) {
  const std::string dir = TempDir(name);
  const std::string spec_path = WriteSpec(dir, name, steps, stages, replicas);
  auto reference = TrainReference(dir, spec_path);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const unsigned seed = std::random_device()();
  std::printf("kill moments seeded with %u\n", seed);
  std::mt19937 random(seed);
  for (const bool standby : {true, false}) {
    for (int victim = 0; victim < stages * replicas; ++victim) {
      ExpectAKilledWorkerRecovers(spec_path, stages, replicas, victim, standby, *reference, random);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(RecoveryTest, AnyKilledWorkerOfAPipelineEndsBitForBitWithOrWithoutAStandby) {
  ExpectEveryKilledPositionRecovers("kill-pipeline", 3, 1);
}

TEST(RecoveryTest, AnyKilledWorkerOfAGridEndsBitForBitWithOrWithoutAStandby) {
  ExpectEveryKilledPositionRecovers("kill-grid", 2, 2);
}

TEST(RecoveryTest, AnyKilledReplicaOfADataParallelJobEndsBitForBitWithOrWithoutAStandby) {
  ExpectEveryKilledPositionRecovers("kill-dp", 1, 2, 1000);  // a step takes a millisecond
}

// Runs `spec_path` on a fresh cluster of `workers` with `worker_flags`,
// watching it: each step's loss as the coordinator completed it (a step
// seen twice, or going back, fails the test), and the exported weights.
void RunWatched(const std::string& name, const std::string& spec_path, int workers,
                const std::vector<std::string>& worker_flags, std::map<int64_t, double>* losses,
                common::SafetensorsContents* weights) {
  auto cluster = testing::ProcessCluster::Start(name, {workers, "", 3000, worker_flags});
  ASSERT_NE(cluster, nullptr);
  AdminClient admin(cluster->address(), absl::Seconds(120));
  auto spec = common::LoadJobSpec(spec_path);
  ASSERT_TRUE(spec.ok());
  auto job = admin.Submit(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  int64_t last_step = 0;
  auto ended = admin.Watch(job->job_id(), [&](const shardline::v1::JobStatus& s) {
    EXPECT_GE(s.step(), last_step) << "a step went back";
    if (s.step() > last_step) {
      EXPECT_EQ(losses->count(s.step()), 0u) << "step " << s.step() << " completed twice";
      (*losses)[s.step()] = s.loss();
    }
    last_step = s.step();
  });
  ASSERT_TRUE(ended.ok()) << ended.status();
  ASSERT_EQ(ended->state(), shardline::v1::SUCCEEDED) << ended->message();
  auto exported = admin.Export(job->job_id());
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto parsed = common::ParseSafetensors(*exported);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  *weights = *std::move(parsed);
}

// Every step report arriving late, out of order and twice, every shard
// twice (the workers' test hook): each is applied once; the job's steps,
// losses and weights are those of a run whose reports arrived in order.
TEST(RecoveryTest, DuplicatedAndReorderedReportsApplyOnce) {
  const std::string dir = TempDir("scrambled");
  const std::string spec_path = WriteSpec(dir, "scrambled", 30, 2, 2);
  std::map<int64_t, double> plain_losses, scrambled_losses;
  common::SafetensorsContents plain, scrambled;
  RunWatched("plain-reports", spec_path, 4, {}, &plain_losses, &plain);
  RunWatched("scrambled-reports", spec_path, 4, {"--test_only_scramble_reports"}, &scrambled_losses, &scrambled);
  EXPECT_EQ(scrambled_losses.rbegin()->first, 30);
  for (const auto& [step, loss] : scrambled_losses) {
    if (plain_losses.count(step)) {
      EXPECT_EQ(loss, plain_losses.at(step)) << "step " << step;
    }
  }
  ExpectSameWeights(plain, scrambled);
  auto reference = TrainReference(dir, spec_path);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ExpectSameWeights(*reference, scrambled);
}

// SIGTERM on a worker: it tells the coordinator, and its job stops at once
// naming it as gone (to wait for a worker: there is no standby), instead of
// a lease later as "lost: no heartbeat".
TEST(RecoveryTest, AWorkerStoppedWithSigtermLeavesAndItsJobStopsNamingIt) {
  const std::string dir = TempDir("recovery-leave");
  auto cluster = testing::ProcessCluster::Start("recovery-leave-cluster", {2, "", 20000});
  ASSERT_NE(cluster, nullptr);
  AdminClient admin(cluster->address());
  auto spec = common::LoadJobSpec(WriteSpec(dir, "long", 100000));
  ASSERT_TRUE(spec.ok());
  auto job = admin.Submit(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const shardline::v1::JobStatus running = WaitFor(admin, job->job_id(), 60, [](const auto& s) { return s.step() >= 3; });
  ASSERT_EQ(running.state(), shardline::v1::RUNNING) << running.message();
  ASSERT_EQ(running.stages_size(), 2);
  const std::string victim = running.stages(1).worker();
  ::kill(cluster->worker_pid(victim.back() - '0'), SIGTERM);
  const shardline::v1::JobStatus ended =
      WaitFor(admin, job->job_id(), 30, [](const auto& s) { return s.state() != shardline::v1::RUNNING; });
  EXPECT_EQ(ended.state(), shardline::v1::RECOVERING);
  EXPECT_NE(ended.message().find("recovering (worker " + victim + " (stage 1) left: it is shutting down)"),
            std::string::npos)
      << ended.message();
  auto listed = admin.ListWorkers();
  ASSERT_TRUE(listed.ok()) << listed.status();
  for (const auto& w : listed->workers()) {
    EXPECT_EQ(w.state(), w.name() == victim ? "lost" : "idle") << w.name();
  }
}

}  // namespace
}  // namespace shardline::client
