// The job manager across coordinator restarts (CoordinatorStore under it):
// earlier jobs served, ids never reused, running jobs resumed.
#include <filesystem>
#include <string>
#include <vector>

#include "tests/server/job_manager_fixture.h"

namespace shardline::server {
namespace {

using shardline::v1::JobStatus;
using testing::JobManagerTest;

// Runs `job` (2 stages) through steps [from, to], each stage checkpointing at `to`.
class JobManagerRestartTest : public JobManagerTest {
 protected:
  void RunSteps(const JobStatus& job, int64_t from, int64_t to) {
    NoteAssignments();
    for (int64_t step = from; step <= to; ++step) {
      for (int stage = 0; stage < 2; ++stage) ASSERT_TRUE(jobs_->ReportStep(Report(job, stage, step)).ok());
    }
    for (int stage = 0; stage < 2; ++stage) ASSERT_TRUE(SendShard(job, stage, 2, to).ok());
  }
  // Submits a 2-stage, 2-step job and runs it to SUCCEEDED; its status as it started.
  JobStatus RunToSuccess() {
    absl::StatusOr<JobStatus> submitted = jobs_->Submit(Spec(2, 2));
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    if (!submitted.ok()) return {};
    const JobStatus started = *jobs_->Get(submitted->job_id());
    RunSteps(started, 1, 2);
    EXPECT_EQ(jobs_->Get(started.job_id())->state(), shardline::v1::SUCCEEDED);
    return started;
  }
};

TEST_F(JobManagerRestartTest, ARestartedCoordinatorServesEarlierJobsAndNeverReusesAnId) {
  const std::string old_worker = AddWorker("w0");
  AddWorker("w1");
  ASSERT_EQ(RunToSuccess().job_id(), "job-1");
  auto cancelled = jobs_->Submit(Spec(2, 2));
  ASSERT_TRUE(cancelled.ok());
  ASSERT_TRUE(jobs_->Cancel(cancelled->job_id()).ok());

  Open();
  // Both jobs are still served, as they ended.
  EXPECT_EQ(jobs_->Get("job-1")->state(), shardline::v1::SUCCEEDED);
  EXPECT_EQ(jobs_->Get("job-1")->committed_step(), 2);
  EXPECT_EQ(jobs_->Get("job-2")->state(), shardline::v1::CANCELLED);
  EXPECT_EQ(jobs_->Spec("job-2")->name(), "t");
  EXPECT_TRUE(weights_->ExportWeights("job-1", {}).ok());
  ASSERT_EQ(jobs_->List().size(), 2u);
  // Job numbers continue (a new job-1 would have met the old one's shards).
  auto next = jobs_->Submit(Spec(2, 2));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->job_id(), "job-3");
  // A worker of the earlier incarnation is unknown: it must register again,
  // and the ids it and its successor get are new.
  EXPECT_TRUE(absl::IsNotFound(registry_->Heartbeat(old_worker)));
  const std::string again = AddWorker("w0");
  EXPECT_NE(again, old_worker);
}

TEST_F(JobManagerRestartTest, ADeletedJobLosesItsCheckpointAndStaysGoneAcrossARestart) {
  std::vector<std::string> observed;
  jobs_->SetDeleteObserver([&observed](const std::string& id) { observed.push_back(id); });
  AddWorker("w0");
  AddWorker("w1");
  const JobStatus done = RunToSuccess();
  ASSERT_EQ(done.job_id(), "job-1");
  auto running = jobs_->Submit(Spec(2, 4));
  ASSERT_TRUE(running.ok());
  ASSERT_EQ(jobs_->Get("job-2")->state(), shardline::v1::RUNNING);

  // A job that has not ended is refused, and keeps running.
  auto refused = jobs_->Delete("job-2");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("cancel it first"), std::string::npos) << refused.status();
  EXPECT_EQ(jobs_->Get("job-2")->state(), shardline::v1::RUNNING);

