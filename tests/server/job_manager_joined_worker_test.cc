// A worker that joins while a job runs: once its links with the job's
// workers are measured, the job weighs a move onto it as for a slowdown,
// and takes it where it is clearly faster. Another job's workers and links
// are not weighed until that job lets them go.
#include <map>
#include <set>
#include <string>

#include "server/link_table.h"
#include "tests/server/replan_fixture.h"

namespace shardline::server {
namespace {

using shardline::v1::JobStatus;

class JoinedWorkerTest : public ReplanTest {
 protected:
  // Workers a and b (1e10 FLOP/s probes, a host each, their links measured)
  // running a two-stage job of eight micro-batches.
  void SetUp() override {
    ReplanTest::SetUp();
    for (const char* n : {"a", "b"}) {
      probes_[AddWorker(n)] = 1e10;
      jobs_->links().Joined(n, n, {});
    }
    ProbeAll({"a", "b"}, 1e8);
    spec_ = SixLayers(200);
    spec_.mutable_train()->set_global_batch(8);
    spec_.mutable_train()->set_micro_batches(8);  // a pipeline's pace is its slowest stage's
    job_ = *jobs_->Submit(spec_);
    NoteAssignments();
    for (; step_ <= 12; ++step_) Report(job_, step_);
  }
  // A worker registering as the coordinator's Register does: its links to
  // the live workers queued.
  std::string Join(const std::string& name, double flops) {
    const std::string id = AddWorker(name, flops);
    probes_[id] = flops;
    jobs_->links().Joined(name, name, {"a", "b", name});
    return id;
  }
  // Step `n` of `job`'s epoch, each stage's worker achieving half its probe.
  void Report(const JobStatus& job, int64_t n) {
    for (int s = 0; s < job.stages_size(); ++s) {
      shardline::v1::ReportStepRequest r = ReplanTest::Report(job, s, n);
      r.set_busy_seconds(BusySeconds(spec_, job.stages(s), 0.5 * probes_.at(stage_workers_.at(s))));
      ASSERT_TRUE(jobs_->ReportStep(r).ok()) << "step " << n;
    }
  }
  // Steps until a stop is told (`limit` at most): the stop, 0 for none.
  int64_t RunUntilStop(int limit) {
    const size_t before = delivered_.size();
    int64_t stop = 0;
    for (const int64_t last = step_ + limit; step_ < last && stop == 0; ++step_) {
      Report(job_, step_);
      stop = StopDelivered(before);
    }
    return stop;
  }
  static std::string Grid(const JobStatus& status) {
    std::string grid;
    for (const auto& stage : status.stages()) grid += stage.worker() + " ";
    return grid;
  }

  // Its links with a and b checked (as ClaimCheck hands them out beside
  // the job) at 100 MB/s.
  void CheckLinks(const std::string& name) {
    for (const std::string& from : {name, std::string("a"), std::string("b"), name}) {
      const std::optional<std::string> peer = jobs_->links().ClaimCheck(from, {"a", "b"});
      if (!peer.has_value()) continue;
      LinkRecord l;
      l.to = *peer;
      l.bytes_per_second = 1e8;
      jobs_->links().Record(from, {l});
    }
  }
  // `from` -> `to` found slow (over kProbedSlowdown below its figure), then
  // back at 100 MB/s.
  void FoundBack(const std::string& from, const std::string& to) {
    LinkRecord l;
    l.to = to;
    l.bytes_per_second = 1e6;
    jobs_->links().Record(from, {l});
    ASSERT_GT(jobs_->links().Get(from, to)->fast_before, 0) << from << " -> " << to << " is in doubt";
    l.bytes_per_second = 1e8;
    jobs_->links().Record(from, {l});
  }
  std::string Weighed() { return jobs_->Get(job_.job_id())->weighed(); }

