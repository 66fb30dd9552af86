// The rates the coordinator learns from the job reports (WorkerRegistry's
// achieved and optimizer rates) and the plans that use them.
#include "tests/server/job_manager_fixture.h"

namespace shardline::server {
namespace {

using shardline::v1::JobStatus;
using testing::JobManagerTest;

// The busy seconds a stage reports make its worker's achieved rate (its
// share of the plan's FLOPs over them), and its trace's optimizer span an
// optimizer rate, from the second step on; the next plans use them, and a
// worker without reports is planned at its GEMM rate scaled as the others'
// achieved rates are.
TEST_F(JobManagerTest, ReportedBusySecondsBecomeTheAchievedRatesTheNextPlansUse) {
  AddWorker("a");
  AddWorker("b");
  const shardline::v1::PlanResponse before = *jobs_->Plan(Spec(2, 6));
  const JobStatus job = *jobs_->Submit(Spec(2, 6));
  NoteAssignments();
  // Stage 0's worker computes 4× slower than its GEMM rate says, stage 1's 2×.
  const double slower[2] = {4, 2};
  for (int64_t step = 1; step <= 6; ++step) {
    for (int s = 0; s < 2; ++s) {
      shardline::v1::ReportStepRequest r = Report(job, s, step);
      r.set_busy_seconds(step == 1 ? 100.0 : slower[s] * before.stages(s).compute_seconds());
      shardline::v1::TraceEvent* optimizer = r.add_trace();
      optimizer->set_name("optimizer");
      optimizer->set_micro_batch(-1);
      optimizer->set_duration_us(10000);
      ASSERT_TRUE(jobs_->ReportStep(r).ok());
    }
  }
  for (int s = 0; s < 2; ++s) {
    const WorkerRecord w = *registry_->Get(stage_workers_.at(s));
    EXPECT_EQ(w.achieved_reports, 5) << "the first step is left out";
    EXPECT_NEAR(w.achieved_flops, 1e10 / slower[s], 1e10 * 1e-9) << w.name;
    EXPECT_EQ(w.optimizer_reports, 5);
    EXPECT_GT(w.optimizer_rate, 0);
  }
  ASSERT_TRUE(jobs_->Cancel(job.job_id()).ok());
  AddWorker("c");  // no reports: 1e10 × the median of 1/4 and 1/2
  for (const WorkerRecord& w : registry_->Idle()) {
    if (w.name == "c") {
      EXPECT_NEAR(w.planning_flops, 1e10 * 0.375, 1);
    }
  }
  const shardline::v1::PlanResponse after = *jobs_->Plan(Spec(2, 6));
  EXPECT_GT(after.predicted_step_seconds(), 1.5 * before.predicted_step_seconds());
  EXPECT_EQ(before.optimizer_seconds(), 0) << "no optimizer rate known before the reports";
  EXPECT_GT(after.optimizer_seconds(), 0.001);
  EXPECT_LT(after.optimizer_seconds(), 0.1);
}

}  // namespace
}  // namespace shardline::server
