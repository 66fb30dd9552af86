// Re-planning on a slowdown: a worker whose reports say it has become
// much slower (its busy seconds, and the job's steps with them) makes the
// coordinator stop the job's positions a little ahead, at a checkpoint,
// and restart from that committed step on a layout that gives it fewer
// units, at a new epoch: no step is lost. A slowdown no layout can help,
// and a job placed "in_order", keep their plan.
#include "server/step_pace.h"
#include "tests/server/job_manager_fixture.h"

namespace shardline::server {
namespace {

using shardline::v1::Assignment;
using shardline::v1::JobStatus;
using testing::JobManagerTest;

TEST(StepPaceTest, ALastingSlowdownShowsAndNoiseDoesNot) {
  StepPace pace;
  pace.Note(9.0);  // the epoch's first step: left out
  for (double s : {1.0, 1.1, 0.9, 1.0, 1.2}) pace.Note(s);
  EXPECT_DOUBLE_EQ(pace.baseline(), 1.0);
  for (double s : {1.0, 2.0, 1.1, 0.9, 2.0}) pace.Note(s);
  EXPECT_FALSE(pace.slowed()) << "two slow steps of five are noise";
  for (double s : {2.0, 2.0, 2.0}) pace.Note(s);
  EXPECT_TRUE(pace.slowed());
  EXPECT_DOUBLE_EQ(pace.recent(), 2.0);
  pace.Reset();
  EXPECT_FALSE(pace.slowed());
  EXPECT_EQ(pace.baseline(), 0);
}

class ReplanTest : public JobManagerTest {
 protected:
  shardline::v1::JobSpec SixLayers(int steps) {
    auto spec = Spec(2, steps);
    spec.mutable_model()->set_n_layers(6);
    spec.mutable_model()->set_d_model(128);  // compute, not the hops, sets the pace
    return spec;
  }
  // Reports `step` for both stages; from step `slow_from` on, the worker of
  // stage `slow_stage` computes `factor` times slower than the plan says
  // (a stage < 0: both) and every step takes that much longer.
  void ReportStep(const JobStatus& job, const shardline::v1::PlanResponse& plan, int64_t step, int slow_stage,
                  int64_t slow_from, double factor) {
    const bool slow = step >= slow_from;
    for (int s = 0; s < 2; ++s) {
      shardline::v1::ReportStepRequest r = Report(job, s, step);
      const bool this_slow = slow && (slow_stage < 0 || slow_stage == s);
      r.set_busy_seconds((this_slow ? factor : 1.0) * plan.stages(s).compute_seconds());
      r.set_step_seconds(slow ? 0.5 * factor : 0.5);
      ASSERT_TRUE(jobs_->ReportStep(r).ok()) << "step " << step;
    }
  }
  // The stop step of the update delivered since `from`, 0 for none.
  int64_t StopDelivered(size_t from) {
    int64_t stop = 0;
    for (size_t i = from; i < delivered_.size(); ++i) {
      if (delivered_[i].second.stop_after_step() > 0) stop = delivered_[i].second.stop_after_step();
    }
    return stop;
  }
  int Units(const JobStatus& job, int stage) {
    return job.stages(stage).unit_end() - job.stages(stage).unit_begin();
  }
};

TEST_F(ReplanTest, ASlowedWorkerGetsFewerUnitsFromACommittedStepWithNoStepLost) {
  AddWorker("a");
  AddWorker("b");
  const auto plan = *jobs_->Plan(SixLayers(60));
  const JobStatus job = *jobs_->Submit(SixLayers(60));
  NoteAssignments();
  const JobStatus started = *jobs_->Get(job.job_id());
  const int slow_units = Units(started, 1);
  const size_t before = delivered_.size();
  int64_t step = 1, stop = 0;
  for (; step <= 40 && stop == 0; ++step) {
    ReportStep(job, plan, step, /*slow_stage=*/1, /*slow_from=*/11, 4.0);
    stop = StopDelivered(before);
  }
  ASSERT_GT(stop, 0) << "no re-plan by step 40: " << jobs_->Get(job.job_id())->message();
  const int64_t completed = step - 1;
  EXPECT_EQ(stop, completed + 2) << "two steps ahead of the last completed one";
  int told = 0;
  for (size_t i = before; i < delivered_.size(); ++i) {
    const Assignment& a = delivered_[i].second;
    if (a.stop_after_step() == 0) continue;
    ++told;
    EXPECT_EQ(a.plan_epoch(), job.plan_epoch()) << "an update of the running epoch";
    EXPECT_FALSE(a.has_spec());
  }
  EXPECT_EQ(told, 2) << "every position";
  EXPECT_NE(jobs_->Get(job.job_id())->message().find("re-planning after step " + std::to_string(stop)),
            std::string::npos)
      << jobs_->Get(job.job_id())->message();

  // The positions run up to the stop and checkpoint it; the commit moves the job.
  for (; step <= stop; ++step) ReportStep(job, plan, step, 1, 11, 4.0);
  EXPECT_EQ(StopDelivered(before), stop) << "one stop";
  EXPECT_EQ(jobs_->Get(job.job_id())->plan_epoch(), job.plan_epoch()) << "nothing moves before the commit";
  const std::string slow_worker = stage_workers_.at(1);
  ASSERT_TRUE(SendShard(job, 0, 2, stop).ok());
  ASSERT_TRUE(SendShard(job, 1, 2, stop).ok());
  const JobStatus moved = *jobs_->Get(job.job_id());
  ASSERT_EQ(moved.state(), shardline::v1::RUNNING) << moved.message();
  EXPECT_GT(moved.plan_epoch(), job.plan_epoch());
  EXPECT_EQ(moved.committed_step(), stop);
  EXPECT_NE(moved.message().find("re-planned from step " + std::to_string(stop + 1)), std::string::npos)
      << moved.message();
  int fresh = 0;
  for (const auto& [worker, a] : delivered_) {
    if (a.plan_epoch() != moved.plan_epoch() || a.cancel()) continue;
    ++fresh;
    EXPECT_EQ(a.first_step(), stop + 1) << "no step lost, none run twice";
    if (worker == slow_worker) {
      EXPECT_LT(a.unit_end() - a.unit_begin(), slow_units) << "the slowed worker holds fewer units";
    }
  }
  EXPECT_EQ(fresh, 2);
}

TEST_F(ReplanTest, ASlowdownNoLayoutHelpsAndAnInOrderJobKeepTheirPlan) {
  AddWorker("a");
  AddWorker("b");
  for (const std::string placement : {"planned", "in_order"}) {
    SCOPED_TRACE(placement);
    auto spec = SixLayers(40);
    spec.mutable_parallel()->set_placement(placement);
    const auto plan = *jobs_->Plan(spec);
    const JobStatus job = *jobs_->Submit(spec);
    NoteAssignments();
    const size_t before = delivered_.size();
    // planned: both workers 3× slower (the machine, not one worker);
    // in_order: one worker 4× slower.
    for (int64_t step = 1; step <= 30; ++step) {
      ReportStep(job, plan, step, placement == "planned" ? -1 : 1, 11, placement == "planned" ? 3.0 : 4.0);
    }
    EXPECT_EQ(StopDelivered(before), 0) << jobs_->Get(job.job_id())->message();
    EXPECT_EQ(jobs_->Get(job.job_id())->plan_epoch(), job.plan_epoch());
    ASSERT_TRUE(jobs_->Cancel(job.job_id()).ok());
  }
}

}  // namespace
}  // namespace shardline::server
