// The coordinator's side of data parallelism, without gRPC: replicas
// planned as copies of one cut, their losses and validation shares added
// in a fixed order, and replicas whose shards differ failing the job.
#include <string>
#include <vector>

#include "tests/server/job_manager_fixture.h"

namespace shardline::server {
namespace {

using shardline::v1::Assignment;
using shardline::v1::JobStatus;
using testing::JobManagerTest;

TEST_F(JobManagerTest, ReplicasArePlannedAsCopiesOfOneCut) {
  for (const char* name : {"a", "b", "c", "d"}) AddWorker(name);
  auto spec = Spec(2);
  spec.mutable_parallel()->set_data_parallel(2);
  const JobStatus job = *jobs_->Submit(spec);
  ASSERT_EQ(job.state(), shardline::v1::RUNNING);
  ASSERT_EQ(delivered_.size(), 4u);
  ASSERT_EQ(job.stages_size(), 4);
  for (const auto& [worker, a] : delivered_) {
    EXPECT_EQ(a.replicas(), 2);
    const int position = a.replica() * 2 + a.stage();
    const Assignment& twin = delivered_[(1 - a.replica()) * 2 + a.stage()].second;
    EXPECT_EQ(a.unit_begin(), twin.unit_begin()) << "replicas share the cut";
    EXPECT_EQ(a.unit_end(), twin.unit_end());
    ASSERT_EQ(a.replica_addresses_size(), 2);
    EXPECT_EQ(a.replica_addresses(a.replica()), job.stages(position).worker() + ":1");
    if (a.stage() == 1) {
      EXPECT_EQ(a.upstream_address(), job.stages(a.replica() * 2).worker() + ":1") << "upstream in its replica";
    }
    EXPECT_EQ(job.stages(position).replica(), a.replica());
  }
  auto plan = jobs_->Plan(spec);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << "all four are busy";
}

// The step's loss is the replicas' last-stage losses added in rank order
// (chosen so that another order gives another double), and a step is only
// complete once every position reported it, whatever order reports come in.
TEST_F(JobManagerTest, ReplicaLossesAddInRankOrderOnceEveryPositionReported) {
  for (const char* name : {"a", "b", "c"}) AddWorker(name);
  auto spec = Spec(1, 2);
  spec.mutable_train()->set_global_batch(3);
  spec.mutable_parallel()->set_data_parallel(3);
  const JobStatus job = *jobs_->Submit(spec);
  ASSERT_EQ(job.state(), shardline::v1::RUNNING);
  auto report = [&](int replica, int64_t step, double loss) {
    shardline::v1::ReportStepRequest r = ReplicaReport(job, replica, step);
    r.set_loss(loss);
    return r;
  };
  const double losses[] = {1.0, 1e16, -1e16};  // ((1 + 1e16) − 1e16) = 0; (−1e16 + 1e16) + 1 = 1
  // Replica 2 runs ahead to step 2 before replica 0 has reported step 1.
  ASSERT_FALSE(*jobs_->ReportStep(report(2, 1, losses[2])));
  ASSERT_FALSE(*jobs_->ReportStep(report(2, 2, 7.0)));
  ASSERT_FALSE(*jobs_->ReportStep(report(1, 1, losses[1])));
  EXPECT_EQ(jobs_->Get(job.job_id())->step(), 0) << "replica 0 has not reported step 1";
  ASSERT_FALSE(*jobs_->ReportStep(report(0, 1, losses[0])));
  const JobStatus now = *jobs_->Get(job.job_id());
  EXPECT_EQ(now.step(), 1);
  EXPECT_EQ(now.loss(), 0.0) << "the losses of step 1, added in rank order";
  EXPECT_DOUBLE_EQ(now.tokens_per_s(), 60.0);
  auto bad = report(2, 2, 1.0);
  bad.set_replica(3);
  EXPECT_EQ(jobs_->ReportStep(bad).status().code(), absl::StatusCode::kInvalidArgument) << "no replica 3";
  bad = report(1, 2, 1.0);
  bad.set_worker_id(ReplicaReport(job, 0, 2).worker_id());
  EXPECT_EQ(jobs_->ReportStep(bad).status().code(), absl::StatusCode::kFailedPrecondition)
      << "replica 0's worker does not hold replica 1";
}

TEST_F(JobManagerTest, ReplicasWhoseShardsDifferFailTheJob) {
  AddWorker("a");
  AddWorker("b");
  auto spec = Spec(1, 2);
  spec.mutable_parallel()->set_data_parallel(2);
  const JobStatus job = *jobs_->Submit(spec);
  for (int replica = 0; replica < 2; ++replica) {
    shardline::v1::ReportStepRequest r = ReplicaReport(job, replica, 1);
    r.set_shard_digest(replica == 0 ? 0xabc : 0xabd);
    ASSERT_TRUE(jobs_->ReportStep(r).ok());
  }
  const JobStatus failed = *jobs_->Get(job.job_id());
  EXPECT_EQ(failed.state(), shardline::v1::FAILED);
  EXPECT_NE(failed.message().find("the replicas of stage 0 diverged at step 1"), std::string::npos)
      << failed.message();
}

// A validation pass shared by three replicas (7 batches: 0, 3, 6 / 1, 4 /
// 2, 5): their last stages' batch losses added back in batch order (values
// whose sum another order changes), their windows and exact matches added;
// shares that do not fit together are not kept.
TEST_F(JobManagerTest, ReplicaValidationSharesAddUpInBatchOrder) {
  for (const char* name : {"a", "b", "c"}) AddWorker(name);
  auto spec = Spec(1, 2);
  spec.mutable_train()->set_global_batch(3);
  spec.mutable_train()->set_eval_every(1);
  spec.mutable_parallel()->set_data_parallel(3);
  const JobStatus job = *jobs_->Submit(spec);
  ASSERT_EQ(job.state(), shardline::v1::RUNNING);
  const std::vector<double> batches = {1e16, 1.0, -1e16, 0.5, 3.25, 1e-3, 7.0};
  auto report = [&](int replica, int64_t step, const std::vector<double>& losses, int64_t windows) {
    shardline::v1::ReportStepRequest r = ReplicaReport(job, replica, step);
    for (double loss : losses) r.add_eval_losses(loss);
    r.set_eval_windows(windows);
    r.set_eval_matches(windows - 1);
    return r;
  };
  ASSERT_TRUE(jobs_->ReportStep(report(0, 1, {batches[0], batches[3], batches[6]}, 6)).ok());
  ASSERT_TRUE(jobs_->ReportStep(report(1, 1, {batches[1], batches[4]}, 4)).ok());
  ASSERT_TRUE(jobs_->ReportStep(report(2, 1, {batches[2], batches[5]}, 3)).ok());
  double want = 0.0;
  for (double loss : batches) want += loss;
  JobStatus now = *jobs_->Get(job.job_id());
  EXPECT_EQ(now.val_step(), 1);
  EXPECT_EQ(now.val_loss(), want) << "the batches' losses in batch order";
  EXPECT_EQ(now.val_windows(), 13);
  EXPECT_EQ(now.val_matches(), 10);
  // Step 2: replica 0 reports one batch and replica 1 three, which no pass gives.
  ASSERT_TRUE(jobs_->ReportStep(report(0, 2, {1.0}, 2)).ok());
  ASSERT_TRUE(jobs_->ReportStep(report(1, 2, {1.0, 2.0, 3.0}, 2)).ok());
  ASSERT_TRUE(jobs_->ReportStep(report(2, 2, {1.0}, 2)).ok());
  now = *jobs_->Get(job.job_id());
  EXPECT_EQ(now.step(), 2);
  EXPECT_EQ(now.val_step(), 1) << "the second pass is not kept";
  EXPECT_EQ(now.val_loss(), want);
}

}  // namespace
}  // namespace shardline::server
