// Bad input never takes the coordinator down: every malformed or stale
// request gets a clear gRPC status and the next request is served.
#include "tests/server/coordinator_service_fixture.h"

namespace shardline::server {
namespace {

using grpc::StatusCode;
using testing::CoordinatorServiceTest;

TEST_F(CoordinatorServiceTest, InvalidSpecsAreRefusedNamingTheField) {
  auto spec = Spec();
  spec.mutable_model()->set_n_heads(5);
  grpc::Status status;
  Submit(spec, &status);
  EXPECT_EQ(status.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("model.n_heads"), std::string::npos) << status.error_message();
  spec = Spec(7);  // more stages than units
  Submit(spec, &status);
  EXPECT_EQ(status.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(StillServing());
}

TEST_F(CoordinatorServiceTest, UnknownJobsAreNotFound) {
  grpc::ClientContext c1, c2, c3;
  shardline::v1::GetJobRequest request;
  request.set_job_id("job-404");
  shardline::v1::JobStatus status;
  EXPECT_EQ(admin_stub_->GetJob(&c1, request, &status).error_code(), StatusCode::NOT_FOUND);
  EXPECT_EQ(admin_stub_->CancelJob(&c2, request, &status).error_code(), StatusCode::NOT_FOUND);
  grpc::ClientContext c5;
  shardline::v1::DeleteJobResponse deleted;
  EXPECT_EQ(admin_stub_->DeleteJob(&c5, request, &deleted).error_code(), StatusCode::NOT_FOUND);
  shardline::v1::ExportWeightsRequest export_request;
  export_request.set_job_id("job-404");
  auto reader = admin_stub_->ExportWeights(&c3, export_request);
  shardline::v1::ExportChunk chunk;
  while (reader->Read(&chunk)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), StatusCode::NOT_FOUND);
  grpc::ClientContext c4;
  auto watch = admin_stub_->WatchJob(&c4, request);
  while (watch->Read(&status)) {
  }
  EXPECT_EQ(watch->Finish().error_code(), StatusCode::NOT_FOUND);
  shardline::v1::ReportStepRequest report;
  report.set_job_id("job-404");
  report.set_worker_id("worker-1");
  report.set_step(1);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::NOT_FOUND);
  EXPECT_TRUE(StillServing());
}

TEST_F(CoordinatorServiceTest, WorkerRegistrationIsValidated) {
  EXPECT_TRUE(Register("w0").ok());
  EXPECT_EQ(Register("w0").error_code(), StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(Register("bad name!").error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Register("w1", nullptr, /*flops=*/0).error_code(), StatusCode::INVALID_ARGUMENT);
  grpc::ClientContext context;
  shardline::v1::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id("worker-99");
  shardline::v1::HeartbeatResponse response;
  EXPECT_EQ(worker_stub_->Heartbeat(&context, heartbeat, &response).error_code(), StatusCode::NOT_FOUND);
  grpc::ClientContext watch_context;
  shardline::v1::WatchAssignmentsRequest watch;
  watch.set_worker_id("worker-99");
  auto reader = worker_stub_->WatchAssignments(&watch_context, watch);
  shardline::v1::Assignment assignment;
  while (reader->Read(&assignment)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), StatusCode::NOT_FOUND);
  EXPECT_TRUE(StillServing());
}

TEST_F(CoordinatorServiceTest, StaleOrForeignReportsAreRefused) {
  std::string worker;
  ASSERT_TRUE(Register("w0", &worker).ok());
  grpc::Status status;
  const shardline::v1::JobStatus job = Submit(Spec(), &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(job.state(), shardline::v1::RUNNING);
  shardline::v1::ReportStepRequest report;
  report.set_job_id(job.job_id());
  report.set_plan_epoch(job.plan_epoch());
  report.set_worker_id(worker);
  report.set_step(1);
  report.set_plan_epoch(job.plan_epoch() + 1);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::FAILED_PRECONDITION) << "stale epoch";
  report.set_plan_epoch(job.plan_epoch());
  report.set_worker_id("worker-77");
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::NOT_FOUND) << "no such worker";
  report.set_worker_id(worker);
  report.set_stage(3);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::INVALID_ARGUMENT);
  report.set_stage(0);
  report.set_step(99);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::INVALID_ARGUMENT);
  report.set_step(1);
  EXPECT_TRUE(ReportStep(report).ok());
  EXPECT_TRUE(ReportStep(report).ok()) << "a retried report is fine";

  shardline::v1::ShardChunk chunk;
  auto* header = chunk.mutable_header();
  header->set_job_id(job.job_id());
  header->set_worker_id(worker);
  header->set_plan_epoch(job.plan_epoch());
  header->set_stages(1);
  header->set_step(1);
  header->set_total_bytes(10);
  chunk.set_data(std::string(10, 'x'));  // not a safetensors file
  EXPECT_EQ(ReportShard({chunk}).error_code(), StatusCode::DATA_LOSS) << "another digest than the header's";
  header->set_digest(common::ShardDigest::Of(chunk.data()));
  EXPECT_EQ(ReportShard({chunk}).error_code(), StatusCode::INVALID_ARGUMENT) << "garbage bytes";
  header->set_total_bytes(100);
  EXPECT_EQ(ReportShard({chunk}).error_code(), StatusCode::INVALID_ARGUMENT) << "truncated";
  shardline::v1::ShardChunk headless;
  headless.set_data("abc");
  EXPECT_EQ(ReportShard({headless}).error_code(), StatusCode::INVALID_ARGUMENT) << "no header";
  header->set_total_bytes(int64_t{1} << 40);
  EXPECT_EQ(ReportShard({chunk}).error_code(), StatusCode::INVALID_ARGUMENT) << "absurd size";
  // Under the 16 GiB a shard may be, but more than this stage's weights and
  // optimizer state: refused before a byte is stored.
  header->set_total_bytes(int64_t{1} << 30);
  chunk.clear_data();
  grpc::Status big = ReportShard({chunk});
  EXPECT_EQ(big.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(big.error_message().find("optimizer state are at most"), std::string::npos) << big.error_message();

  // A stage error fails the job with the stage and worker named.
  report.set_step(2);
  report.set_error("the backend ran out of memory");
  report.set_error_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(ReportStep(report).ok());
  grpc::ClientContext context;
  shardline::v1::GetJobRequest get;
  get.set_job_id(job.job_id());
  shardline::v1::JobStatus after;
  ASSERT_TRUE(admin_stub_->GetJob(&context, get, &after).ok());
  EXPECT_EQ(after.state(), shardline::v1::FAILED);
  EXPECT_NE(after.message().find("stage 0 (worker w0)"), std::string::npos) << after.message();
  EXPECT_TRUE(StillServing());
}

