// Re-planning when a link slows (the receiving ends' wire paces, the link
// table's observations): the job moves off a slowed link; a worker whose
// links to two peers slowed is blamed for its own link and moved out; a
// move on one slowed link first probes both ends' links to a third worker;
// a slowdown the cost model does not explain is said so.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "tests/server/replan_fixture.h"

namespace shardline::server {
namespace {

using shardline::v1::JobStatus;

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
  ProbeAll({"a", "b", "c"}, 1e8);
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

// A busy receiver reads frames that waited in its socket buffer as if
// they arrived together: a pace far above the link's probe at the epoch's
// start, then a third of it while the wire still carries its probe's rate.
// Judged against the probe, that is no slowdown; a tenth of the probe is.
TEST_F(ReplanTest, APaceAboveTheProbesIsNotTheWiresAndItsFallToTheProbesIsNoSlowdown) {
  AddWorker("a");
  AddWorker("b");
  ProbeAll({"a", "b"}, 1e8);
  const auto plan = *jobs_->Plan(SixLayers(60));
  const JobStatus job = *jobs_->Submit(SixLayers(60));
  NoteAssignments();
  auto report = [&](int64_t n, double bytes_per_second) {
    for (int s = 0; s < 2; ++s) {
      shardline::v1::ReportStepRequest r = Report(job, s, n);
      r.set_busy_seconds(plan.stages(s).compute_seconds());
      if (s == 1) {
        shardline::v1::WirePace* pace = r.add_wire_paces();
        pace->set_peer(shardline::v1::WirePace::PREVIOUS_STAGE);
        pace->set_seconds(0.05);
        pace->set_bytes(static_cast<int64_t>(bytes_per_second * 0.05));
      }
      ASSERT_TRUE(jobs_->ReportStep(r).ok()) << "step " << n;
    }
  };
  // Whichever way the hop goes (a -> b or b -> a).
  auto observed = [&] {
    return jobs_->links().Get("a", "b")->observed_bytes_per_second > 0 ||
           jobs_->links().Get("b", "a")->observed_bytes_per_second > 0;
  };
  int64_t step = 1;
  for (; step <= 10; ++step) report(step, 2.4e8);  // 2.4x its probe: read late, together
  for (; step <= 20; ++step) report(step, 6e7);    // a quarter of that, 0.6x the probe
  EXPECT_FALSE(observed()) << "not a slowdown of the wire";
  for (; step <= 30; ++step) report(step, 1e7);  // a tenth of the probe
  EXPECT_TRUE(observed()) << "a tenth of its probe is";
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
  ProbeAll({"a", "b", "c", "spare"}, 1e8);
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

// Workers a, b, c and a slower spare, every link probed at 100 MB/s; a
// two-stage job on two of them whose hop (first -> second) slows at step
// 11, up to the commit of the step it stops at to move: which end of the
// link is slow, nothing the job saw tells.
class DoubtedEndsTest : public ReplanTest {
 protected:
  void SetUp() override {
    ReplanTest::SetUp();
    for (const char* n : {"a", "b", "c"}) names_[AddWorker(n)] = n;
    AddWorker("spare", 0.6e10);
    ProbeAll({"a", "b", "c", "spare"}, 1e8);
    const auto plan = *jobs_->Plan(SixLayers(60));
    job_ = *jobs_->Submit(SixLayers(60));
    NoteAssignments();
    first_ = names_.at(stage_workers_.at(0));
    second_ = names_.at(stage_workers_.at(1));
    const size_t before = delivered_.size();
    int64_t step = 1, stop = 0;
    auto report = [&](int64_t n) {
      for (int s = 0; s < 2; ++s) {
        shardline::v1::ReportStepRequest r = Report(job_, s, n);
        r.set_busy_seconds(plan.stages(s).compute_seconds());
        r.set_step_seconds(n >= 11 ? 5.0 : 0.5);
        if (s == 1) {
          shardline::v1::WirePace* pace = r.add_wire_paces();
          pace->set_peer(shardline::v1::WirePace::PREVIOUS_STAGE);
          pace->set_seconds(0.05);
          pace->set_bytes(n >= 11 ? 5000 : 5000000);
        }
        ASSERT_TRUE(jobs_->ReportStep(r).ok()) << "step " << n;
      }
    };
    for (; step <= 40 && stop == 0; ++step) {
      report(step);
      stop = StopDelivered(before);
    }
    ASSERT_GT(stop, 0) << "no re-plan by step 40: " << jobs_->Get(job_.job_id())->message();
    ASSERT_FALSE(jobs_->links().Suspected(first_).has_value());
    ASSERT_FALSE(jobs_->links().Suspected(second_).has_value());
    for (; step <= stop; ++step) report(step);
    ASSERT_TRUE(SendShard(job_, 0, 2, stop).ok());
    ASSERT_TRUE(SendShard(job_, 1, 2, stop).ok());
  }
  // The third worker a probe of `end`'s link was queued with (from `end`,
  // or into it), "" for none.
  std::string ProbedWith(const std::string& end, bool from_end) {
    for (const char* y : {"a", "b", "c", "spare"}) {
      if (y == first_ || y == second_) continue;
      const std::vector<std::string> queued = jobs_->links().QueuedFrom(from_end ? end : y);
      if (std::find(queued.begin(), queued.end(), from_end ? y : end) != queued.end()) return y;
    }
    return "";
  }
  std::string Grid(const JobStatus& status) {
    std::string grid;
    for (const auto& stage : status.stages()) grid += stage.worker() + " ";
    return grid;
  }

  std::map<std::string, std::string> names_;  // id -> name
  JobStatus job_;
  std::string first_, second_;
};

// The move waits for a probe of each end's link to a third worker; the
// receiver's shows slow (its own link), so it is suspected and left out,
// the sender kept (the move goes at once, the sender's probe not waited
// for): no epoch is spent finding the slow end slow again elsewhere.
TEST_F(DoubtedEndsTest, TheMoveWaitsForProbesOfBothEndsAndLeavesTheSlowOneOut) {
  JobStatus waiting = *jobs_->Get(job_.job_id());
  EXPECT_EQ(waiting.plan_epoch(), job_.plan_epoch()) << "not moved before the probes: " << Grid(waiting);
  EXPECT_NE(waiting.message().find("probing"), std::string::npos) << waiting.message();
  const std::string out_of = ProbedWith(first_, true), into = ProbedWith(second_, false);
  ASSERT_FALSE(out_of.empty()) << "no probe of " << first_ << "'s link out";
  ASSERT_FALSE(into.empty()) << "no probe of " << second_ << "'s link in";
  jobs_->Schedule();
  EXPECT_EQ(jobs_->Get(job_.job_id())->plan_epoch(), job_.plan_epoch()) << "still waiting";

  LinkRecord slow;
  slow.to = second_;
  slow.bytes_per_second = 1e5;
  jobs_->links().Record(into, {slow});
  jobs_->Schedule();  // as a worker's ReportLinks does
  EXPECT_TRUE(jobs_->links().Suspected(second_).has_value()) << "the probe into it found it slow";
  // That explains the link: the probe of the other end is not waited for.
  const std::vector<std::string> still = jobs_->links().QueuedFrom(first_);
  EXPECT_NE(std::find(still.begin(), still.end(), out_of), still.end()) << "probed meanwhile?";
  EXPECT_FALSE(jobs_->links().Suspected(first_).has_value());
  const JobStatus moved = *jobs_->Get(job_.job_id());
  ASSERT_EQ(moved.state(), shardline::v1::RUNNING) << moved.message();
  ASSERT_GT(moved.plan_epoch(), job_.plan_epoch());
  EXPECT_EQ(Grid(moved).find(second_), std::string::npos) << "still on the slow end: " << Grid(moved);
}

// Probes that do not come (no idle worker claimed them) hold the move for
// kReplanProbeWait at most; then it is planned on what is known.
TEST_F(DoubtedEndsTest, ProbesThatDoNotComeHoldTheMoveNoLongerThanTheWait) {
  EXPECT_EQ(jobs_->Get(job_.job_id())->plan_epoch(), job_.plan_epoch());
  now_ += JobManager::kReplanProbeWait - absl::Seconds(1);
  jobs_->Schedule();
  EXPECT_EQ(jobs_->Get(job_.job_id())->plan_epoch(), job_.plan_epoch()) << "still within the wait";
  now_ += absl::Seconds(2);
  jobs_->Schedule();
  const JobStatus moved = *jobs_->Get(job_.job_id());
  ASSERT_EQ(moved.state(), shardline::v1::RUNNING) << moved.message();
  EXPECT_GT(moved.plan_epoch(), job_.plan_epoch());
}

}  // namespace
}  // namespace shardline::server
