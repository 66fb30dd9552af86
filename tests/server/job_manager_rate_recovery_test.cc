// Rates that recover: a worker whose machine was busy a while, and which a
// re-plan gave fewer units (or moved the job off), is planned on its
// recovered rate once it shows, and the job moves back at a checkpointed
// step: as the worker's own reports rise again, or, idle, once a fresh
// GEMM probe set its slower reports aside. A job whose rates only wobble
// keeps its plan.
#include <algorithm>
#include <set>

#include "common/cost_model.h"
#include "server/rate_watch.h"
#include "tests/server/job_manager_fixture.h"

namespace shardline::server {
namespace {

using shardline::v1::JobStatus;
using testing::JobManagerTest;

constexpr double kRate = 5e9;  // what a worker achieves on real layers: half its 1e10 probe

class RateRecoveryTest : public JobManagerTest {
 protected:
  shardline::v1::JobSpec SixLayers(int steps) {
    auto spec = JobManagerTest::SixLayers(steps);
    spec.mutable_train()->set_global_batch(8);
    spec.mutable_train()->set_micro_batches(8);  // a pipeline's pace is its slowest stage's
    return spec;
  }
  // Reports `step` of the running epoch, each stage's worker at
  // rate(worker id); its steps take 0.5 s times the slowest's slowdown.
  template <typename RateOf>
  void ReportStep(const shardline::v1::JobSpec& spec, int64_t step, RateOf rate_of) {
    const JobStatus job = *jobs_->Get(running_id_);
    double slowest = 1;
    for (int s = 0; s < job.stages_size(); ++s) slowest = std::max(slowest, kRate / rate_of(stage_workers_.at(s)));
    for (int s = 0; s < job.stages_size(); ++s) {
      shardline::v1::ReportStepRequest r = Report(job, s, step);
      r.set_busy_seconds(BusySeconds(spec, job.stages(s), rate_of(stage_workers_.at(s))));
      r.set_step_seconds(0.5 * slowest);
      ASSERT_TRUE(jobs_->ReportStep(r).ok()) << "step " << step;
    }
  }
  // The stop step delivered since `from`, 0 for none.
  int64_t StopDelivered(size_t from) {
    int64_t stop = 0;
    for (size_t i = from; i < delivered_.size(); ++i) stop = std::max(stop, delivered_[i].second.stop_after_step());
    return stop;
  }
  // Runs steps from `step` with `rate_of` until a stop is told (at most
  // `limit` steps), then to it, and commits it: the job moves. The step
  // after the stop; 0 if none was told.
  template <typename RateOf>
  int64_t RunUntilMoved(const shardline::v1::JobSpec& spec, int64_t step, int limit, RateOf rate_of) {
    const size_t before = delivered_.size();
    const JobStatus job = *jobs_->Get(running_id_);
    int64_t stop = 0;
    for (const int64_t last = step + limit; step < last && stop == 0; ++step) {
      ReportStep(spec, step, rate_of);
      stop = StopDelivered(before);
    }
    if (stop == 0) return 0;
    for (; step <= stop; ++step) ReportStep(spec, step, rate_of);
    for (int s = 0; s < job.stages_size(); ++s) EXPECT_TRUE(SendShard(job, s, job.stages_size(), stop).ok());
    const JobStatus moved = *jobs_->Get(running_id_);
    EXPECT_EQ(moved.state(), shardline::v1::RUNNING) << moved.message();
    EXPECT_GT(moved.plan_epoch(), job.plan_epoch());
    NoteAssignments();  // the new epoch's, delivered last
    return stop + 1;
  }
  int UnitsOf(const std::string& worker_name) {
    const JobStatus job = *jobs_->Get(running_id_);
    for (const auto& stage : job.stages()) {
      if (stage.worker() == worker_name) return stage.unit_end() - stage.unit_begin();
    }
    return 0;
  }
  std::set<std::string> Workers() {
    std::set<std::string> names;
    const JobStatus job = *jobs_->Get(running_id_);
    for (const auto& stage : job.stages()) names.insert(stage.worker());
    return names;
  }

