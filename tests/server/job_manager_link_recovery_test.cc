// Links that come back: a worker a job moved out because its own link
// slowed is checked while the job runs (its peers busy: ClaimCheck), and
// once a check finds its link back the job weighs moving back onto it.
#include <map>
#include <set>
#include <string>

#include "server/link_table.h"
#include "tests/server/replan_fixture.h"

namespace shardline::server {
namespace {

using shardline::v1::JobStatus;

class LinkRecoveryTest : public ReplanTest {
 protected:
  // Workers a, b, c and a spare at a quarter of their rate, every link
  // probed at 100 MB/s; a three-stage job whose middle worker's own link
  // slows to 100 kB/s at step 11 (the frames into it and out of it slow):
  // it is suspected and the job moves it out for the spare.
  void SetUp() override {
    ReplanTest::SetUp();
    for (const char* n : {"a", "b", "c"}) names_[AddWorker(n)] = n;
    spare_ = AddWorker("spare", 0.25e10);
    for (const char* n : {"a", "b", "c", "spare"}) jobs_->links().Joined(n, n, {});  // a host each
    ProbeAll({"a", "b", "c", "spare"}, 1e8);
    spec_ = SixLayers(200);
    spec_.mutable_parallel()->set_pipeline_stages(3);
    spec_.mutable_train()->set_global_batch(8);
    spec_.mutable_train()->set_micro_batches(8);  // a pipeline's pace is its slowest stage's
    job_ = *jobs_->Submit(spec_);
    NoteAssignments();
    ASSERT_EQ(stage_workers_.size(), 3u);
    middle_ = names_.at(stage_workers_.at(1));
    const size_t before = delivered_.size();
    int64_t stop = 0;
    for (; step_ <= 40 && stop == 0; ++step_) {
      Report(job_, step_, step_ >= 11);
      stop = StopDelivered(before);
    }
    ASSERT_GT(stop, 0) << "no re-plan by step 40: " << jobs_->Get(job_.job_id())->message();
    ASSERT_TRUE(jobs_->links().Suspected(middle_).has_value());
    for (; step_ <= stop; ++step_) Report(job_, step_, true);
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(SendShard(job_, s, 3, stop).ok());
    moved_ = *jobs_->Get(job_.job_id());
    ASSERT_GT(moved_.plan_epoch(), job_.plan_epoch()) << moved_.message();
    ASSERT_EQ(Grid(moved_).find(middle_), std::string::npos) << Grid(moved_);
    NoteAssignments();
  }
  // Step `n` of `job`'s epoch: each stage at its plan's pace; `slow`: the
  // frames into and out of stage 1 at 100 kB/s.
  void Report(const JobStatus& job, int64_t n, bool slow) {
    auto pace = [](shardline::v1::ReportStepRequest& r, shardline::v1::WirePace::Peer peer, bool slowed) {
      shardline::v1::WirePace* p = r.add_wire_paces();
      p->set_peer(peer);
      p->set_seconds(0.05);
      p->set_bytes(slowed ? 5000 : 5000000);
    };
    for (int s = 0; s < 3; ++s) {
      shardline::v1::ReportStepRequest r = ReplanTest::Report(job, s, n);
      r.set_busy_seconds(BusySeconds(spec_, job.stages(s), 0.5 * (stage_workers_.at(s) == spare_ ? 0.25e10 : 1e10)));
      r.set_step_seconds(slow ? 5.0 : 0.5);
      if (s == 1) {
        pace(r, shardline::v1::WirePace::PREVIOUS_STAGE, slow);
        pace(r, shardline::v1::WirePace::NEXT_STAGE, slow);
      }
      if (s == 2) pace(r, shardline::v1::WirePace::PREVIOUS_STAGE, slow);
      ASSERT_TRUE(jobs_->ReportStep(r).ok()) << "step " << n;
    }
  }
  std::set<std::string> Busy() {
    std::set<std::string> busy;
    for (const WorkerRecord& w : registry_->List()) {
      if (!w.job_id.empty()) busy.insert(w.name);
    }
    return busy;
  }
  // Runs every check due now (each worker claims one in turn, as its
  // heartbeats do), each found at `bytes_per_second`; the links checked.
  std::set<std::string> CheckAll(double bytes_per_second) {
    std::set<std::string> checked;
    for (bool any = true; any;) {
      any = false;
      for (const char* w : {"a", "b", "c", "spare"}) {
        const std::optional<std::string> peer = jobs_->links().ClaimCheck(w, Busy());
        if (!peer.has_value()) continue;
        LinkRecord l;
        l.to = *peer;
        l.bytes_per_second = bytes_per_second;
        jobs_->links().Record(w, {l});
        checked.insert(absl::StrCat(w, " -> ", *peer));
        any = true;
      }
    }
    return checked;
  }
  static std::string Grid(const JobStatus& status) {
    std::string grid;
    for (const auto& stage : status.stages()) grid += stage.worker() + " ";
    return grid;
  }

