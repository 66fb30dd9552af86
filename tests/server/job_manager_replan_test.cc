// Re-planning on a slowdown: a worker whose reports say it has become
// much slower (its busy seconds, and the job's steps with them) makes the
// coordinator stop the job's positions a little ahead, at a checkpoint,
// and restart from that committed step on a layout that gives it fewer
// units, at a new epoch: no step is lost. A slowdown no layout can help,
// and a job placed "in_order", keep their plan. A link that slows (the
// receiving end's wire paces: job_manager_link_slowdown_test.cc) moves it
// the same way. The same stop moves a job that lost a stage back onto its spec's
// stages once a worker is idle again, and a job off a drained worker.
#include <algorithm>
#include <set>

#include "server/link_pace.h"
#include "server/step_pace.h"
#include "tests/server/replan_fixture.h"

namespace shardline::server {
namespace {

using shardline::v1::Assignment;
using shardline::v1::JobStatus;

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

TEST(LinkPaceTest, ALastingSlowdownShowsAndNoiseOrTooFewTimedFramesDoNot) {
  LinkPace pace;
  for (double rate : {1.0e8, 1.1e8, 0.9e8, 1.0e8, 1.2e8}) pace.Note(static_cast<int64_t>(rate * 0.01), 0.01);
  EXPECT_DOUBLE_EQ(pace.baseline(), 1.0e8);
  pace.Note(1000, 0.0001);  // under kMinSeconds timed: not a step's measure
  for (double rate : {1.0e8, 0.3e8, 1.1e8, 0.9e8, 0.3e8}) pace.Note(static_cast<int64_t>(rate * 0.01), 0.01);
  EXPECT_FALSE(pace.slowed()) << "two slow steps of five are noise";
  for (int i = 0; i < 3; ++i) pace.Note(500000, 0.01);
  EXPECT_FALSE(pace.slowed()) << "half its rate: a receiver short of CPU does as much";
  for (int i = 0; i < 3; ++i) pace.Note(300000, 0.01);
  EXPECT_TRUE(pace.slowed());
  EXPECT_DOUBLE_EQ(pace.recent(), 0.3e8);
  for (int i = 0; i < 3; ++i) pace.Note(1000000, 0.01);
  EXPECT_FALSE(pace.slowed()) << "it carries its old rate again";

  LinkPace slow_from_the_start;
  for (int i = 0; i < 5; ++i) slow_from_the_start.Note(10000, 0.01);
  EXPECT_FALSE(slow_from_the_start.slowed()) << "as slow as when the epoch began";
  EXPECT_TRUE(slow_from_the_start.Below(1e8)) << "but far below its probe";
  EXPECT_FALSE(slow_from_the_start.Below(1.2e6));
  EXPECT_FALSE(slow_from_the_start.Below(0)) << "never probed";
}

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

// A job that lost a stage and re-planned onto fewer moves back onto its
// spec's stages once a worker is idle again: told to stop a little ahead,
// at a checkpoint, as for a slowdown; not while another job waits for
// workers, and not with growing back turned off.
TEST_F(ReplanTest, AJobThatLostAStageGrowsBackOntoItsSpecsStagesWhenAWorkerIsIdleAgain) {
  const JobStatus job = ThreeStagesCommittedAtStep1();
  // c dies; nobody replaces it within the grace: two stages.
  for (int i = 0; i < 10 && jobs_->Get(job.job_id())->stages_size() != 2; ++i) {
    now_ += absl::Milliseconds(20);
    ASSERT_TRUE(registry_->Heartbeat(stage_workers_[0]).ok());
    ASSERT_TRUE(registry_->Heartbeat(stage_workers_[1]).ok());
    jobs_->WorkersLost(registry_->ExpireLeases());
    jobs_->Tick();
  }
  const JobStatus shrunk = *jobs_->Get(job.job_id());
  ASSERT_EQ(shrunk.state(), shardline::v1::RUNNING) << shrunk.message();
  ASSERT_EQ(shrunk.stages_size(), 2) << shrunk.message();
  NoteAssignments();  // the new plan's, delivered last
  delivered_.clear();
  auto report_step = [&](const JobStatus& at, int stages, int64_t step) {
    for (int stage = 0; stage < stages; ++stage) ASSERT_TRUE(jobs_->ReportStep(Report(at, stage, step)).ok());
  };
  auto stop_told = [&] {
    int64_t stop = 0;
    for (const auto& [w, a] : delivered_) stop = std::max<int64_t>(stop, a.stop_after_step());
    return stop;
  };
  report_step(shrunk, 2, 2);
  // A worker comes back while another job waits for four: that job comes first.
  const JobStatus other = *jobs_->Submit(Spec(4, 100));
  AddWorker("d");
  EXPECT_EQ(jobs_->Get(other.job_id())->state(), shardline::v1::PENDING);
  report_step(shrunk, 2, 3);
  EXPECT_EQ(stop_told(), 0) << jobs_->Get(job.job_id())->message();
  ASSERT_TRUE(jobs_->Cancel(other.job_id()).ok());
  // Turned off, it stays on two stages.
  jobs_->SetGrowBack(false);
  report_step(shrunk, 2, 4);
  EXPECT_EQ(stop_told(), 0) << jobs_->Get(job.job_id())->message();
  jobs_->SetGrowBack(true);
  report_step(shrunk, 2, 5);
  const int64_t stop = stop_told();
  ASSERT_EQ(stop, 7) << "two steps ahead: " << jobs_->Get(job.job_id())->message();
  EXPECT_NE(jobs_->Get(job.job_id())->message().find(
                "re-planning after step 7: 1 worker is idle: back onto the spec's 3 pipeline stages from 2"),
            std::string::npos)
      << jobs_->Get(job.job_id())->message();
  report_step(shrunk, 2, 6);
  report_step(shrunk, 2, 7);
  EXPECT_EQ(jobs_->Get(job.job_id())->plan_epoch(), shrunk.plan_epoch()) << "nothing moves before the commit";
  ASSERT_TRUE(SendShard(shrunk, 0, 2, 7).ok());
  ASSERT_TRUE(SendShard(shrunk, 1, 2, 7).ok());
  const JobStatus grown = *jobs_->Get(job.job_id());
  ASSERT_EQ(grown.state(), shardline::v1::RUNNING) << grown.message();
  EXPECT_GT(grown.plan_epoch(), shrunk.plan_epoch());
  EXPECT_EQ(grown.stages_size(), 3);
  EXPECT_NE(grown.message().find("re-planned from step 8"), std::string::npos) << grown.message();
  std::set<std::string> names;
  for (const auto& stage : grown.stages()) names.insert(stage.worker());
  EXPECT_EQ(names, (std::set<std::string>{"a", "b", "d"}));
  int fresh = 0;
  for (const auto& [w, a] : delivered_) {
    if (a.plan_epoch() != grown.plan_epoch() || a.cancel()) continue;
    ++fresh;
    EXPECT_EQ(a.first_step(), 8) << "no step lost, none run twice";
    EXPECT_EQ(a.stages(), 3);
    EXPECT_EQ(a.spec().parallel().pipeline_stages(), 3);
  }
  EXPECT_EQ(fresh, 3);
}

// Drained without --at_once, a busy worker's job runs on a little, stops at a
// checkpointed step and moves off it from there: nothing is replayed. A
// job already stopping for a re-plan is left to it; one that ends before
// it could stop ends on the worker.
TEST_F(ReplanTest, ADrainedWorkersJobMovesOffItAtACheckpointedStepWithNothingReplayed) {
  AddWorker("a");
  const std::string b = AddWorker("b");
  const JobStatus job = *jobs_->Submit(Spec(2, 100));
  NoteAssignments();
  AddWorker("standby");
  for (int stage = 0; stage < 2; ++stage) ASSERT_TRUE(jobs_->ReportStep(Report(job, stage, 1)).ok());
  delivered_.clear();
  auto drained = jobs_->Drain("b", /*undo=*/false);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_TRUE(drained->drained);
  EXPECT_EQ(StateOf(*drained), "draining");
  JobStatus now = *jobs_->Get(job.job_id());
  ASSERT_EQ(now.state(), shardline::v1::RUNNING) << "it runs on to the stop";
  EXPECT_EQ(now.plan_epoch(), job.plan_epoch());
  EXPECT_NE(now.message().find("re-planning after step 3: worker b (stage 1) was drained by an operator"),
            std::string::npos)
      << now.message();
  int told = 0;
  for (const auto& [w, a] : delivered_) told += a.stop_after_step() == 3 && !a.cancel();
  EXPECT_EQ(told, 2) << "both positions stop after step 3";
  EXPECT_EQ(jobs_->Drain("b", false).status().code(), absl::StatusCode::kOk) << "again: nothing more";
  for (int64_t step = 2; step <= 3; ++step) {
    for (int stage = 0; stage < 2; ++stage) ASSERT_TRUE(jobs_->ReportStep(Report(job, stage, step)).ok());
  }
  ASSERT_TRUE(SendShard(job, 0, 2, 3).ok());
  ASSERT_TRUE(SendShard(job, 1, 2, 3).ok());
  now = *jobs_->Get(job.job_id());
  ASSERT_EQ(now.state(), shardline::v1::RUNNING) << now.message();
  EXPECT_GT(now.plan_epoch(), job.plan_epoch());
  EXPECT_EQ(now.committed_step(), 3);
  for (const auto& stage : now.stages()) EXPECT_NE(stage.worker(), "b");
  for (const auto& [w, a] : delivered_) {
    if (a.plan_epoch() != now.plan_epoch() || a.cancel()) continue;
    EXPECT_EQ(a.first_step(), 4) << "nothing replayed";
  }
  for (const auto& w : registry_->Idle()) EXPECT_NE(w.id, b);
  EXPECT_EQ(StateOf(*registry_->Get(b)), "drained");

  // Two steps from its end: it ends on the worker.
  ASSERT_TRUE(jobs_->Drain(b, /*undo=*/true).ok());
  ASSERT_TRUE(jobs_->Cancel(job.job_id()).ok());
  const JobStatus short_job = *jobs_->Submit(Spec(2, 3));
  ASSERT_EQ(short_job.state(), shardline::v1::RUNNING);
  NoteAssignments();
  for (int stage = 0; stage < 2; ++stage) ASSERT_TRUE(jobs_->ReportStep(Report(short_job, stage, 1)).ok());
  delivered_.clear();
  for (const auto& stage : short_job.stages()) ASSERT_TRUE(jobs_->Drain(stage.worker(), false).ok());
  for (const auto& [w, a] : delivered_) EXPECT_EQ(a.stop_after_step(), 0);
  EXPECT_EQ(jobs_->Get(short_job.job_id())->plan_epoch(), short_job.plan_epoch());
}

}  // namespace
}  // namespace shardline::server
