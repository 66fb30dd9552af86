// A data-parallel job that lost workers and got no standby within its grace
// re-plans onto fewer replicas (the largest divisor of d the survivors can
// hold) when fewer stages cannot help: each replica runs d / d′ of the
// spec's replicas' micro-batch groups (Assignment.replica_groups, the
// folded spec), the step's loss adds each group's in order, and the job
// grows back onto d replicas once enough workers are idle. The held
// gradients' memory is planned for.
#include <algorithm>
#include <set>

#include "common/cost_model.h"
#include "server/grid_placement.h"
#include "tests/server/job_manager_fixture.h"

namespace shardline::server {
namespace {

using shardline::v1::Assignment;
using shardline::v1::JobStatus;

class FewerReplicasTest : public testing::JobManagerTest {
 protected:
  shardline::v1::JobSpec DataParallel(int replicas, int steps) {
    auto spec = Spec(1, steps);
    spec.mutable_parallel()->set_data_parallel(replicas);
    spec.mutable_train()->set_global_batch(2 * replicas);
    return spec;
  }
  // The assignments of `job`'s running epoch, by replica.
  std::map<int, std::pair<std::string, Assignment>> Positions(const JobStatus& job) {
    std::map<int, std::pair<std::string, Assignment>> out;
    for (const auto& [worker, a] : delivered_) {
      if (!a.cancel() && a.plan_epoch() == job.plan_epoch() && a.has_spec()) out[a.replica()] = {worker, a};
    }
    return out;
  }
  shardline::v1::ReportStepRequest ReplicaReport(const JobStatus& job, const std::string& worker, int replica,
                                                 int64_t step) {
    shardline::v1::ReportStepRequest r;
    r.set_job_id(job.job_id());
    r.set_plan_epoch(job.plan_epoch());
    r.set_worker_id(worker);
    r.set_replica(replica);
    r.set_step(step);
    r.set_loss(1.0);
    r.set_tokens(100);
    r.set_step_seconds(0.5);
    r.set_busy_seconds(0.25);
    return r;
  }
  // Every position of `job` reports `step` (with `groups` losses each: a
  // third, a seventh, …, differing per replica).
  void ReportAll(const JobStatus& job, int64_t step, int groups) {
    for (const auto& [replica, position] : Positions(job)) {
      auto r = ReplicaReport(job, position.first, replica, step);
      double sum = 0;
      for (int g = 0; groups > 1 && g < groups; ++g) {
        r.add_group_losses(1.0 / (3 + 4 * (replica * groups + g)));
        sum += r.group_losses(g);
      }
      if (groups > 1) r.set_loss(sum);
      if (groups == 1) r.set_loss(1.0 / (3 + 4 * replica));
      ASSERT_TRUE(jobs_->ReportStep(r).ok()) << "replica " << replica << " step " << step;
    }
  }
  // Heartbeats every worker but `dead` until `job` runs at another epoch.
  JobStatus LoseAndWait(const JobStatus& job, const std::string& dead) {
    for (int i = 0; i < 20; ++i) {
      now_ += absl::Milliseconds(20);
      for (const WorkerRecord& w : registry_->List()) {
        if (w.id != dead && !w.lost) (void)registry_->Heartbeat(w.id);
      }
      jobs_->WorkersLost(registry_->ExpireLeases());
      jobs_->Tick();
      const JobStatus now = *jobs_->Get(job.job_id());
      if (now.state() == shardline::v1::RUNNING && now.plan_epoch() != job.plan_epoch()) return now;
    }
    return *jobs_->Get(job.job_id());
  }
};

TEST_F(FewerReplicasTest, FourReplicasLosingOneRunAsTwoEachRunningTwoAndGrowBack) {
  for (const char* name : {"a", "b", "c", "d"}) AddWorker(name);
  const JobStatus job = *jobs_->Submit(DataParallel(4, 100));
  ASSERT_EQ(Positions(job).size(), 4u);
  ReportAll(job, 1, 1);
  ASSERT_TRUE(SendShard(job, 0, 1, 1).ok());
  ASSERT_EQ(jobs_->Get(job.job_id())->committed_step(), 1);
  const std::string dead = Positions(job).at(3).first;
  delivered_.clear();
  const JobStatus folded = LoseAndWait(job, dead);
  ASSERT_EQ(folded.state(), shardline::v1::RUNNING) << folded.message();
  EXPECT_EQ(folded.stages_size(), 2) << "the largest divisor of 4 that 3 workers hold";
  EXPECT_NE(folded.message().find("re-planned onto 2 of the spec's 4 replicas, each running the micro-batches of 2, "
                                  "from step 2"),
            std::string::npos)
      << folded.message();
  const auto positions = Positions(folded);
  ASSERT_EQ(positions.size(), 2u);
  for (const auto& [replica, position] : positions) {
    const Assignment& a = position.second;
    EXPECT_NE(position.first, dead);
    EXPECT_EQ(a.replicas(), 2);
    EXPECT_EQ(a.replica_groups(), 2);
    EXPECT_EQ(a.replica_addresses_size(), 2);
    EXPECT_EQ(a.spec().parallel().data_parallel(), 2) << "the folded spec";
    EXPECT_EQ(a.spec().train().micro_batches(), 2);
    EXPECT_EQ(a.first_step(), 2);
  }
  EXPECT_EQ(registry_->Idle().size(), 1u) << "the third survivor waits as a standby";

  // A last stage's group losses must be one per group.
  auto wrong = ReplicaReport(folded, positions.at(0).first, 0, 2);
  wrong.add_group_losses(0.5);
  EXPECT_EQ(jobs_->ReportStep(wrong).status().code(), absl::StatusCode::kInvalidArgument);
  // The step's loss adds the four groups' one by one, as four replicas'.
  ReportAll(folded, 2, 2);
  const double want = ((1.0 / 3 + 1.0 / 7) + 1.0 / 11) + 1.0 / 15;
  EXPECT_EQ(jobs_->Get(job.job_id())->loss(), want);

  // A worker returns: with the standby, four replicas again, at a step boundary.
  AddWorker("e");
  int64_t stop = 0;
  for (int64_t step = 3; step <= 20 && stop == 0; ++step) {
    ReportAll(folded, step, 2);
    for (const auto& [w, a] : delivered_) stop = std::max<int64_t>(stop, a.stop_after_step());
  }
  ASSERT_GT(stop, 0) << jobs_->Get(job.job_id())->message();
  EXPECT_NE(jobs_->Get(job.job_id())->message().find("back onto the spec's 4 replicas from 2"), std::string::npos)
      << jobs_->Get(job.job_id())->message();
  for (int64_t step = jobs_->Get(job.job_id())->step() + 1; step <= stop; ++step) ReportAll(folded, step, 2);
  ASSERT_TRUE(SendShard(folded, 0, 1, stop).ok());
  const JobStatus grown = *jobs_->Get(job.job_id());
  ASSERT_EQ(grown.state(), shardline::v1::RUNNING) << grown.message();
  EXPECT_EQ(grown.stages_size(), 4);
  for (const auto& [replica, position] : Positions(grown)) {
    EXPECT_EQ(position.second.replica_groups(), 0);
    EXPECT_EQ(position.second.spec().parallel().data_parallel(), 4);
    EXPECT_EQ(position.second.first_step(), stop + 1);
  }
}

TEST_F(FewerReplicasTest, ThreeReplicasLosingOneRunAsOneAndAStageShrinkComesFirst) {
  for (const char* name : {"a", "b", "c"}) AddWorker(name);
  const JobStatus job = *jobs_->Submit(DataParallel(3, 100));
  ReportAll(job, 1, 1);
  ASSERT_TRUE(SendShard(job, 0, 1, 1).ok());
  const std::string lost = Positions(job).at(1).first;
  delivered_.clear();
  const JobStatus folded = LoseAndWait(job, lost);
  ASSERT_EQ(folded.state(), shardline::v1::RUNNING) << folded.message();
  ASSERT_EQ(folded.stages_size(), 1) << "2 does not divide 3";
  EXPECT_EQ(Positions(folded).at(0).second.replica_groups(), 3);
  EXPECT_EQ(Positions(folded).at(0).second.replica_addresses_size(), 0);

  // Two stages × two replicas losing one: one stage fewer, replicas kept.
  auto grid = Spec(2, 100);
  grid.mutable_parallel()->set_data_parallel(2);
  grid.mutable_train()->set_global_batch(4);
  ASSERT_TRUE(jobs_->Cancel(job.job_id()).ok());
  AddWorker("d");
  AddWorker("e");  // b is lost: a, c, d and e
  const JobStatus second = *jobs_->Submit(grid);
  ASSERT_EQ(second.state(), shardline::v1::RUNNING) << second.message();
  const std::string dead = second.stages(3).worker();
  std::string dead_id;
  for (const WorkerRecord& w : registry_->List()) {
    if (w.name == dead) dead_id = w.id;
  }
  delivered_.clear();
  const JobStatus shrunk = LoseAndWait(second, dead_id);
  ASSERT_EQ(shrunk.state(), shardline::v1::RUNNING) << shrunk.message();
  EXPECT_EQ(shrunk.stages_size(), 2);
  EXPECT_NE(shrunk.message().find("re-planned onto 1 of the spec's 2 pipeline stages"), std::string::npos)
      << shrunk.message();
  for (const auto& [w, a] : delivered_) EXPECT_EQ(a.replica_groups(), 0);
}

// Each earlier group's gradients wait on the host: a float a parameter
// more, which a worker must hold besides the folded plan's own memory.
TEST_F(FewerReplicasTest, ThePlacementCountsTheHeldGradients) {
  const auto spec = DataParallel(2, 10);
  AddWorker("probe");
  auto preview = PreviewGrid(common::FoldReplicas(spec, 1), registry_->Idle());
  ASSERT_TRUE(preview.ok()) << preview.status();
  const int64_t plan = preview->stages(0).memory_bytes();
  const int64_t held = common::UnitRangeParameters(spec.model(), 0, common::PipelineUnits(spec.model())) * 4;
  for (int64_t memory : {plan + held - 1, plan + held}) {
    WorkerRecord w = registry_->Idle()[0];
    w.capabilities.set_memory_bytes(memory);
    auto placed = PlaceGrid(spec, "job-x", 2, 1, {w}, {}, {}, LinksFrom(nullptr), 1);
    if (memory < plan + held) {
      EXPECT_EQ(placed.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(placed.status().message().find("running 2 replicas' micro-batch groups"), std::string::npos)
          << placed.status();
    } else {
      ASSERT_TRUE(placed.ok()) << placed.status();
      EXPECT_EQ(placed->assignments[0].replica_groups(), 2);
    }
  }
  EXPECT_EQ(PlaceGrid(spec, "job-x", 2, 1, registry_->Idle(), {}, {}, LinksFrom(nullptr), 3).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "3 does not divide 2";
}

}  // namespace
}  // namespace shardline::server