// A shard stream that broke is resumed by the next one from the bytes the
// coordinator holds: a stream starting elsewhere is told where, at once.
TEST_F(CoordinatorServiceTest, ABrokenShardUploadResumesWhereTheCoordinatorsCopyEnds) {
  std::string worker;
  ASSERT_TRUE(Register("w0", &worker).ok());
  grpc::Status status;
  const shardline::v1::JobStatus job = Submit(Spec(1, 1024), &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string file = ShardFile();
  const int64_t half = static_cast<int64_t>(file.size()) / 2 + 3;
  shardline::v1::ReportShardResponse response;
  EXPECT_EQ(ReportShard(Chunks(job, file, 0, half), &response).error_code(), StatusCode::INVALID_ARGUMENT)
      << "a stream that ends short";
  EXPECT_FALSE(response.stored());

  response.Clear();
  ASSERT_TRUE(ReportShard(Chunks(job, file, 0, static_cast<int64_t>(file.size())), &response).ok());
  EXPECT_FALSE(response.stored());
  EXPECT_EQ(response.resume_offset(), half) << "where the coordinator's copy ends";

  response.Clear();
  status = ReportShard(Chunks(job, file, half, static_cast<int64_t>(file.size())), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(response.stored());
  EXPECT_TRUE(response.committed());
  ASSERT_EQ(*weights_->CommittedStep(job.job_id()), 5);
  auto exported = weights_->ExportWeights(job.job_id(), {});
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->tensors.at("blocks.0.mlp.fc.weight").values<float>()[7], 0.5f);

  response.Clear();
  ASSERT_TRUE(ReportShard(Chunks(job, file, 0, static_cast<int64_t>(file.size())), &response).ok())
      << "the same shard again is fine";
  EXPECT_TRUE(response.stored());
  EXPECT_FALSE(response.committed());
}

// A stream whose job moved on (here: cancelled) ends at its next chunk
// instead of after the whole shard: of 128 MiB, the worker cannot write
// all (HTTP/2's windows hold far less).
TEST_F(CoordinatorServiceTest, AShardStreamEndsAtItsNextChunkOnceItsEpochIsStale) {
  std::string worker;
  ASSERT_TRUE(Register("w0", &worker).ok());
  grpc::Status status;
  const shardline::v1::JobStatus job = Submit(Spec(1, 1024), &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string file = ShardFile(16 << 10);
  std::vector<shardline::v1::ShardChunk> chunks = Chunks(job, file, 0, static_cast<int64_t>(file.size()));
  ASSERT_GT(chunks.size(), 2u);
  grpc::ClientContext context;
  Sign(context);
  shardline::v1::ReportShardResponse response;
  auto writer = worker_stub_->ReportShard(&context, &response);
  ASSERT_TRUE(writer->Write(chunks[0]));
  // Once the coordinator has begun the upload, its file is there.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (std::filesystem::is_empty(dir_ + "/.uploads")) {
    ASSERT_LT(absl::Now(), give_up) << "the first stream never began its upload";
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(jobs_->Cancel(job.job_id()).ok());
  size_t written = 1;
  while (written < chunks.size() && writer->Write(chunks[written])) ++written;
  EXPECT_LT(written, chunks.size()) << "the coordinator read the stale stream to its end";
  writer->WritesDone();
  status = writer->Finish();
  EXPECT_EQ(status.error_code(), StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_NE(status.error_message().find("not running"), std::string::npos) << status.error_message();
  EXPECT_FALSE(response.stored());
  EXPECT_TRUE(StillServing());
}

// A worker whose assignment stream broke watches again: the new stream gets
// the assignment the coordinator made while no stream was open, and one made
// later (issue 13's first defect: the closed mailbox used to be reused, so
// the worker never got an assignment again).
TEST_F(CoordinatorServiceTest, AWorkerWatchingAgainAfterItsStreamBrokeGetsItsAssignments) {
  std::string worker;
  ASSERT_TRUE(Register("w0", &worker).ok());
  auto watch = [&](grpc::ClientContext& context) {
    shardline::v1::WatchAssignmentsRequest request;
    request.set_worker_id(worker);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    Sign(context);
    return worker_stub_->WatchAssignments(&context, request);
  };
  {
    grpc::ClientContext first;
    auto reader = watch(first);
    first.TryCancel();  // the stream breaks
    shardline::v1::Assignment ignored;
    while (reader->Read(&ignored)) {
    }
    (void)reader->Finish();
  }
  absl::SleepFor(absl::Milliseconds(200));  // the coordinator has seen it go
  grpc::Status status;
  const shardline::v1::JobStatus job = Submit(Spec(), &status);  // assigned while no stream is open
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(job.state(), shardline::v1::RUNNING);
  grpc::ClientContext second;
  auto reader = watch(second);
  shardline::v1::Assignment assignment;
  ASSERT_TRUE(reader->Read(&assignment)) << "the assignment never came on the new stream";
  EXPECT_EQ(assignment.job_id(), job.job_id());
  EXPECT_EQ(assignment.plan_epoch(), job.plan_epoch());
  EXPECT_FALSE(assignment.cancel());
  // And what comes later (here: the cancellation) reaches it too.
  grpc::ClientContext cancel_context;
  shardline::v1::GetJobRequest cancel;
  cancel.set_job_id(job.job_id());
  shardline::v1::JobStatus cancelled;
  ASSERT_TRUE(admin_stub_->CancelJob(&cancel_context, cancel, &cancelled).ok());
  ASSERT_TRUE(reader->Read(&assignment));
  EXPECT_EQ(assignment.job_id(), job.job_id());
  EXPECT_TRUE(assignment.cancel());
  second.TryCancel();
  while (reader->Read(&assignment)) {
  }
  (void)reader->Finish();
}

// A link in doubt (probed over 3x slower than before) whose other end is
// busy with a job is checked anyway: the idle end is handed it, bounded to
// a short transfer, once kCheckEvery has passed; found back, it leaves
// doubt and counts as a recovery. A busy worker is handed nothing else,
// but for the links of a worker that joined.
// A lost worker's links are kept while the registry shows it, and go at
// the first registration after the registry forgot it (not at every one:
// each would scan every link).
TEST_F(CoordinatorServiceTest, TheLinksOfAWorkerTheRegistryForgotGoAtTheNextRegistration) {
  std::string w0, w1;
  ASSERT_TRUE(Register("w0", &w0, 1e9, "10.0.0.1:1").ok());
  ASSERT_TRUE(Register("w1", &w1, 1e9, "10.0.0.2:1").ok());
  ASSERT_TRUE(Register("w2", nullptr, 1e9, "10.0.0.3:1").ok());
  auto measured = [](const std::string& to) {
    LinkRecord l;
    l.to = to;
    l.bytes_per_second = 1e8;
    return l;
  };
  jobs_->links().Record("w0", {measured("w1"), measured("w2")});
  ASSERT_TRUE(registry_->Leave(w1).ok());
  ASSERT_TRUE(Register("w3", nullptr, 1e9, "10.0.0.4:1").ok());
  EXPECT_TRUE(jobs_->links().Get("w0", "w1").has_value()) << "lost, still shown: kept";
  skew_seconds_ += absl::ToInt64Seconds(WorkerRegistry::kLostRetention) + 1;
  registry_->ExpireLeases();  // the reaper's: w1 forgotten, the others lost now
  ASSERT_EQ(registry_->forgotten(), 1u);
  ASSERT_TRUE(Register("w4", nullptr, 1e9, "10.0.0.5:1").ok());
  EXPECT_FALSE(jobs_->links().Get("w0", "w1").has_value()) << "forgotten: gone";
  EXPECT_TRUE(jobs_->links().Get("w0", "w2").has_value()) << "w2 is lost, still shown: kept";
  EXPECT_TRUE(StillServing());
}

TEST_F(CoordinatorServiceTest, ALinkInDoubtIsCheckedAgainstABusyPeerWithAShortTransfer) {
  std::string w0, w1, w2;  // a host each: a link within one host is memory, never in doubt
  ASSERT_TRUE(Register("w0", &w0, 1e9, "127.0.0.1:1").ok());
  ASSERT_TRUE(Register("w1", &w1, 1e9, "127.0.0.2:1").ok());
  ASSERT_TRUE(Register("w2", &w2, 1e9, "127.0.0.3:1").ok());
  MeasureAll({"w0", "w1", "w2"}, 1.25e9);
  LinkRecord slowed;
  slowed.to = "w1";
  slowed.bytes_per_second = 1e6;
  jobs_->links().Record("w0", {slowed});
  registry_->SetJob(w1, "job-x");
  auto list = [&] {
    grpc::ClientContext context;
    shardline::v1::ListLinksResponse links;
    EXPECT_TRUE(admin_stub_->ListLinks(&context, shardline::v1::ListLinksRequest(), &links).ok());
    for (const auto& l : links.links()) {
      if (l.from_worker() == "w0" && l.to_worker() == "w1") return l;
    }
    ADD_FAILURE() << "no w0 -> w1";
    return shardline::v1::LinkStatus();
  };
  EXPECT_EQ(list().fast_before_bytes_per_second(), 1.25e9);
  EXPECT_GT(list().next_check_seconds(), 0);
  EXPECT_EQ(Beat(w0).probe_targets_size(), 0) << "not due yet";
  skew_seconds_ += absl::ToInt64Seconds(LinkTable::kCheckEvery);
  EXPECT_EQ(list().next_check_seconds(), 0) << "due";
  EXPECT_EQ(Beat(w1).probe_targets_size(), 0) << "busy, and none of its links is in doubt";
  const shardline::v1::HeartbeatResponse check = Beat(w0);
  ASSERT_EQ(check.probe_targets_size(), 1);
  EXPECT_EQ(check.probe_targets(0).worker(), "w1");
  EXPECT_EQ(check.probe_targets(0).max_transfer_bytes(), LinkTable::kCheckBytes);
  EXPECT_EQ(Beat(w0).probe_targets_size(), 0) << "one at a time";

  shardline::v1::ReportLinksRequest report;
  report.set_worker_id(w0);
  shardline::v1::LinkMeasurement* m = report.add_links();
  m->set_to_worker("w1");
  m->set_bytes_per_second(1e9);
  m->set_rtt_seconds(1e-4);
  grpc::ClientContext context;
  Sign(context, w0);
  shardline::v1::ReportLinksResponse response;
  ASSERT_TRUE(worker_stub_->ReportLinks(&context, report, &response).ok());
  EXPECT_EQ(response.probe_targets_size(), 0);
  EXPECT_EQ(list().fast_before_bytes_per_second(), 0) << "back: no longer in doubt";
  EXPECT_TRUE(list().checked()) << "beside w1's job: at least 1 GB/s";
  EXPECT_EQ(jobs_->links().recoveries(), 1u);
  skew_seconds_ += absl::ToInt64Seconds(LinkTable::kCheckEveryMost);
  EXPECT_EQ(Beat(w0).probe_targets_size(), 0) << "nothing left to check, and w1 is busy";

  // Both ends idle: the check's figure is replaced by a plain probe's.
  registry_->SetJob(w1, "");
  const shardline::v1::HeartbeatResponse probe = Beat(w0);
  ASSERT_EQ(probe.probe_targets_size(), 1);
  EXPECT_EQ(probe.probe_targets(0).worker(), "w1");
  EXPECT_EQ(probe.probe_targets(0).max_transfer_bytes(), 0) << "a plain probe, unbounded";
  m->set_bytes_per_second(1.2e9);
  grpc::ClientContext probed;
  Sign(probed, w0);
  ASSERT_TRUE(worker_stub_->ReportLinks(&probed, report, &response).ok());
  EXPECT_FALSE(list().checked());
  EXPECT_EQ(list().bytes_per_second(), 1.2e9);
  EXPECT_EQ(Beat(w0).probe_targets_size(), 0) << "nothing queued";
  registry_->SetJob(w1, "job-x");

  // A worker that joins: its links to the busy w1 are never measured, and
  // a plain probe waits for both ends idle; they are checked at once.
  std::string w3;
  ASSERT_TRUE(Register("w3", &w3, 1e9, "127.0.0.4:1").ok());
  const shardline::v1::HeartbeatResponse joined = Beat(w1);
  ASSERT_EQ(joined.probe_targets_size(), 1) << "w1 is busy: a check";
  EXPECT_EQ(joined.probe_targets(0).worker(), "w3");
  EXPECT_EQ(joined.probe_targets(0).max_transfer_bytes(), LinkTable::kCheckBytes);
  EXPECT_TRUE(StillServing());
}

}  // namespace
}  // namespace shardline::server