  std::string running_id_;
};

TEST_F(RateRecoveryTest, AWorkerThatGetsFasterAgainTakesItsUnitsBack) {
  const std::string a = AddWorker("a"), b = AddWorker("b");
  const auto spec = SixLayers(400);
  running_id_ = jobs_->Submit(spec)->job_id();
  NoteAssignments();
  const int even = UnitsOf("b");
  // b's machine gets busy from step 11: four times slower; the job gives
  // it fewer units.
  auto busy = [&](const std::string& w) { return w == b ? kRate / 4 : kRate; };
  auto steady = [&](const std::string&) { return kRate; };
  int64_t step = 1;
  for (; step <= 10; ++step) ReportStep(spec, step, steady);
  step = RunUntilMoved(spec, step, 40, busy);
  ASSERT_GT(step, 0) << "no re-plan on the slowdown: " << jobs_->Get(running_id_)->message();
  const int few = UnitsOf("b");
  ASSERT_LT(few, even);
  // Still busy a while: the new layout stays (nothing rose).
  const size_t before = delivered_.size();
  for (const int64_t last = step + 20; step < last; ++step) ReportStep(spec, step, busy);
  EXPECT_EQ(StopDelivered(before), 0) << jobs_->Get(running_id_)->message();
  // Then its machine is free again: its reports rise, and the job moves
  // back onto an even cut.
  step = RunUntilMoved(spec, step, 60, steady);
  ASSERT_GT(step, 0) << "no re-plan once b got faster: " << jobs_->Get(running_id_)->message();
  const JobStatus back = *jobs_->Get(running_id_);
  EXPECT_NE(back.message().find("worker b got faster"), std::string::npos) << back.message();
  EXPECT_GT(UnitsOf("b"), few);
  EXPECT_EQ(UnitsOf("b"), even) << back.message();
  // Steady from here: no more moves.
  const size_t settled = delivered_.size();
  for (const int64_t last = step + 60; step < last; ++step) ReportStep(spec, step, steady);
  EXPECT_EQ(StopDelivered(settled), 0) << jobs_->Get(running_id_)->message();
}

// Still capped, b runs its fewer units in its quota's slack: its reports
// read faster on the lighter load from the move on. That is no recovery (a
// move back would be slow again), and the job stays.
TEST_F(RateRecoveryTest, AWorkerThatOnlyReadsFasterOnItsLighterLoadIsNotMovedBack) {
  AddWorker("a");
  const std::string b = AddWorker("b");
  const auto spec = SixLayers(400);
  running_id_ = jobs_->Submit(spec)->job_id();
  NoteAssignments();
  const int even = UnitsOf("b");
  auto rate_of = [&](const std::string& w) { return w != b ? kRate : UnitsOf("b") < even ? kRate : kRate / 4; };
  int64_t step = 1;
  for (; step <= 10; ++step) ReportStep(spec, step, [](const std::string&) { return kRate; });
  step = RunUntilMoved(spec, step, 40, rate_of);
  ASSERT_GT(step, 0) << jobs_->Get(running_id_)->message();
  ASSERT_LT(UnitsOf("b"), even);
  const size_t before = delivered_.size();
  for (const int64_t last = step + 60; step < last; ++step) ReportStep(spec, step, rate_of);
  EXPECT_EQ(StopDelivered(before), 0) << jobs_->Get(running_id_)->message();
}

TEST_F(RateRecoveryTest, AnIdleWorkerWhoseFreshProbeIsFastIsMovedBackOnto) {
  // c is a slower machine, the standby.
  const std::string a = AddWorker("a"), b = AddWorker("b"), c = AddWorker("c", 0.5e10);
  auto rate = [&](const std::string& w, double b_rate) {
    return w == c ? 0.5 * kRate : w == b ? b_rate : kRate;
  };
  // c ran a job before: its reports agree with its probe.
  for (int i = 0; i < 5; ++i) registry_->NoteAchievedRate(c, 0.5 * kRate);
  const auto spec = SixLayers(400);
  running_id_ = jobs_->Submit(spec)->job_id();
  NoteAssignments();
  ASSERT_EQ(Workers(), (std::set<std::string>{"a", "b"}));
  int64_t step = 1;
  for (; step <= 10; ++step) ReportStep(spec, step, [&](const std::string& w) { return rate(w, kRate); });
  // b's machine gets sixteen times slower: the job moves to c.
  step = RunUntilMoved(spec, step, 40, [&](const std::string& w) { return rate(w, kRate / 16); });
  ASSERT_GT(step, 0) << jobs_->Get(running_id_)->message();
  ASSERT_EQ(Workers(), (std::set<std::string>{"a", "c"})) << jobs_->Get(running_id_)->message();
  auto on_c = [&](const std::string& w) { return rate(w, kRate); };
  // b idles; the job goes on and stays (b's reports still say it is slow).
  size_t before = delivered_.size();
  for (const int64_t last = step + 20; step < last; ++step) ReportStep(spec, step, on_c);
  EXPECT_EQ(StopDelivered(before), 0) << jobs_->Get(running_id_)->message();
  now_ += kComputeProbeIdle;
  for (const std::string& w : {a, b, c}) ASSERT_TRUE(registry_->Heartbeat(w).ok());
  ASSERT_TRUE(registry_->AskComputeProbe(b));
  // Its fresh probe still reads it busy: nothing moves.
  EXPECT_FALSE(registry_->NoteComputeProbe(b, 0.2e10));
  for (const int64_t last = step + 20; step < last; ++step) ReportStep(spec, step, on_c);
  EXPECT_EQ(StopDelivered(before), 0) << jobs_->Get(running_id_)->message();
  // The next reads it as fast as at its registration: the job moves back.
  ASSERT_TRUE(registry_->NoteComputeProbe(b, 1e10));
  step = RunUntilMoved(spec, step, 20, on_c);
  ASSERT_GT(step, 0) << "no re-plan once b measured fast: " << jobs_->Get(running_id_)->message();
  EXPECT_NE(jobs_->Get(running_id_)->message().find("worker b got faster"), std::string::npos)
      << jobs_->Get(running_id_)->message();
  EXPECT_EQ(Workers(), (std::set<std::string>{"a", "b"}));
}

// A job whose steps slowed weighs a move with a rise it sees too, and says so.
TEST_F(RateRecoveryTest, ASlowedJobsAdviceNamesAWorkerThatGotFaster) {
  const std::string a = AddWorker("a"), b = AddWorker("b"), c = AddWorker("c", 0.5e10);
  for (int i = 0; i < 5; ++i) registry_->NoteAchievedRate(c, 0.5 * kRate);
  const auto spec = SixLayers(400);
  running_id_ = jobs_->Submit(spec)->job_id();
  NoteAssignments();
  int64_t step = 1;
  for (; step <= 10; ++step) ReportStep(spec, step, [](const std::string&) { return kRate; });
  step = RunUntilMoved(spec, step, 40, [&](const std::string& w) { return w == b ? kRate / 16 : kRate; });
  ASSERT_GT(step, 0);
  ASSERT_EQ(Workers(), (std::set<std::string>{"a", "c"})) << jobs_->Get(running_id_)->message();
  for (const int64_t last = step + 20; step < last; ++step) {
    ReportStep(spec, step, [&](const std::string& w) { return w == c ? 0.5 * kRate : kRate; });
  }
  // b measures fast while idle, as a's machine gets busy: a slowdown, and a rise.
  ASSERT_TRUE(registry_->NoteComputeProbe(b, 1e10));
  step = RunUntilMoved(spec, step, 40, [&](const std::string& w) { return w == c ? 0.5 * kRate : kRate / 3; });
  ASSERT_GT(step, 0) << jobs_->Get(running_id_)->message();
  const std::string message = jobs_->Get(running_id_)->message();
  EXPECT_NE(message.find("its steps slowed from"), std::string::npos) << message;
  EXPECT_NE(message.find(", and worker b got faster"), std::string::npos) << message;
}

TEST(RateWatchTest, ARateRiseCountsFromItsLowAfterTheEpochSettledAndAfterAWeighingOnlyWhenItRisesFurther) {
  auto worker = [](const std::string& name, double gflops) {
    WorkerRecord w;
    w.id = "id-" + name;
    w.name = name;
    w.planning_flops = gflops * 1e9;
    return w;
  };
  RateWatch watch;
  watch.Start(101);
  // The epoch's first steps: the average leaves the last layout's load.
  EXPECT_EQ(watch.Rose(105, {worker("a", 2), worker("b", 10)}), "");
  EXPECT_EQ(watch.Rose(110, {worker("a", 9), worker("b", 10)}), "") << "not settled before step 111";
  EXPECT_EQ(watch.Rose(115, {worker("a", 10), worker("b", 10)}), "") << "the first look";
  EXPECT_EQ(watch.Rose(120, {worker("a", 12.9), worker("b", 10)}), "") << "within kRise of its low";
  EXPECT_EQ(watch.Rose(125, {worker("a", 8), worker("b", 10)}), "") << "slower: a slowdown's business";
  EXPECT_EQ(watch.Rose(130, {worker("a", 10.3), worker("b", 10)}), "") << "within kRise of its low";
  EXPECT_EQ(watch.Rose(135, {worker("a", 10.5), worker("b", 10)}), "") << "not past its first look by kRecheck";
  EXPECT_EQ(watch.Rose(140, {worker("a", 11), worker("b", 10), worker("c", 5)}), "a got faster (8.0 → 11.0 GFLOP/s)")
      << "c is new: its first rate is its low";
  watch.Weighed({worker("a", 11), worker("b", 10), worker("c", 5)});
  EXPECT_EQ(watch.Rose(145, {worker("a", 11.5), worker("b", 10), worker("c", 5)}), "") << "weighed at 11 already";
  EXPECT_EQ(watch.Rose(150, {worker("a", 11.2), worker("b", 10), worker("c", 7)}), "c got faster (5.0 → 7.0 GFLOP/s)");
  EXPECT_EQ(watch.Rose(155, {worker("a", 11.6), worker("b", 10), worker("c", 5)}), "a got faster (8.0 → 11.6 GFLOP/s)");
  watch.Start(160);
  EXPECT_EQ(watch.Rose(170, {worker("a", 11.6), worker("b", 10), worker("c", 7)}), "") << "a new epoch's first look";
  EXPECT_EQ(watch.Rose(175, {worker("a", 11.6), worker("b", 10), worker("c", 7)}), "");
}

// Rates that only wobble (reports within kRateDisagreement of each other)
// never move a job.
TEST_F(RateRecoveryTest, RatesThatOnlyWobbleKeepThePlan) {
  AddWorker("a");
  AddWorker("b");
  const auto spec = SixLayers(400);
  running_id_ = jobs_->Submit(spec)->job_id();
  NoteAssignments();
  const size_t before = delivered_.size();
  for (int64_t step = 1; step <= 200; ++step) {
    const double wobble = step % 7 < 3 ? 0.85 : 1.1;
    ReportStep(spec, step, [&](const std::string& w) { return w == stage_workers_.at(1) ? kRate * wobble : kRate; });
  }
  EXPECT_EQ(StopDelivered(before), 0) << jobs_->Get(running_id_)->message();
  EXPECT_EQ(jobs_->Get(running_id_)->message(), "");
}

}  // namespace
}  // namespace shardline::server
