// Re-planning on a slowdown: a worker whose reports say it has become
// much slower (its busy seconds, and the job's steps with them) makes the
// coordinator stop the job's positions a little ahead, at a checkpoint,
// and restart from that committed step on a layout that gives it fewer
// units, at a new epoch: no step is lost. A slowdown no layout can help,
// and a job placed "in_order", keep their plan. A link that slows (the
// receiving end's wire paces) goes into the link table, and the job moves
// off it. The same stop moves a job that lost a stage back onto its spec's
// stages once a worker is idle again, and a job off a drained worker.
#include <algorithm>
#include <set>

#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "server/link_pace.h"
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

class ReplanTest : public JobManagerTest {
 protected:
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

// The warnings logged while it lives.
class Warnings final : public google::LogSink {
 public:
  Warnings() { google::AddLogSink(this); }
  ~Warnings() override { google::RemoveLogSink(this); }
  void send(google::LogSeverity severity, const char*, const char*, int, const google::LogMessageTime&,
            const char* message, size_t length) override {
    if (severity != google::GLOG_WARNING) return;
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(message, length);
  }
  bool Any(const std::string& text) {
    absl::MutexLock lock(&mu_);
    return std::any_of(lines_.begin(), lines_.end(),
                       [&](const std::string& l) { return l.find(text) != std::string::npos; });
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

// Steps ten times slower with compute as planned and no stream showing a
// slower wire: nothing the cost model holds explains it, and the check
// says so rather than only that no layout is faster.
TEST_F(ReplanTest, ASlowdownTheModelDoesNotExplainIsSaidSo) {
  AddWorker("a");
  AddWorker("b");
  AddWorker("c");
  const auto plan = *jobs_->Plan(SixLayers(60));
  const JobStatus job = *jobs_->Submit(SixLayers(60));
  NoteAssignments();
  const size_t before = delivered_.size();
  Warnings warnings;
  for (int64_t step = 1; step <= 30; ++step) {
    for (int s = 0; s < 2; ++s) {
      shardline::v1::ReportStepRequest r = Report(job, s, step);
      r.set_busy_seconds(plan.stages(s).compute_seconds());
      r.set_step_seconds(step >= 11 ? 5.0 : 0.5);
      ASSERT_TRUE(jobs_->ReportStep(r).ok()) << "step " << step;
    }
  }
  EXPECT_EQ(StopDelivered(before), 0) << "nothing to move for";
  EXPECT_TRUE(warnings.Any("what slows them the coordinator does not see")) << jobs_->Get(job.job_id())->message();
}

TEST_F(ReplanTest, ALinkThatSlowsIsObservedAndTheJobMovesOffIt) {
  const std::string a = AddWorker("a"), b = AddWorker("b");
  AddWorker("c");  // idle, its links as fast as the others
  const auto plan = *jobs_->Plan(SixLayers(60));
  const JobStatus job = *jobs_->Submit(SixLayers(60));
  NoteAssignments();
  const std::string first = stage_workers_.at(0), second = stage_workers_.at(1);
  auto name = [&](const std::string& id) { return id == a ? "a" : id == b ? "b" : "c"; };
  const size_t before = delivered_.size();
  int64_t step = 1, stop = 0;
  // Stage 1's frames from stage 0 arrive at 100 MB/s, from step 11 at
  // 100 kB/s, and every step takes ten times as long; compute is as planned.
  auto report_in = [&](const JobStatus& epoch, int64_t n, bool slow) {
    for (int s = 0; s < 2; ++s) {
      shardline::v1::ReportStepRequest r = Report(epoch, s, n);
      r.set_busy_seconds(plan.stages(s).compute_seconds());
      r.set_step_seconds(slow ? 5.0 : 0.5);
      if (s == 1) {
        shardline::v1::WirePace* pace = r.add_wire_paces();
        pace->set_peer(shardline::v1::WirePace::PREVIOUS_STAGE);
        pace->set_seconds(0.05);
        pace->set_bytes(slow ? 5000 : 5000000);
      }
      ASSERT_TRUE(jobs_->ReportStep(r).ok()) << "step " << n;
    }
  };
  auto report = [&](int64_t n) { report_in(job, n, n >= 11); };
  for (; step <= 40 && stop == 0; ++step) {
    report(step);
    stop = StopDelivered(before);
  }
  const std::optional<LinkRecord> link = jobs_->links().Get(name(first), name(second));
  ASSERT_TRUE(link.has_value()) << "the slowdown is in the link table";
  EXPECT_DOUBLE_EQ(link->observed_bytes_per_second, 1e5);
  EXPECT_EQ(link->observed_in, job.job_id());
  EXPECT_FALSE(jobs_->links().Get(name(second), name(first)).has_value()) << "only the direction that slowed";
  EXPECT_GT(jobs_->links().pending(), 0) << "a probe of it is queued";
  // Neither end receives from another peer: nothing tells whose link it is.
  EXPECT_FALSE(jobs_->links().Suspected(name(first)).has_value());
  EXPECT_FALSE(jobs_->links().Suspected(name(second)).has_value());
  ASSERT_GT(stop, 0) << "no re-plan by step 40: " << jobs_->Get(job.job_id())->message();
  for (; step <= stop; ++step) report(step);
  ASSERT_TRUE(SendShard(job, 0, 2, stop).ok());
  ASSERT_TRUE(SendShard(job, 1, 2, stop).ok());
  const JobStatus moved = *jobs_->Get(job.job_id());
  ASSERT_EQ(moved.state(), shardline::v1::RUNNING) << moved.message();
  ASSERT_GT(moved.plan_epoch(), job.plan_epoch());
  EXPECT_FALSE(moved.stages(0).worker() == name(first) && moved.stages(1).worker() == name(second))
      << "the hop no longer crosses the slowed link: " << moved.stages(0).worker() << " -> "
      << moved.stages(1).worker();

  // The one of the two the move kept is slow with its new neighbour too:
  // that and the earlier slowdown blame its own link, not the neighbour's.
  const std::string kept = name(first) == moved.stages(0).worker() || name(first) == moved.stages(1).worker()
                               ? name(first)
                               : name(second);
  for (const auto& [worker, a] : delivered_) {
    if (a.plan_epoch() == moved.plan_epoch() && !a.cancel()) stage_workers_[a.stage()] = worker;
  }
  // Its first five steps fast (the links were never probed), then slow.
  for (int64_t n = stop + 1; n <= stop + 12; ++n) report_in(moved, n, n > stop + 5);
  EXPECT_TRUE(jobs_->links().Suspected(kept).has_value()) << kept;
  EXPECT_FALSE(jobs_->links().Suspected("c").has_value());

  // A probe of the link replaces what the job observed.
  LinkRecord probed;
  probed.to = name(second);
  probed.bytes_per_second = 2e8;
  jobs_->links().Record(name(first), {probed});
  EXPECT_EQ(jobs_->links().Get(name(first), name(second))->observed_bytes_per_second, 0);
}

TEST_F(ReplanTest, AJobThatBeganOnALinkSlowerThanItsProbeMovesOffIt) {
  const std::string a = AddWorker("a"), b = AddWorker("b");
  AddWorker("c");
  for (const char* from : {"a", "b", "c"}) {  // every link probed at 100 MB/s
    std::vector<LinkRecord> probes;
    for (const char* to : {"a", "b", "c"}) {
      if (std::string(from) == to) continue;
      LinkRecord l;
      l.to = to;
      l.bytes_per_second = 1e8;
      probes.push_back(l);
    }
    jobs_->links().Record(from, probes);
  }
  const auto plan = *jobs_->Plan(SixLayers(60));
  const JobStatus job = *jobs_->Submit(SixLayers(60));
  NoteAssignments();
  const size_t before = delivered_.size();
  int64_t stop = 0;
  // Steady steps, but stage 1's frames arrive at 100 kB/s from the start.
  for (int64_t step = 1; step <= 30 && stop == 0; ++step) {
    for (int s = 0; s < 2; ++s) {
      shardline::v1::ReportStepRequest r = Report(job, s, step);
      r.set_busy_seconds(plan.stages(s).compute_seconds());
      r.set_step_seconds(5.0);
      if (s == 1) {
        shardline::v1::WirePace* pace = r.add_wire_paces();
        pace->set_peer(shardline::v1::WirePace::PREVIOUS_STAGE);
        pace->set_seconds(0.05);
        pace->set_bytes(5000);
      }
      ASSERT_TRUE(jobs_->ReportStep(r).ok());
    }
    stop = StopDelivered(before);
  }
  EXPECT_GT(stop, 0) << "no re-plan: " << jobs_->Get(job.job_id())->message();
  EXPECT_NE(jobs_->Get(job.job_id())->message().find("a link it uses slowed"), std::string::npos)
      << jobs_->Get(job.job_id())->message();
}

// A worker's own link slows (both ways, to every peer): the frames into it
// from both its neighbours slow, and of those it sends one neighbour's
// slow and the other's not (a sender's token bucket lets its frames out
// fast a while). With two peers slow, its own link is blamed, not its
// neighbours', and the job moves it out for a slower spare.
TEST_F(ReplanTest, AWorkerWhoseOwnLinkSlowedIsBlamedAndMovedOut) {
  const std::string a = AddWorker("a"), b = AddWorker("b"), c = AddWorker("c");
  AddWorker("spare", 0.6e10);
  std::map<std::string, std::string> names = {{a, "a"}, {b, "b"}, {c, "c"}};
  for (const auto& [from_id, from] : names) {  // every link probed at 100 MB/s
    std::vector<LinkRecord> probes;
    for (const char* to : {"a", "b", "c", "spare"}) {
      if (from == to) continue;
      LinkRecord l;
      l.to = to;
      l.bytes_per_second = 1e8;
      probes.push_back(l);
    }
    jobs_->links().Record(from, probes);
  }
  std::vector<LinkRecord> probes;
  for (const char* to : {"a", "b", "c"}) {
    LinkRecord l;
    l.to = to;
    l.bytes_per_second = 1e8;
    probes.push_back(l);
  }
  jobs_->links().Record("spare", probes);
  auto spec = SixLayers(80);
  spec.mutable_parallel()->set_pipeline_stages(3);
  const auto plan = *jobs_->Plan(spec);
  const JobStatus job = *jobs_->Submit(spec);
  NoteAssignments();
  ASSERT_EQ(stage_workers_.size(), 3u) << "the spare is slower: idle";
  const std::string middle = names.at(stage_workers_.at(1));
  const size_t before = delivered_.size();
  auto pace = [](shardline::v1::ReportStepRequest& r, shardline::v1::WirePace::Peer peer, bool slow) {
    shardline::v1::WirePace* p = r.add_wire_paces();
    p->set_peer(peer);
    p->set_seconds(0.05);
    p->set_bytes(slow ? 5000 : 5000000);
  };
  auto report = [&](int64_t n) {
    const bool slow = n >= 11;
    for (int s = 0; s < 3; ++s) {
      shardline::v1::ReportStepRequest r = Report(job, s, n);
      r.set_busy_seconds(plan.stages(s).compute_seconds());
      r.set_step_seconds(slow ? 5.0 : 0.5);
      if (s == 0) pace(r, shardline::v1::WirePace::NEXT_STAGE, false);  // out of the middle, still fast
      if (s == 1) {
        pace(r, shardline::v1::WirePace::PREVIOUS_STAGE, slow);
        pace(r, shardline::v1::WirePace::NEXT_STAGE, slow);
      }
      if (s == 2) pace(r, shardline::v1::WirePace::PREVIOUS_STAGE, slow);
      ASSERT_TRUE(jobs_->ReportStep(r).ok()) << "step " << n;
    }
  };
  int64_t step = 1, stop = 0;
  for (; step <= 40 && stop == 0; ++step) {
    report(step);
    stop = StopDelivered(before);
  }
  ASSERT_GT(stop, 0) << "no re-plan by step 40: " << jobs_->Get(job.job_id())->message();
  const std::optional<LinkSuspicion> suspected = jobs_->links().Suspected(middle);
  EXPECT_TRUE(suspected.has_value()) << "the middle worker's own link";
  if (suspected.has_value()) {
    EXPECT_DOUBLE_EQ(suspected->bytes_per_second, 1e5);
    EXPECT_EQ(suspected->job_id, job.job_id());
  }
  for (const char* other : {"a", "b", "c", "spare"}) {
    if (other == middle) continue;
    EXPECT_FALSE(jobs_->links().Suspected(other).has_value()) << other;
  }
  for (; step <= stop; ++step) report(step);
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(SendShard(job, s, 3, stop).ok());
  const JobStatus moved = *jobs_->Get(job.job_id());
  ASSERT_EQ(moved.state(), shardline::v1::RUNNING) << moved.message();
  ASSERT_GT(moved.plan_epoch(), job.plan_epoch());
  std::string grid;
  for (const auto& stage : moved.stages()) grid += stage.worker() + " ";
  EXPECT_EQ(grid.find(middle), std::string::npos) << "still on the slowed worker: " << grid;
  EXPECT_NE(grid.find("spare"), std::string::npos) << grid;
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