  std::map<std::string, std::string> names_;  // id -> name
  shardline::v1::JobSpec spec_;
  JobStatus job_, moved_;
  std::string middle_, spare_;
  int64_t step_ = 1;
};

TEST_F(LinkRecoveryTest, AWorkerMovedOutForItsLinkIsCheckedAgainstBusyPeersAndMovedBackOnceItIsBack) {
  EXPECT_TRUE(CheckAll(1e5).empty()) << "nothing is due before kCheckEvery";
  now_ += LinkTable::kCheckEvery;
  // Still cut: the links the job saw slow are checked (the middle one's
  // peers are busy: a plain probe never runs) and found slow still.
  const std::set<std::string> first = CheckAll(1e5);
  EXPECT_FALSE(first.empty());
  for (const std::string& link : first) EXPECT_NE(link.find(middle_), std::string::npos) << link;
  EXPECT_TRUE(jobs_->links().Suspected(middle_).has_value());
  EXPECT_EQ(jobs_->links().recoveries(), 0u);
  now_ += LinkTable::kCheckEvery;
  EXPECT_TRUE(CheckAll(1e5).empty()) << "found slow once: the next check waits twice as long";
  now_ += LinkTable::kCheckEvery;
  EXPECT_EQ(CheckAll(1e5), first);

  // The link is back: the first check ends the suspicion, the others are
  // due at once.
  now_ += 4 * LinkTable::kCheckEvery;  // found slow twice
  EXPECT_EQ(CheckAll(1e8), first);
  EXPECT_FALSE(jobs_->links().Suspected(middle_).has_value());
  EXPECT_EQ(jobs_->links().recoveries(), first.size());
  for (const std::string& link : first) {
    const size_t arrow = link.find(" -> ");
    const std::optional<LinkRecord> l = jobs_->links().Get(link.substr(0, arrow), link.substr(arrow + 4));
    ASSERT_TRUE(l.has_value());
    EXPECT_EQ(l->fast_before, 0) << link << ": no longer in doubt";
    EXPECT_EQ(l->observed_bytes_per_second, 0) << link;
  }
  now_ += 10 * LinkTable::kCheckEveryMost;
  EXPECT_TRUE(CheckAll(1e8).empty()) << "nothing in doubt is checked again";

  // The job, on the slower spare, weighs moving back at its next report.
  const size_t before = delivered_.size();
  int64_t stop = 0;
  for (const int64_t last = step_ + 10; step_ <= last && stop == 0; ++step_) {
    Report(moved_, step_, false);
    stop = StopDelivered(before);
  }
  ASSERT_GT(stop, 0) << "no move back: " << jobs_->Get(job_.job_id())->message();
  EXPECT_NE(jobs_->Get(job_.job_id())->message().find("carries"), std::string::npos)
      << jobs_->Get(job_.job_id())->message();
  for (; step_ <= stop; ++step_) Report(moved_, step_, false);
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(SendShard(moved_, s, 3, stop).ok());
  const JobStatus back = *jobs_->Get(job_.job_id());
  ASSERT_GT(back.plan_epoch(), moved_.plan_epoch()) << back.message();
  EXPECT_NE(Grid(back).find(middle_), std::string::npos) << Grid(back);
  EXPECT_EQ(Grid(back).find("spare"), std::string::npos) << Grid(back);
}

// A link that stays cut is checked less and less often, never more than
// kCheckEveryMost apart, and a job on the spare is not moved.
TEST_F(LinkRecoveryTest, ALinkThatStaysSlowIsCheckedLessOftenAndTheJobStays) {
  absl::Duration waited;
  for (int round = 0; round < 8; ++round) {
    absl::Duration wait;
    std::set<std::string> checked;
    while ((checked = CheckAll(1e5)).empty()) {
      now_ += absl::Seconds(5);
      wait += absl::Seconds(5);
      ASSERT_LE(wait, LinkTable::kCheckEveryMost + absl::Seconds(5)) << "round " << round;
    }
    if (round > 0) {
      EXPECT_GE(wait, std::min(waited, LinkTable::kCheckEveryMost)) << "round " << round;
    }
    waited = wait;
  }
  EXPECT_GE(waited, LinkTable::kCheckEveryMost - absl::Seconds(5));
  EXPECT_TRUE(jobs_->links().Suspected(middle_).has_value());
  const size_t before = delivered_.size();
  for (const int64_t last = step_ + 10; step_ <= last; ++step_) Report(moved_, step_, false);
  EXPECT_EQ(StopDelivered(before), 0) << jobs_->Get(job_.job_id())->message();
}

}  // namespace
}  // namespace shardline::server
