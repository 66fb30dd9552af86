// The coordinator placing a tensor-parallel job as a grid, and which stage
// edges carry parts of tensors.
#include <map>
#include <set>
#include <utility>

#include "tests/server/job_manager_fixture.h"

namespace shardline::server {
namespace {

using shardline::v1::Assignment;
using shardline::v1::JobStatus;
using testing::JobManagerTest;

// A p × t grid: each (stage, tensor rank) on a worker of its own, the
// ranks of a stage told each other's addresses, each rank's upstream the
// same rank of the previous stage; a step completes once every position
// reported it, with tensor rank 0's loss.
TEST_F(JobManagerTest, ATensorParallelJobIsPlacedAsAGridOfPositions) {
  for (const char* name : {"a", "b", "c", "d"}) AddWorker(name);
  auto spec = Spec(2);
  spec.mutable_parallel()->set_tensor_parallel(2);
  auto plan = jobs_->Plan(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages_size(), 4);
  for (const auto& st : plan->stages()) {
    EXPECT_GT(st.tensor_bytes_per_step(), 0) << "stage " << st.stage() << ": the tensor group's all-reduces";
  }
  const JobStatus job = *jobs_->Submit(spec);
  ASSERT_EQ(job.state(), shardline::v1::RUNNING) << job.message();
  ASSERT_EQ(delivered_.size(), 4u);
  ASSERT_EQ(job.stages_size(), 4);
  std::map<std::pair<int, int>, std::pair<std::string, Assignment>> at;  // (stage, rank) → worker, assignment
  for (const auto& [worker, a] : delivered_) at[{a.stage(), a.tensor_rank()}] = {worker, a};
  ASSERT_EQ(at.size(), 4u);
  for (const auto& [key, entry] : at) {
    const auto& [stage, rank] = key;
    const Assignment& a = entry.second;
    EXPECT_EQ(a.tensor_size(), 2);
    ASSERT_EQ(a.tensor_addresses_size(), 2);
    EXPECT_EQ(job.stages(stage * 2 + rank).tensor_rank(), rank);
    EXPECT_EQ(a.tensor_addresses(rank), job.stages(stage * 2 + rank).worker() + ":1");
    const Assignment& other_rank = at[std::make_pair(stage, 1 - rank)].second;
    EXPECT_EQ(a.unit_begin(), other_rank.unit_begin()) << "a stage's ranks share the cut";
    if (stage == 1) {
      const Assignment& upstream = at[std::make_pair(0, rank)].second;
      EXPECT_EQ(a.upstream_address(), upstream.tensor_addresses(rank)) << "the same rank of the previous stage";
    }
  }
  auto report = [&](int stage, int rank, double loss) {
    shardline::v1::ReportStepRequest r;
    r.set_job_id(job.job_id());
    r.set_plan_epoch(job.plan_epoch());
    r.set_stage(stage);
    r.set_tensor_rank(rank);
    r.set_worker_id(at[{stage, rank}].first);
    r.set_step(1);
    r.set_loss(loss);
    r.set_tokens(100);
    r.set_step_seconds(0.5);
    return jobs_->ReportStep(r);
  };
  ASSERT_TRUE(report(0, 0, 0).ok());
  ASSERT_TRUE(report(1, 1, 2.5).ok());
  ASSERT_TRUE(report(0, 1, 0).ok());
  EXPECT_EQ(jobs_->Get(job.job_id())->step(), 0) << "not before every position reported";
  auto wrong = [&] {
    shardline::v1::ReportStepRequest r;
    r.set_job_id(job.job_id());
    r.set_plan_epoch(job.plan_epoch());
    r.set_stage(1);
    r.set_tensor_rank(2);
    r.set_step(1);
    return jobs_->ReportStep(r).status().code();
  };
  EXPECT_EQ(wrong(), absl::StatusCode::kInvalidArgument) << "no tensor rank 2";
  ASSERT_TRUE(report(1, 0, 2.25).ok());
  const JobStatus after = *jobs_->Get(job.job_id());
  EXPECT_EQ(after.step(), 1);
  EXPECT_EQ(after.loss(), 2.25) << "tensor rank 0's loss";
}

// Which edges between a 2-stage job's tensor groups carry parts of tensors
// (scatter/gather), by stage: {gather_from_previous, scatter_to_next} of
// every rank, which must agree.
std::map<int, std::pair<bool, bool>> EdgeSplits(const std::vector<std::pair<std::string, Assignment>>& delivered) {
  std::map<int, std::pair<bool, bool>> out;
  for (const auto& [worker, a] : delivered) {
    const std::pair<bool, bool> mine{a.gather_from_previous(), a.scatter_to_next()};
    if (out.count(a.stage()) > 0) {
      EXPECT_EQ(out[a.stage()], mine) << "stage " << a.stage() << "'s ranks disagree";
    }
    out[a.stage()] = mine;
  }
  return out;
}

// "auto": a tensor group on each of two hosts, so the edge between them
// crosses a wire: parts of tensors, both ends told alike.
TEST_F(JobManagerTest, StageEdgesBetweenHostsScatterAndGather) {
  AddWorker("a1", 1e10, "hosta:1");
  AddWorker("a2", 1e10, "hosta:2");
  AddWorker("b1", 1e10, "hostb:1");
  AddWorker("b2", 1e10, "hostb:2");
  auto spec = Spec(2);
  spec.mutable_parallel()->set_tensor_parallel(2);
  ASSERT_EQ(jobs_->Submit(spec)->state(), shardline::v1::RUNNING);
  ASSERT_EQ(delivered_.size(), 4u);
  const auto splits = EdgeSplits(delivered_);
  EXPECT_EQ(splits.at(0), std::make_pair(false, true));
  EXPECT_EQ(splits.at(1), std::make_pair(true, false));
  for (const auto& [worker, a] : delivered_) {
    for (const std::string& peer : a.tensor_addresses()) {
      EXPECT_EQ(peer.substr(0, 5), a.tensor_addresses(0).substr(0, 5)) << "a tensor group on one host";
    }
  }
}

// "auto" on one host: whole tensors; "scatter_gather" asks for parts anyway.
TEST_F(JobManagerTest, StageEdgesWithinAHostCarryWholeTensorsUnlessTheSpecSaysOtherwise) {
  for (int i = 1; i <= 8; ++i) AddWorker(absl::StrCat("w", i), 1e10, absl::StrCat("host:", i));
  auto spec = Spec(2);
  spec.mutable_parallel()->set_tensor_parallel(2);
  ASSERT_EQ(jobs_->Submit(spec)->state(), shardline::v1::RUNNING);
  auto splits = EdgeSplits(delivered_);
  EXPECT_EQ(splits.at(0), std::make_pair(false, false));
  EXPECT_EQ(splits.at(1), std::make_pair(false, false));
  delivered_.clear();
  spec.mutable_parallel()->set_stage_link_layout("scatter_gather");
  ASSERT_EQ(jobs_->Submit(spec)->state(), shardline::v1::RUNNING);
  splits = EdgeSplits(delivered_);
  EXPECT_EQ(splits.at(0), std::make_pair(false, true));
  EXPECT_EQ(splits.at(1), std::make_pair(true, false));
}

}  // namespace
}  // namespace shardline::server
