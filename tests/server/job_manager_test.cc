// The coordinator's job state machine, without gRPC: scheduling on idle
// workers, step aggregation, success once the last shards commit, and
// failures that name the stage or the lost worker.
#include <filesystem>
#include <set>
#include <utility>

#include "common/file_util.h"
#include "common/shard_digest.h"
#include "tests/server/job_manager_fixture.h"

namespace shardline::server {
namespace {

using shardline::v1::JobStatus;
using testing::Drain;
using testing::JobManagerTest;

TEST_F(JobManagerTest, PendingUntilEnoughWorkersThenPlannedAndAssigned) {
  auto job = jobs_->Submit(Spec(2));
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), shardline::v1::PENDING);
  EXPECT_NE(job->message().find("waiting for 2 idle workers"), std::string::npos);
  AddWorker("a");
  EXPECT_EQ(jobs_->Get(job->job_id())->state(), shardline::v1::PENDING);
  AddWorker("b", 3e10);
  const JobStatus running = *jobs_->Get(job->job_id());
  EXPECT_EQ(running.state(), shardline::v1::RUNNING);
  ASSERT_EQ(delivered_.size(), 2u);
  EXPECT_EQ(delivered_[0].second.unit_begin(), 0);
  EXPECT_EQ(delivered_[0].second.unit_end(), delivered_[1].second.unit_begin());
  EXPECT_EQ(delivered_[1].second.unit_end(), 4);
  // Stage 1 dials stage 0's worker.
  EXPECT_EQ(delivered_[1].second.upstream_address(), registry_->Get(delivered_[0].first)->capabilities.listen_address());
  EXPECT_EQ(delivered_[0].second.plan_epoch(), running.plan_epoch());
  EXPECT_FALSE(delivered_[0].second.initial_weights()) << "from the seed";
  EXPECT_EQ(registry_->Idle().size(), 0u);
}

TEST_F(JobManagerTest, StepsCompleteWhenEveryStageReportsAndTheJobSucceedsAfterTheCommit) {
  AddWorker("a");
  AddWorker("b");
  const JobStatus job = *jobs_->Submit(Spec(2));
  NoteAssignments();
  for (int64_t step = 1; step <= 2; ++step) {
    EXPECT_FALSE(*jobs_->ReportStep(Report(job, 1, step)));
    EXPECT_EQ(jobs_->Get(job.job_id())->step(), step - 1) << "one stage is not a step";
    EXPECT_FALSE(*jobs_->ReportStep(Report(job, 0, step)));
    const JobStatus now = *jobs_->Get(job.job_id());
    EXPECT_EQ(now.step(), step);
    EXPECT_DOUBLE_EQ(now.loss(), 1.5 - 0.1 * step);
    EXPECT_DOUBLE_EQ(now.tokens_per_s(), 200.0);
    EXPECT_DOUBLE_EQ(now.stages(0).busy_fraction(), 0.5);
  }
  EXPECT_EQ(jobs_->Get(job.job_id())->state(), shardline::v1::RUNNING) << "weights not committed yet";
  EXPECT_FALSE(*SendShard(job, 0, 2, 2));
  EXPECT_TRUE(*SendShard(job, 1, 2, 2));
  const JobStatus done = *jobs_->Get(job.job_id());
  EXPECT_EQ(done.state(), shardline::v1::SUCCEEDED);
  EXPECT_EQ(done.committed_step(), 2);
  EXPECT_EQ(registry_->Idle().size(), 2u) << "workers are free again";
  EXPECT_EQ(jobs_->Cancel(job.job_id()).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A job that starts from another's weights (JobSpec.init.from_job):
// checked at submission (a job of this coordinator, the same model, a
// checkpoint to start from), its committed weights copied as the new job's
// step 0 without their optimizer state, kept when the other job goes and
// across a restart.
TEST_F(JobManagerTest, AJobStartsFromTheCommittedWeightsOfAnother) {
  auto spec = Spec(1);
  spec.mutable_init()->set_from_job("job-99");
  EXPECT_EQ(jobs_->Submit(spec).status().code(), absl::StatusCode::kNotFound);
  const JobStatus source = ThreeStagesCommittedAtStep1();
  spec.mutable_init()->set_from_job(source.job_id());
  auto other_model = spec;
  other_model.mutable_model()->set_n_layers(3);
  const auto refused = jobs_->Submit(other_model);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("its weights fit only the same model"), std::string::npos)
      << refused.status();
  const JobStatus unsaved = *jobs_->Submit(Spec(1));  // waits: every worker is busy
  auto from_unsaved = spec;
  from_unsaved.mutable_init()->set_from_job(unsaved.job_id());
  const auto none = jobs_->Submit(from_unsaved);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("has no checkpoint to start from yet"), std::string::npos) << none.status();
  const size_t jobs_before = jobs_->List().size();

  const auto started = jobs_->Submit(spec);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(jobs_->List().size(), jobs_before + 1) << "refused submissions left no job";
  EXPECT_EQ(started->committed_step(), 0);
  EXPECT_GT(started->checkpoint_bytes(), 0);
  EXPECT_EQ(started->init_from(), source.job_id());
  EXPECT_EQ(started->init_step(), 1);
  auto weights = weights_->FetchTensors(started->job_id(), {"p0", "p1", "p2"});
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->metadata["step"], "0");
  EXPECT_EQ(weights->tensors.size(), 3u) << "weights alone";
  ASSERT_TRUE(jobs_->Cancel(source.job_id()).ok());
  ASSERT_TRUE(jobs_->Delete(source.job_id()).ok());
  Open();
  const JobStatus recovered = *jobs_->Get(started->job_id());
  EXPECT_EQ(recovered.committed_step(), 0);
  EXPECT_EQ(recovered.init_from(), source.job_id());
  EXPECT_TRUE(weights_->FetchTensors(started->job_id(), {"p0", "p1", "p2"}).ok()) << "its own copy";
}