  std::map<std::string, double> probes_;  // id -> GEMM probe
  shardline::v1::JobSpec spec_;
  JobStatus job_;
  int64_t step_ = 1;
};

TEST_F(JoinedWorkerTest, AFasterWorkerThatJoinsIsTakenOnceItsLinksAreMeasured) {
  Join("c", 4e10);
  EXPECT_EQ(RunUntilStop(20), 0) << "its links are not measured: planned on assumptions, not weighed: "
                                 << jobs_->Get(job_.job_id())->message();
  // Its links to the busy a and b are checked (a plain probe waits for
  // both ends idle); both directions, each end's turn.
  const std::set<std::string> busy = {"a", "b"};
  std::set<std::string> checked;
  for (const char* from : {"c", "a", "b", "c"}) {
    const std::optional<std::string> peer = jobs_->links().ClaimCheck(from, busy);
    if (!peer.has_value()) continue;
    checked.insert(absl::StrCat(from, " -> ", *peer));
    LinkRecord l;
    l.to = *peer;
    l.bytes_per_second = 1e8;
    jobs_->links().Record(from, {l});
  }
  EXPECT_EQ(checked, (std::set<std::string>{"a -> c", "b -> c", "c -> a", "c -> b"}));
  EXPECT_FALSE(jobs_->links().ClaimCheck("c", busy).has_value()) << "nothing more to check";

  const int64_t stop = RunUntilStop(10);
  ASSERT_GT(stop, 0) << "not moved onto c: " << jobs_->Get(job_.job_id())->message();
  EXPECT_NE(jobs_->Get(job_.job_id())->message().find("worker c (20.0 GFLOP/s) is idle, its links measured"),
            std::string::npos)
      << jobs_->Get(job_.job_id())->message();
  for (; step_ <= stop; ++step_) Report(job_, step_);
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(SendShard(job_, s, 2, stop).ok());
  const JobStatus moved = *jobs_->Get(job_.job_id());
  ASSERT_GT(moved.plan_epoch(), job_.plan_epoch()) << moved.message();
  EXPECT_NE(Grid(moved).find("c"), std::string::npos) << Grid(moved);
}

// One no faster than the job's own is weighed and not taken; weighed
// again once another job that took it lets it go (its links may have come
// back meanwhile), not before.
TEST_F(JoinedWorkerTest, ANoFasterWorkerThatJoinsIsLeftIdle) {
  EXPECT_EQ(Weighed(), "") << "nothing weighed yet";
  Join("c", 1e10);
  CheckLinks("c");
  EXPECT_EQ(RunUntilStop(30), 0) << jobs_->Get(job_.job_id())->message();
  const std::string first = Weighed();
  EXPECT_NE(first.find("worker c (5.0 GFLOP/s) is idle, its links measured"), std::string::npos) << first;
  EXPECT_NE(first.find(": no layout is clearly faster"), std::string::npos) << first;
  EXPECT_EQ(RunUntilStop(10), 0);
  EXPECT_EQ(Weighed(), first) << "weighed once while it stays idle";

  shardline::v1::JobSpec one = spec_;
  one.mutable_parallel()->set_pipeline_stages(1);
  const JobStatus other = *jobs_->Submit(one);
  ASSERT_EQ(jobs_->Get(other.job_id())->state(), shardline::v1::RUNNING);
  ASSERT_EQ(jobs_->Get(other.job_id())->stages(0).worker(), "c");
  EXPECT_EQ(RunUntilStop(10), 0);
  EXPECT_EQ(Weighed(), first) << "c is the other job's";
  ASSERT_TRUE(jobs_->Cancel(other.job_id()).ok());
  EXPECT_EQ(RunUntilStop(10), 0);
  EXPECT_NE(Weighed(), first) << "let go: weighed again";
  EXPECT_NE(Weighed().find("worker c (5.0 GFLOP/s) is idle"), std::string::npos) << Weighed();
}

// A link found back between another job's workers is not the job's to
// weigh (it could not plan on it); one between its own workers is.
TEST_F(JoinedWorkerTest, ALinkFoundBackIsWeighedOnlyByAJobThatCouldUseIt) {
  Join("c", 4e10);
  Join("d", 4e10);
  ProbeAll({"c", "d"}, 1e8);
  const JobStatus other = *jobs_->Submit(spec_);
  ASSERT_EQ(jobs_->Get(other.job_id())->state(), shardline::v1::RUNNING);
  EXPECT_EQ(RunUntilStop(10), 0);
  ASSERT_EQ(Weighed(), "") << "c and d were never idle to it";

  FoundBack("c", "d");
  ASSERT_EQ(jobs_->links().recoveries(), 1u);
  EXPECT_EQ(RunUntilStop(10), 0);
  EXPECT_EQ(Weighed(), "") << "c -> d is the other job's link";

  FoundBack("a", "b");
  ASSERT_EQ(jobs_->links().recoveries(), 2u);
  EXPECT_EQ(RunUntilStop(10), 0) << "a and b are all it has";
  EXPECT_NE(Weighed().find("link a -> b carries 800 Mbit/s again (8 Mbit/s while slow, 800 before)"),
            std::string::npos)
      << Weighed();
  EXPECT_EQ(Weighed().find("c -> d"), std::string::npos) << Weighed();
}

}  // namespace
}  // namespace shardline::server