  auto bytes_under = [](const std::string& dir) {
    int64_t bytes = 0;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
      if (entry.is_regular_file()) bytes += static_cast<int64_t>(entry.file_size());
    }
    return bytes;
  };
  const int64_t bytes = bytes_under(dir_ + "/job-1");
  ASSERT_GT(bytes, 0);
  EXPECT_EQ(jobs_->Get("job-1")->checkpoint_bytes(), bytes_under(dir_ + "/job-1/step-2"));
  auto deleted = jobs_->Delete("job-1");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->job_id(), "job-1");
  EXPECT_EQ(deleted->state(), shardline::v1::SUCCEEDED);
  EXPECT_EQ(deleted->freed_bytes(), bytes);
  EXPECT_EQ(observed, std::vector<std::string>{"job-1"});
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/job-1"));
  EXPECT_EQ(jobs_->Get("job-1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(weights_->ExportWeights("job-1", {}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs_->Delete("job-1").status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(jobs_->List().size(), 1u);
  EXPECT_EQ(jobs_->List()[0].job_id(), "job-2");
  // A shard of it that comes late is refused and stores nothing.
  EXPECT_EQ(SendShard(done, 0, 2, 3).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/job-1"));

  Open();
  EXPECT_EQ(jobs_->Get("job-1").status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(jobs_->List().size(), 1u);
  EXPECT_EQ(jobs_->List()[0].job_id(), "job-2");
  EXPECT_EQ(jobs_->Submit(Spec(2, 2))->job_id(), "job-3");
}

double Seconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

TEST_F(JobManagerRestartTest, AJobKeepsWhenItWasSubmittedStartedAndEndedAcrossARestart) {
  AddWorker("w0");
  const absl::Time submitted = now_;
  const JobStatus job = *jobs_->Submit(Spec(2, 2));
  EXPECT_EQ(job.submitted_at(), Seconds(submitted));
  EXPECT_EQ(job.started_at(), 0) << "pending: it waits for a second worker";
  now_ += absl::Seconds(5);
  AddWorker("w1");
  const JobStatus started = *jobs_->Get(job.job_id());
  ASSERT_EQ(started.state(), shardline::v1::RUNNING);
  EXPECT_EQ(started.started_at(), Seconds(submitted + absl::Seconds(5)));
  EXPECT_EQ(started.ended_at(), 0);
  auto mailbox = std::make_shared<StreamMailbox<JobStatus>>(StreamMailbox<JobStatus>::kUnlimited);
  ASSERT_TRUE(jobs_->Watch(job.job_id(), mailbox).ok());
  now_ += absl::Seconds(10);
  RunSteps(started, 1, 2);
  const JobStatus ended = *jobs_->Get(job.job_id());
  ASSERT_EQ(ended.state(), shardline::v1::SUCCEEDED);
  EXPECT_EQ(ended.ended_at(), Seconds(submitted + absl::Seconds(15)));
  const std::vector<JobStatus> watched = testing::Drain(*mailbox);
  ASSERT_FALSE(watched.empty());
  EXPECT_EQ(watched.back().state(), shardline::v1::SUCCEEDED);
  EXPECT_EQ(watched.back().ended_at(), ended.ended_at()) << "a watcher's last status has the end time";

  now_ += absl::Seconds(30);
  Open();
  const JobStatus restored = *jobs_->Get(job.job_id());
  EXPECT_EQ(restored.submitted_at(), ended.submitted_at());
  EXPECT_EQ(restored.started_at(), ended.started_at());
  EXPECT_EQ(restored.ended_at(), ended.ended_at());
}

TEST_F(JobManagerRestartTest, AnEndedJobIsDeletedOnceItHasBeenKeptForItsLifetime) {
  jobs_->SetEndedJobLifetime(absl::Hours(1));
  AddWorker("w0");
  AddWorker("w1");
  const absl::Time start = now_;
  ASSERT_EQ(RunToSuccess().job_id(), "job-1");
  now_ += absl::Minutes(30);
  const JobStatus cancelled = *jobs_->Submit(Spec(2, 2));
  ASSERT_TRUE(jobs_->Cancel(cancelled.job_id()).ok());
  const JobStatus running = *jobs_->Submit(Spec(2, 100));
  ASSERT_EQ(jobs_->Get(running.job_id())->state(), shardline::v1::RUNNING);

  now_ = start + absl::Minutes(59);
  jobs_->Tick();
  EXPECT_EQ(jobs_->List().size(), 3u);
  now_ = start + absl::Minutes(60);
  jobs_->Tick();
  EXPECT_EQ(jobs_->Get("job-1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/job-1")) << "its checkpoint went with it";
  EXPECT_EQ(jobs_->List().size(), 2u);
  now_ = start + absl::Minutes(90);
  jobs_->Tick();
  EXPECT_EQ(jobs_->Get(cancelled.job_id()).status().code(), absl::StatusCode::kNotFound);
  now_ = start + absl::Hours(5);
  jobs_->Tick();
  ASSERT_EQ(jobs_->List().size(), 1u) << "a running job is never deleted";
  EXPECT_EQ(jobs_->List()[0].job_id(), running.job_id());
}

TEST_F(JobManagerRestartTest, AJobRunningAtARestartResumesFromItsCommittedStepAtANewEpoch) {
  AddWorker("w0");
  AddWorker("w1");
  auto job = jobs_->Submit(Spec(2, 4));
  ASSERT_TRUE(job.ok());
  job = jobs_->Get(job->job_id());
  RunSteps(*job, 1, 2);
  // Step 3 reported by one stage only, then the coordinator dies.
  ASSERT_TRUE(jobs_->ReportStep(Report(*job, 0, 3)).ok());
  const JobStatus before = *jobs_->Get(job->job_id());
  ASSERT_EQ(before.committed_step(), 2);

  Open();
  jobs_->Schedule();
  JobStatus waiting = *jobs_->Get(job->job_id());
  EXPECT_EQ(waiting.state(), shardline::v1::RECOVERING);
  EXPECT_EQ(waiting.step(), 2);
  EXPECT_NE(waiting.message().find("resuming at step 3"), std::string::npos) << waiting.message();
  AddWorker("w0");
  AddWorker("w1");
  const JobStatus resumed = *jobs_->Get(job->job_id());
  ASSERT_EQ(resumed.state(), shardline::v1::RUNNING);
  EXPECT_GT(resumed.plan_epoch(), before.plan_epoch());
  ASSERT_EQ(delivered_.size(), 2u);
  for (const auto& [worker, a] : delivered_) EXPECT_EQ(a.first_step(), 3) << worker;
  // The old epoch's traffic is refused; the new one's completes the job.
  NoteAssignments();
  auto stale = jobs_->ReportStep(Report(before, 1, 3));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition) << stale.status();
  RunSteps(resumed, 3, 4);
  EXPECT_EQ(jobs_->Get(job->job_id())->state(), shardline::v1::SUCCEEDED);
  EXPECT_EQ(weights_->CommittedStep(job->job_id()).value_or(-1), 4);
}

TEST_F(JobManagerRestartTest, AfterTwoLeasesARestartedJobRunsOnTheWorkersThatCameBack) {
  AddWorker("w0");
  AddWorker("w1");
  auto job = jobs_->Submit(Spec(2, 4));
  ASSERT_TRUE(job.ok());
  job = jobs_->Get(job->job_id());
  RunSteps(*job, 1, 2);

  Open();
  const std::string back = AddWorker("w0");  // w1 never comes back
  now_ += absl::Milliseconds(60);
  ASSERT_TRUE(registry_->Heartbeat(back).ok());
  jobs_->Tick();
  EXPECT_EQ(jobs_->Get(job->job_id())->state(), shardline::v1::RECOVERING) << "still within its grace";
  now_ += absl::Milliseconds(60);
  ASSERT_TRUE(registry_->Heartbeat(back).ok());
  jobs_->Tick();
  const JobStatus resumed = *jobs_->Get(job->job_id());
  ASSERT_EQ(resumed.state(), shardline::v1::RUNNING) << resumed.message();
  ASSERT_EQ(resumed.stages_size(), 1);
  EXPECT_EQ(resumed.stages(0).worker(), "w0");
  ASSERT_EQ(delivered_.size(), 1u);
  EXPECT_EQ(delivered_[0].second.first_step(), 3);
  EXPECT_EQ(delivered_[0].second.stages(), 1);
}

}  // namespace
}  // namespace shardline::server