// A job that starts from a weights file sent with it: the file moved into
// the store as its step 0; refused with optimizer state in it or with
// init.from_job too, no job kept.
TEST_F(JobManagerTest, AJobStartsFromAWeightsFileSentWithIt) {
  auto write = [&](const std::string& name, bool with_optimizer) {
    common::SafetensorsContents c;
    for (const char* p : {"p0", "p1"}) c.tensors.emplace(p, *common::Tensor::Zeros(common::DType::kF32, {2}));
    if (with_optimizer) c.tensors.emplace("optimizer.m.p0", *common::Tensor::Zeros(common::DType::kF32, {2}));
    const std::string path = weights_->UploadPath(name);
    const std::string bytes = *common::SerializeSafetensors(c);
    EXPECT_TRUE(common::WriteFileAtomically(path, bytes).ok());
    return std::make_pair(path, common::ShardDigest::Of(bytes));
  };
  const auto [with_state, with_state_digest] = write("state.part", true);
  const auto refused = jobs_->SubmitWithWeights(Spec(1), "ops", with_state, with_state_digest, 3);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("optimizer state"), std::string::npos) << refused.status();
  auto both = Spec(1);
  both.mutable_init()->set_from_job("job-1");
  const auto [path, digest] = write("weights.part", false);
  EXPECT_EQ(jobs_->SubmitWithWeights(both, "ops", path, digest, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(jobs_->List().empty()) << "refused submissions left no job";

  const auto started = jobs_->SubmitWithWeights(Spec(1), "ops", path, digest, 3);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(started->committed_step(), 0);
  EXPECT_EQ(started->init_from(), common::kSentWeights);
  EXPECT_EQ(started->init_step(), 3);
  EXPECT_FALSE(std::filesystem::exists(path)) << "moved into the store";
  EXPECT_TRUE(weights_->FetchTensors(started->job_id(), {"p0", "p1"}).ok());
  AddWorker("a");
  ASSERT_EQ(delivered_.size(), 1u);
  EXPECT_EQ(delivered_[0].second.first_step(), 1);
  EXPECT_TRUE(delivered_[0].second.initial_weights()) << "told to load them before step 1";
}

// Starting weights copied for a submission that stopped before its record
// was saved are removed at the next start; another checkpoint no record
// names is left alone.
TEST_F(JobManagerTest, StartingWeightsOfASubmissionCutShortAreRemovedAtTheNextStart) {
  const JobStatus source = ThreeStagesCommittedAtStep1();
  ASSERT_TRUE(weights_->SeedWeights("job-77", source.job_id()).ok());
  ShardReport stray;
  stray.key = {"job-78", 0, 1, /*step=*/5, /*epoch=*/1};
  stray.contents.tensors.emplace("p0", *common::Tensor::Zeros(common::DType::kF32, {2}));
  ASSERT_TRUE(*weights_->Report(stray));
  Open();
  EXPECT_EQ(weights_->CommittedStep("job-77").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*weights_->CommittedStep("job-78"), 5);
  EXPECT_EQ(*weights_->CommittedStep(source.job_id()), 1);
}

// What a stage reports, as the job's status shows it: the page faults per
// GiB received (the allocator-churn figure), busy fraction, link peak and
// micro-batches held; a stage that received nothing has no faults per GiB.
TEST_F(JobManagerTest, StageFiguresComeFromTheStagesReports) {
  AddWorker("a");
  AddWorker("b");
  const JobStatus job = *jobs_->Submit(Spec(2));
  NoteAssignments();
  auto first = Report(job, 0, 1);
  first.set_minor_faults(70);  // nothing received: not a figure per GiB
  auto last = Report(job, 1, 1);
  last.set_received_bytes(int64_t{3} << 29);  // 1.5 GiB
  last.set_minor_faults(3000);
  last.set_link_peak_bytes(5 << 20);
  last.set_peak_slots(3);
  last.set_busy_seconds(0.4);
  ASSERT_FALSE(*jobs_->ReportStep(first));
  ASSERT_FALSE(*jobs_->ReportStep(last));
  const JobStatus now = *jobs_->Get(job.job_id());
  ASSERT_EQ(now.stages_size(), 2);
  EXPECT_EQ(now.stages(0).minor_faults_per_gib(), 0.0);
  EXPECT_EQ(now.stages(1).minor_faults_per_gib(), 2000.0);
  EXPECT_EQ(now.stages(1).link_peak_bytes(), 5 << 20);
  EXPECT_EQ(now.stages(1).peak_slots(), 3);
  EXPECT_DOUBLE_EQ(now.stages(1).busy_fraction(), 0.8);
}

// A p × d grid: p · d workers, d copies of one cut, each position told its
// replica, its replica's upstream stage and its stage's replicas.
TEST_F(JobManagerTest, ABrokenLinkWaitsToNameTheLostWorker) {
  AddWorker("a");
  AddWorker("b");
  AddWorker("c");
  const JobStatus job = *jobs_->Submit(Spec(3, 100));
  NoteAssignments();
  auto report = Report(job, 2, 5);
  report.set_error("previous stage: the link broke");
  report.set_error_code(static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(*jobs_->ReportStep(report)) << "the reporting stage stops";
  EXPECT_EQ(jobs_->Get(job.job_id())->state(), shardline::v1::RUNNING) << "not yet: who died?";
  // b (stage 1) stops heartbeating; a and c go on.
  now_ += absl::Milliseconds(40);
  ASSERT_TRUE(registry_->Heartbeat(stage_workers_[0]).ok());
  ASSERT_TRUE(registry_->Heartbeat(stage_workers_[2]).ok());
  now_ += absl::Milliseconds(40);
  const std::vector<WorkerRecord> lost = registry_->ExpireLeases();
  ASSERT_EQ(lost.size(), 1u);
  jobs_->WorkersLost(lost);
  // Not failed: it waits to restart, naming the lost worker, the survivors told to stop.
  const JobStatus recovering = *jobs_->Get(job.job_id());
  EXPECT_EQ(recovering.state(), shardline::v1::RECOVERING);
  EXPECT_NE(recovering.message().find("recovering (worker b (stage 1) was lost"), std::string::npos)
      << recovering.message();
  EXPECT_NE(recovering.message().find("waiting for 3 idle workers (2 now)"), std::string::npos)
      << recovering.message();
  size_t cancels = 0;
  for (const auto& [w, a] : delivered_) cancels += a.cancel();
  EXPECT_EQ(cancels, 3u);
  // A standby joins: the job restarts on it and the survivors at a new epoch.
  delivered_.clear();
  AddWorker("d");
  const JobStatus restarted = *jobs_->Get(job.job_id());
  ASSERT_EQ(restarted.state(), shardline::v1::RUNNING) << restarted.message();
  EXPECT_GT(restarted.plan_epoch(), job.plan_epoch());
  std::set<std::string> names;
  for (const auto& stage : restarted.stages()) names.insert(stage.worker());
  EXPECT_EQ(names, (std::set<std::string>{"a", "c", "d"}));
  ASSERT_EQ(delivered_.size(), 3u);
  for (const auto& [w, a] : delivered_) EXPECT_EQ(a.first_step(), 1) << "nothing was committed";
}

// An operator drains a busy worker with --at_once: its job restarts at once
// without it, on the standby, and the drained worker gets no job until
// undrained.
TEST_F(JobManagerTest, ADrainedWorkersJobMovesOffItAtOnceAndItGetsNoJobUntilUndrained) {
  AddWorker("a");
  const std::string b = AddWorker("b");
  const JobStatus job = *jobs_->Submit(Spec(2, 100));
  NoteAssignments();
  AddWorker("standby");
  delivered_.clear();
  auto drained = jobs_->Drain("b", /*undo=*/false, /*now=*/true);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_TRUE(drained->drained);
  EXPECT_TRUE(drained->job_id.empty()) << "released from its job";
  const JobStatus moved = *jobs_->Get(job.job_id());
  ASSERT_EQ(moved.state(), shardline::v1::RUNNING) << moved.message();
  EXPECT_GT(moved.plan_epoch(), job.plan_epoch());
  for (const auto& stage : moved.stages()) EXPECT_NE(stage.worker(), "b");
  bool told_to_stop = false;
  for (const auto& [w, a] : delivered_) told_to_stop |= w == b && a.cancel();
  EXPECT_TRUE(told_to_stop);
  for (const auto& w : registry_->Idle()) EXPECT_NE(w.name, "b") << "a drained worker is not idle";

  // Its job ends; a new job waits rather than take the drained worker.
  ASSERT_TRUE(jobs_->Cancel(job.job_id()).ok());
  const JobStatus waiting = *jobs_->Submit(Spec(3, 100));
  EXPECT_EQ(waiting.state(), shardline::v1::PENDING) << waiting.message();
  ASSERT_TRUE(jobs_->Drain(b, /*undo=*/true).ok()) << "by id too";
  EXPECT_EQ(jobs_->Get(waiting.job_id())->state(), shardline::v1::RUNNING);
  EXPECT_EQ(jobs_->Drain("nobody", false).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, WithNoStandbyWithinALeaseALossReplansOntoFewerStagesOfTheSameCheckpoint) {
  const JobStatus job = ThreeStagesCommittedAtStep1();
  // Half of step 2's checkpoint arrives on the 3-stage cut, then c dies.
  for (int stage = 0; stage < 3; ++stage) ASSERT_TRUE(jobs_->ReportStep(Report(job, stage, 2)).ok());
  ASSERT_FALSE(*SendShard(job, 0, 3, 2));
  now_ += absl::Milliseconds(40);
  ASSERT_TRUE(registry_->Heartbeat(stage_workers_[0]).ok());
  ASSERT_TRUE(registry_->Heartbeat(stage_workers_[1]).ok());
  now_ += absl::Milliseconds(40);
  jobs_->WorkersLost(registry_->ExpireLeases());
  // Within its grace it waits for a replacement...
  jobs_->Tick();
  JobStatus waiting = *jobs_->Get(job.job_id());
  ASSERT_EQ(waiting.state(), shardline::v1::RECOVERING);
  EXPECT_NE(waiting.message().find("resuming at step 2: waiting for 3 idle workers (2 now)"), std::string::npos)
      << waiting.message();
  // ...then restarts on the two survivors, the layers cut in two.
  delivered_.clear();
  now_ += absl::Milliseconds(60);
  ASSERT_TRUE(registry_->Heartbeat(stage_workers_[0]).ok());
  ASSERT_TRUE(registry_->Heartbeat(stage_workers_[1]).ok());
  jobs_->Tick();
  const JobStatus replanned = *jobs_->Get(job.job_id());
  ASSERT_EQ(replanned.state(), shardline::v1::RUNNING) << replanned.message();
  EXPECT_EQ(replanned.stages_size(), 2);
  EXPECT_NE(replanned.message().find("re-planned onto 2 of the spec's 3 pipeline stages from step 2 (worker c"),
            std::string::npos)
      << replanned.message();
  ASSERT_EQ(delivered_.size(), 2u);
  int units = 0;
  for (const auto& [w, a] : delivered_) {
    EXPECT_EQ(a.stages(), 2);
    EXPECT_EQ(a.spec().parallel().pipeline_stages(), 2);
    EXPECT_EQ(a.first_step(), 2);
    EXPECT_GT(a.plan_epoch(), job.plan_epoch());
    units += a.unit_end() - a.unit_begin();
  }
  EXPECT_EQ(units, common::PipelineUnits(Spec(3).model()));
  // Step 2 again, checkpointed on the new cut: the old cut's half is void.
  NoteAssignments();
  for (int stage = 0; stage < 2; ++stage) ASSERT_TRUE(jobs_->ReportStep(Report(replanned, stage, 2)).ok());
  ASSERT_FALSE(*SendShard(replanned, 0, 2, 2));
  auto committed = SendShard(replanned, 1, 2, 2);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_TRUE(*committed);
  EXPECT_EQ(jobs_->Get(job.job_id())->committed_step(), 2);
}

// A broken link and nobody lost (a network fault, a stuck stage): a lease
// on, the job starts again from its committed step; only when it keeps
// breaking with no newer checkpoint does it fail, with the stage's error.
TEST_F(JobManagerTest, ABrokenLinkWithNobodyLostRestartsAndFailsOnlyWhenItKeepsBreaking) {
  AddWorker("a");
  AddWorker("b");
  JobStatus job = *jobs_->Submit(Spec(2, 100));
  auto break_link = [&](const JobStatus& at) {
    NoteAssignments();
    auto report = Report(at, 0, 3);
    report.set_error("no message from the neighbouring stage for 1m");
    report.set_error_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
    ASSERT_TRUE(jobs_->ReportStep(report).ok());
    // Both still heartbeat: nobody is lost. Not before a lease (50 ms) …
    for (int i = 0; i < 7; ++i) {
      now_ += absl::Milliseconds(7);
      for (const auto& [stage, worker] : stage_workers_) ASSERT_TRUE(registry_->Heartbeat(worker).ok());
      jobs_->Tick();
    }
    EXPECT_EQ(jobs_->Get(job.job_id())->plan_epoch(), at.plan_epoch()) << "gave up before a lease had passed";
    now_ += absl::Milliseconds(1);
    jobs_->Tick();
  };
  for (int attempt = 1; attempt <= RunningJob::kLinkRetries; ++attempt) {
    break_link(job);
    const JobStatus again = *jobs_->Get(job.job_id());
    ASSERT_EQ(again.state(), shardline::v1::RUNNING) << again.message();
    EXPECT_GT(again.plan_epoch(), job.plan_epoch()) << "restarted at a new epoch";
    job = again;
  }
  break_link(job);
  const JobStatus failed = *jobs_->Get(job.job_id());
  EXPECT_EQ(failed.state(), shardline::v1::FAILED);
  EXPECT_NE(failed.message().find("stage 0 (worker a) failed at step 3"), std::string::npos) << failed.message();
  EXPECT_NE(failed.message().find("4 times in a row"), std::string::npos) << failed.message();
}

// A stage's link broke and its neighbour has sent no heartbeat for two
// intervals: it is taken for lost then, well before its lease lapses.
TEST_F(JobManagerTest, AfterABrokenLinkAWorkerSilentForTwoHeartbeatsIsLostBeforeItsLease) {
  AddWorker("a");
  AddWorker("b");
  const JobStatus job = *jobs_->Submit(Spec(2, 100));
  NoteAssignments();
  AddWorker("standby");
  auto report = Report(job, 0, 3);
  report.set_error("next stage: the link broke");
  report.set_error_code(static_cast<int>(absl::StatusCode::kUnavailable));
  ASSERT_TRUE(jobs_->ReportStep(report).ok());
  // a heartbeats (every 12.5 ms for a 50 ms lease); b is silent.
  for (int i = 0; i < 3; ++i) {
    now_ += absl::Milliseconds(10);
    ASSERT_TRUE(registry_->Heartbeat(stage_workers_[0]).ok());
    jobs_->Tick();
  }
  const JobStatus moved = *jobs_->Get(job.job_id());  // 30 ms: past two intervals, within the lease
  ASSERT_EQ(moved.state(), shardline::v1::RUNNING) << moved.message();
  EXPECT_GT(moved.plan_epoch(), job.plan_epoch());
  for (const auto& stage : moved.stages()) EXPECT_NE(stage.worker(), "b");
  EXPECT_TRUE(registry_->Get(stage_workers_[1])->lost);
  EXPECT_FALSE(registry_->Get(stage_workers_[0])->lost);
}

TEST_F(JobManagerTest, PlansThatDoNotFitFailTheJobWithTheReason) {
  shardline::v1::WorkerCapabilities caps;
  caps.set_listen_address("tiny:1");
  caps.set_gemm_flops(1e10);
  caps.set_memory_bytes(1000);  // bytes
  ASSERT_TRUE(registry_->Register("tiny", caps).ok());
  const JobStatus job = *jobs_->Submit(Spec(1));
  EXPECT_EQ(job.state(), shardline::v1::FAILED);
  EXPECT_NE(job.message().find("cannot plan"), std::string::npos) << job.message();
  EXPECT_EQ(registry_->Idle().size(), 1u);
}

TEST_F(JobManagerTest, AWatcherSubscribingLateStillSeesEveryRecentStep) {
  AddWorker("a");
  AddWorker("b");
  const JobStatus job = *jobs_->Submit(Spec(2, 5));
  NoteAssignments();
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_FALSE(*jobs_->ReportStep(Report(job, 0, step)));
    ASSERT_FALSE(*jobs_->ReportStep(Report(job, 1, step)));
  }
  auto mailbox = std::make_shared<StreamMailbox<JobStatus>>(StreamMailbox<JobStatus>::kUnlimited);
  ASSERT_TRUE(jobs_->Watch(job.job_id(), mailbox).ok());
  ASSERT_FALSE(*jobs_->ReportStep(Report(job, 0, 4)));
  ASSERT_FALSE(*jobs_->ReportStep(Report(job, 1, 4)));
  const std::vector<JobStatus> seen = Drain(*mailbox);
  ASSERT_EQ(seen.size(), 4u);
  for (int64_t step = 1; step <= 4; ++step) {
    EXPECT_EQ(seen[step - 1].step(), step);
    EXPECT_DOUBLE_EQ(seen[step - 1].loss(), 1.5 - 0.1 * step);
  }
}

}  // namespace
}  // namespace shardline::server
