// Recovery through the real binaries, as separate processes on loopback:
// the coordinator killed with SIGKILL mid-run and started again on the same
// state dir resumes the job from its committed version, and the job ends
// with exactly the weights of an uninterrupted shardline-train run; earlier
// jobs are still served and no id is handed out twice.
#include <signal.h>

#include <chrono>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "client/admin_client.h"
#include "common/file_util.h"
#include "common/job_spec.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/client/process_cluster.h"
#include "tests/client/process_test_util.h"

namespace shardline::client {
namespace {

using testing::kBin;
using testing::RunToEnd;
using testing::TempDir;

std::string WriteSpec(const std::string& dir, const std::string& name, int steps, int stages = 2,
                      int replicas = 1) {
  const std::string path = dir + "/" + name + ".json";
  std::ofstream(path) << R"({"name": ")" << name << R"(",
    "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 32, "n_heads": 2, "n_layers": 3},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": )" << steps << R"(, "global_batch": 8, "micro_batches": )" << 4 / replicas
                      << R"(, "seed": 5, "log_every": 1000,
              "optimizer": {"kind": "adamw", "lr": 0.003, "warmup_steps": 2, "grad_clip": 1.0}},
    "parallel": {"pipeline_stages": )" << stages << R"(, "data_parallel": )" << replicas
                      << R"(, "schedule": "1f1b"},
    "checkpoint": {"every_steps": 10}})";
  return path;
}

// Polls until `done(status)` (or about `seconds`); the last status.
shardline::v1::JobStatus WaitFor(AdminClient& admin, const std::string& job_id, double seconds,
                                 const std::function<bool(const shardline::v1::JobStatus&)>& done) {
  shardline::v1::JobStatus last;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    absl::StatusOr<shardline::v1::JobStatus> status = admin.Get(job_id);
    if (status.ok()) {
      last = *status;
      if (done(last)) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return last;
}

// The weights shardline-train ends with on `spec_path`: what every
// recovered run must end with.
absl::StatusOr<common::SafetensorsContents> TrainReference(const std::string& dir, const std::string& spec_path) {
  const std::string ended = RunToEnd(
      {kBin + "/shardline-train", spec_path, "--threads=1", "--out=" + dir + "/ref.safetensors"}, dir + "/train.log", 120);
  if (ended != "exited with status 0") return absl::InternalError("shardline-train " + ended);
  return common::ReadSafetensors(dir + "/ref.safetensors");
}

void ExpectSameWeights(const common::SafetensorsContents& want, const common::SafetensorsContents& got) {
  ASSERT_EQ(want.tensors.size(), got.tensors.size());
  for (const auto& [name, tensor] : want.tensors) {
    ASSERT_EQ(got.tensors.count(name), 1u) << name;
    const auto x = tensor.values<float>();
    const auto y = got.tensors.at(name).values<float>();
    ASSERT_EQ(x.size(), y.size()) << name;
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]) << name << "[" << i << "]";
  }
}

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
                                                                    s.state() != shardline::v1::PENDING; });
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

// kill -9 of one worker of a p × d grid mid-run, past a checkpoint, with a
// standby registered: the job restarts from its committed step on the
// survivors and the standby and ends with shardline-train's weights.
void ExpectFailoverOntoAStandby(const std::string& name, int stages, int replicas, int victim_position) {
  const std::string dir = TempDir(name);
  constexpr int kSteps = 60;
  const std::string spec_path = WriteSpec(dir, name, kSteps, stages, replicas);
  auto reference = TrainReference(dir, spec_path);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto cluster = testing::ProcessCluster::Start(name + "-cluster", {stages * replicas + 1, "", 3000});
  ASSERT_NE(cluster, nullptr);
  AdminClient admin(cluster->address());
  auto spec = common::LoadJobSpec(spec_path);
  ASSERT_TRUE(spec.ok());
  auto job = admin.Submit(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const shardline::v1::JobStatus before =
      WaitFor(admin, job->job_id(), 60, [](const auto& s) { return s.committed_step() >= 10; });
  ASSERT_EQ(before.state(), shardline::v1::RUNNING) << before.message();
  ASSERT_LT(before.step(), kSteps) << "the job ended before the kill: make it longer";
  const std::string victim = before.stages(victim_position).worker();
  ::kill(cluster->worker_pid(victim.back() - '0'), SIGKILL);
  const shardline::v1::JobStatus after = WaitFor(admin, job->job_id(), 120, [&](const auto& s) {
    return s.plan_epoch() != before.plan_epoch() && s.state() != shardline::v1::RUNNING &&
           s.state() != shardline::v1::PENDING;
  });
  ASSERT_EQ(after.state(), shardline::v1::SUCCEEDED) << after.message();
  EXPECT_GT(after.plan_epoch(), before.plan_epoch());
  for (const auto& stage : after.stages()) EXPECT_NE(stage.worker(), victim);
  auto exported = admin.Export(job->job_id());
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto weights = common::ParseSafetensors(*exported);
  ASSERT_TRUE(weights.ok()) << weights.status();
  ExpectSameWeights(*reference, *weights);
}

TEST(RecoveryTest, AKilledWorkerFailsOverOntoAStandbyBitForBit) { ExpectFailoverOntoAStandby("failover", 2, 1, 1); }

TEST(RecoveryTest, AKilledReplicaFailsOverOntoAStandbyBitForBit) {
  ExpectFailoverOntoAStandby("failover-grid", 2, 2, 2);
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
  EXPECT_EQ(ended.state(), shardline::v1::PENDING);
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
