// The coordinator's side of early stopping (train.early_stopping), without
// gRPC: the best pass's version kept, a validation step's version (and the
// later ones) committing only once its pass is known (a replica reporting
// late), passes counted once across failovers, and the job ending once its
// patience runs out, with the best version as its last.
#include <filesystem>
#include <string>
#include <vector>

#include "tests/server/job_manager_fixture.h"

namespace shardline::server {
namespace {

using shardline::v1::JobStatus;
using testing::JobManagerTest;

class JobManagerEarlyStoppingTest : public JobManagerTest {
 protected:
  // One stage on two replicas, 12 steps, a pass every 2, patience 2.
  JobStatus Start() {
    AddWorker("a");
    AddWorker("b");
    auto spec = Spec(1, 12);
    spec.mutable_train()->set_eval_every(2);
    spec.mutable_train()->mutable_early_stopping()->set_patience(2);
    spec.mutable_parallel()->set_data_parallel(2);
    EXPECT_TRUE(common::ValidateJobSpec(spec).ok());
    const JobStatus job = *jobs_->Submit(spec);
    EXPECT_EQ(job.state(), shardline::v1::RUNNING);
    return job;
  }
  // Replica `replica`'s report of `step`, with its share of the pass (one
  // batch's loss) where the step has one.
  void Report(const JobStatus& job, int replica, int64_t step, double loss) {
    shardline::v1::ReportStepRequest r = ReplicaReport(job, replica, step);
    if (step % 2 == 0) {
      r.add_eval_losses(loss);
      r.set_eval_windows(1);
    }
    ASSERT_TRUE(jobs_->ReportStep(r).ok());
  }
  // Replica 0's shard of `step` (the version commits with it: one stage).
  void Commit(const JobStatus& job, int64_t step) {
    auto committed = SendShard(job, 0, 1, step);
    ASSERT_TRUE(committed.ok()) << committed.status();
    EXPECT_TRUE(*committed) << "step " << step;
  }
  bool Stored(const JobStatus& job, int64_t step) {
    return std::filesystem::exists(dir_ + "/" + job.job_id() + "/step-" + std::to_string(step));
  }
};

TEST_F(JobManagerEarlyStoppingTest, ALatePassStillKeepsItsVersionAndThePatienceEndsTheJobThere) {
  const JobStatus job = Start();
  Report(job, 0, 1, 0);
  Report(job, 1, 1, 0);
  // Replica 0 runs ahead: its reports and shards of steps 2 and 4 arrive
  // before replica 1's report of step 2, which completes the first pass.
  // Neither version commits before it: a restart from one would never run
  // that pass again.
  Report(job, 0, 2, 1.0);
  EXPECT_FALSE(*SendShard(job, 0, 1, 2));
  Report(job, 0, 3, 0);
  Report(job, 0, 4, 2.0);
  EXPECT_FALSE(*SendShard(job, 0, 1, 4));
  EXPECT_LT(jobs_->Get(job.job_id())->committed_step(), 2);
  EXPECT_TRUE(Stored(job, 2)) << "complete, waiting for its pass";
  Report(job, 1, 2, 1.0);
  JobStatus now = *jobs_->Get(job.job_id());
  EXPECT_EQ(now.best_val_step(), 2);
  EXPECT_EQ(now.best_val_loss(), 2.0);
  EXPECT_EQ(now.committed_step(), 2) << "its pass known, it commits (and is kept); step 4's still waits";
  Report(job, 1, 3, 0);
  Report(job, 1, 4, 2.0);  // loss 4: no better
  now = *jobs_->Get(job.job_id());
  EXPECT_EQ(now.val_step(), 4);
  EXPECT_EQ(now.passes_since_best(), 1);
  EXPECT_EQ(now.state(), shardline::v1::RUNNING);
  EXPECT_EQ(now.committed_step(), 4);
  Commit(job, 5);  // a checkpoint step of its own would not remove the best either
  EXPECT_TRUE(Stored(job, 2));
  EXPECT_FALSE(Stored(job, 4));
  for (int replica : {0, 1}) {
    Report(job, replica, 5, 0);
    Report(job, replica, 6, 1.0);  // the same loss as the best: no better
  }
  now = *jobs_->Get(job.job_id());
  EXPECT_EQ(now.state(), shardline::v1::SUCCEEDED) << now.message();
  EXPECT_EQ(now.message(),
            "stopped early after step 6: 2 validation passes without improving on step 2's loss 2.0000; the "
            "weights are step 2's");
  EXPECT_EQ(now.committed_step(), 2) << "the best version is the job's last";
  EXPECT_FALSE(Stored(job, 5));
  int cancelled = 0;
  for (const auto& [worker, a] : delivered_) cancelled += a.cancel() ? 1 : 0;
  EXPECT_EQ(cancelled, 2) << "the workers, ahead of the stop, are told to stop";
  EXPECT_FALSE(SendShard(job, 0, 1, 6).ok()) << "nothing commits after the end";

  Open();  // a restarted coordinator has the same
  now = *jobs_->Get(job.job_id());
  EXPECT_EQ(now.state(), shardline::v1::SUCCEEDED);
  EXPECT_EQ(now.committed_step(), 2);
  EXPECT_EQ(now.best_val_step(), 2);
  EXPECT_EQ(*weights_->CommittedStep(job.job_id()), 2);
}

TEST_F(JobManagerEarlyStoppingTest, AJobWaitsForItsBestVersionBeforeItStops) {
  const JobStatus job = Start();
  for (int64_t step = 1; step <= 6; ++step) {
    for (int replica : {0, 1}) Report(job, replica, step, step == 2 ? 1.0 : 5.0);
  }
  JobStatus now = *jobs_->Get(job.job_id());
  EXPECT_EQ(now.passes_since_best(), 2) << "the patience ran out";
  EXPECT_EQ(now.state(), shardline::v1::RUNNING) << "but step 2's version is not stored yet";
  Commit(job, 2);
  now = *jobs_->Get(job.job_id());
  EXPECT_EQ(now.state(), shardline::v1::SUCCEEDED);
  EXPECT_EQ(now.committed_step(), 2);
}

// A worker lost after step 6 (passes after 2, the best, 4 and 6): the job
// restarts from step 2's version on the standby and runs steps 3-6 again;
// their passes count once, so the patience of 3 runs out after step 8, as
// in shardline-train, not after the replayed step 6.
TEST_F(JobManagerEarlyStoppingTest, PassesRunAgainAfterAFailoverCountOnce) {
  AddWorker("a");
  AddWorker("b");
  auto spec = Spec(1, 12);
  spec.mutable_train()->set_eval_every(2);
  spec.mutable_train()->mutable_early_stopping()->set_patience(3);
  ASSERT_TRUE(common::ValidateJobSpec(spec).ok());
  JobStatus job = *jobs_->Submit(spec);
  ASSERT_EQ(job.state(), shardline::v1::RUNNING);
  const std::string running = job.stages(0).worker();
  auto run = [&](int64_t first, int64_t last) {
    for (int64_t step = first; step <= last; ++step) Report(job, 0, step, step == 2 ? 1.0 : 2.0);
  };
  run(1, 2);
  Commit(job, 2);
  run(3, 6);
  EXPECT_EQ(jobs_->Get(job.job_id())->passes_since_best(), 2);
  // The running worker's heartbeats stop; the standby's go on.
  const std::string standby = running == "a" ? "b" : "a";
  std::string standby_id;
  for (const WorkerRecord& w : registry_->List()) {
    if (w.name == standby) standby_id = w.id;
  }
  now_ += absl::Milliseconds(40);
  ASSERT_TRUE(registry_->Heartbeat(standby_id).ok());
  now_ += absl::Milliseconds(40);
  jobs_->WorkersLost(registry_->ExpireLeases());
  jobs_->Tick();
  job = *jobs_->Get(job.job_id());
  ASSERT_EQ(job.state(), shardline::v1::RUNNING) << job.message();
  ASSERT_EQ(job.stages(0).worker(), standby);
  run(3, 6);
  job = *jobs_->Get(job.job_id());
  EXPECT_EQ(job.state(), shardline::v1::RUNNING) << job.message();
  EXPECT_EQ(job.passes_since_best(), 2) << "the passes after 4 and 6 counted once";
  EXPECT_EQ(job.val_step(), 6);
  run(7, 8);
  job = *jobs_->Get(job.job_id());
  EXPECT_EQ(job.state(), shardline::v1::SUCCEEDED) << job.message();
  EXPECT_NE(job.message().find("stopped early after step 8: 3 validation passes"), std::string::npos)
      << job.message();
  EXPECT_EQ(job.committed_step(), 2);
}

// The pass after step 2 never completes: replica 1's worker dies before it
// reports step 2, while replica 0 has stored the versions of steps 2 and 4.
// Neither committed (their passes were not known), so the job restarts
// from before step 2 and runs that pass again: it stops where
// shardline-train does, with step 2's weights. (When those versions
// committed before their passes, the restart began after step 4, the pass
// after step 2 was never counted, and the job stopped a pass late with
// other weights.)
TEST_F(JobManagerEarlyStoppingTest, APassThatNeverCompletedRunsAgainAfterAFailover) {
  AddWorker("a");
  AddWorker("b");
  AddWorker("c");  // the standby
  auto spec = Spec(1, 12);
  spec.mutable_train()->set_eval_every(2);
  spec.mutable_train()->mutable_early_stopping()->set_patience(2);
  spec.mutable_parallel()->set_data_parallel(2);
  ASSERT_TRUE(common::ValidateJobSpec(spec).ok());
  JobStatus job = *jobs_->Submit(spec);
  ASSERT_EQ(job.state(), shardline::v1::RUNNING);
  Report(job, 0, 1, 0);
  Report(job, 1, 1, 0);
  for (int64_t step = 2; step <= 4; ++step) {
    Report(job, 0, step, 1.0);
    if (step % 2 == 0) {
      EXPECT_FALSE(*SendShard(job, 0, 1, step)) << "step " << step << " waits for its pass";
    }
  }
  // Replica 1's worker stops; the others' heartbeats go on.
  const std::string lost = job.stages(1).worker();
  now_ += absl::Milliseconds(40);
  for (const WorkerRecord& w : registry_->List()) {
    if (w.name != lost) {
      ASSERT_TRUE(registry_->Heartbeat(w.id).ok());
    }
  }
  now_ += absl::Milliseconds(40);
  jobs_->WorkersLost(registry_->ExpireLeases());
  jobs_->Tick();
  job = *jobs_->Get(job.job_id());
  ASSERT_EQ(job.state(), shardline::v1::RUNNING) << job.message();
  EXPECT_LT(job.committed_step(), 2);
  EXPECT_EQ(job.val_step(), 0) << "no pass completed";
  EXPECT_FALSE(Stored(job, 2)) << "the waiting versions went with the old epoch";
  // Both replicas run from step 1 again: passes after 2 (the best), 4, 6.
  for (int64_t step = 1; step <= 6; ++step) {
    for (int replica : {0, 1}) Report(job, replica, step, step == 2 ? 1.0 : 2.0);
    if (step == 2) {
      EXPECT_TRUE(*SendShard(job, 0, 1, 2)) << "its pass is known: it commits";
    }
  }
  job = *jobs_->Get(job.job_id());
  EXPECT_EQ(job.state(), shardline::v1::SUCCEEDED) << job.message();
  EXPECT_EQ(job.message(),
            "stopped early after step 6: 2 validation passes without improving on step 2's loss 2.0000; the "
            "weights are step 2's");
  EXPECT_EQ(job.committed_step(), 2);
}

// Replicas' shares of a pass that no pass gives (one batch and three):
// a job without early stopping leaves the pass out
// (job_manager_replicas_test); one that stops early cannot follow its
// passes, nor commit the versions waiting for that one, and fails saying
// so rather than never committing again.
TEST_F(JobManagerEarlyStoppingTest, APassThatCannotBeAddedUpFailsTheJob) {
  const JobStatus job = Start();
  Report(job, 0, 1, 0);
  Report(job, 1, 1, 0);
  Report(job, 0, 2, 1.0);
  shardline::v1::ReportStepRequest three = ReplicaReport(job, 1, 2);
  for (double loss : {1.0, 2.0, 3.0}) three.add_eval_losses(loss);
  three.set_eval_windows(3);
  ASSERT_TRUE(jobs_->ReportStep(three).ok());
  const JobStatus now = *jobs_->Get(job.job_id());
  EXPECT_EQ(now.state(), shardline::v1::FAILED);
  EXPECT_NE(now.message().find("the validation pass after step 2 cannot be added up"), std::string::npos)
      << now.message();
}

TEST_F(JobManagerEarlyStoppingTest, EveryJobWithValidationShowsItsBestPass) {
  AddWorker("a");
  auto spec = Spec(1, 4);
  spec.mutable_train()->set_eval_every(1);
  const JobStatus job = *jobs_->Submit(spec);
  const std::vector<double> losses = {3.0, 2.0, 2.5, 2.25};
  for (int64_t step = 1; step <= 4; ++step) {
    shardline::v1::ReportStepRequest r = ReplicaReport(job, 0, step);
    r.add_eval_losses(losses[step - 1]);
    r.set_eval_windows(1);
    ASSERT_TRUE(jobs_->ReportStep(r).ok());
  }
  Commit(job, 4);
  const JobStatus now = *jobs_->Get(job.job_id());
  EXPECT_EQ(now.state(), shardline::v1::SUCCEEDED);
  EXPECT_EQ(now.best_val_step(), 2);
  EXPECT_EQ(now.passes_since_best(), 2);
  EXPECT_EQ(now.committed_step(), 4) << "without early stopping it ends with its last weights";
  EXPECT_EQ(now.message(), "");
}

}  // namespace
}  // namespace shardline::server
