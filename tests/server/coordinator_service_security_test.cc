// The coordinator against a hostile client (issue 16): oversized input gets
// short INVALID_ARGUMENTs, watchers are bounded, and only a position's
// worker, with its registration secret, may report it.
#include <limits>
#include <utility>
#include <vector>

#include "tests/server/coordinator_service_fixture.h"

namespace shardline::server {
namespace {

using grpc::StatusCode;
using testing::CoordinatorServiceTest;

// The hostile-client probes: a 1 MB job name, 1 MB ids (their errors echoed
// the whole input and came back RESOURCE_EXHAUSTED), a huge worker
// description, a report with no worker id and absurd numbers. Each gets a
// short INVALID_ARGUMENT, and the coordinator serves on.
TEST_F(CoordinatorServiceTest, OversizedAndForgedRequestsGetShortClearErrors) {
  const std::string mb(1 << 20, 'j');
  grpc::ClientContext c1;
  shardline::v1::GetJobRequest get;
  get.set_job_id(mb);
  shardline::v1::JobStatus status;
  grpc::Status got = admin_stub_->GetJob(&c1, get, &status);
  EXPECT_EQ(got.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(got.error_message().size(), 100u) << got.error_message().substr(0, 200);

  auto spec = Spec();
  spec.set_name(mb);
  grpc::Status submitted;
  Submit(spec, &submitted);
  EXPECT_EQ(submitted.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(submitted.error_message().size(), 100u);

  grpc::ClientContext c2;
  shardline::v1::RegisterRequest request;
  request.set_name("w9");
  request.mutable_capabilities()->set_listen_address("127.0.0.1:1");
  request.mutable_capabilities()->set_gemm_flops(1e9);
  request.mutable_capabilities()->set_memory_bytes(int64_t{1} << 30);
  request.mutable_capabilities()->set_description(std::string(2 << 20, 'd'));
  shardline::v1::RegisterResponse registered;
  got = worker_stub_->Register(&c2, request, &registered);
  EXPECT_EQ(got.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(got.error_message().find("capabilities.description"), std::string::npos) << got.error_message();

  std::string worker;
  ASSERT_TRUE(Register("w0", &worker).ok());
  const shardline::v1::JobStatus job = Submit(Spec(), &submitted);
  ASSERT_TRUE(submitted.ok());
  shardline::v1::ReportStepRequest report;
  report.set_job_id(job.job_id());
  report.set_plan_epoch(job.plan_epoch());
  report.set_step(1);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::INVALID_ARGUMENT) << "no worker id";
  report.set_worker_id(worker);
  report.set_step_seconds(-5e300);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::INVALID_ARGUMENT) << "negative seconds";
  report.set_step_seconds(0.1);
  report.set_tokens(-1);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::INVALID_ARGUMENT) << "negative tokens";
  report.set_tokens(24);
  report.set_eval_windows(10);
  report.set_eval_matches(11);
  grpc::Status more_right = ReportStep(report);
  EXPECT_EQ(more_right.error_code(), StatusCode::INVALID_ARGUMENT) << "more problems right than asked";
  EXPECT_NE(more_right.error_message().find("eval_matches"), std::string::npos) << more_right.error_message();
  report.set_eval_matches(-1);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::INVALID_ARGUMENT) << "negative matches";
  report.clear_eval_matches();
  EXPECT_TRUE(ReportStep(report).ok());
  EXPECT_TRUE(StillServing());
}

// Watchers of one job are bounded; a stream that went away frees its place.
TEST_F(CoordinatorServiceTest, AJobTakesABoundedNumberOfWatchers) {
  ASSERT_TRUE(Register("w0").ok());
  grpc::Status submitted;
  const shardline::v1::JobStatus job = Submit(Spec(), &submitted);
  ASSERT_TRUE(submitted.ok());
  shardline::v1::GetJobRequest request;
  request.set_job_id(job.job_id());
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<shardline::v1::JobStatus>>> watches;
  shardline::v1::JobStatus status;
  for (size_t i = 0; i < RunningJob::kMaxWatchers; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    watches.push_back(admin_stub_->WatchJob(contexts.back().get(), request));
    ASSERT_TRUE(watches.back()->Read(&status)) << "watcher " << i;
  }
  grpc::ClientContext extra;
  auto refused = admin_stub_->WatchJob(&extra, request);
  while (refused->Read(&status)) {
  }
  EXPECT_EQ(refused->Finish().error_code(), StatusCode::RESOURCE_EXHAUSTED);
  contexts[0]->TryCancel();
  (void)watches[0]->Finish();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  bool admitted = false;
  while (!admitted && absl::Now() < give_up) {
    grpc::ClientContext again;
    auto watch = admin_stub_->WatchJob(&again, request);
    admitted = watch->Read(&status);
    again.TryCancel();
    (void)watch->Finish();
    if (!admitted) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(admitted) << "a cancelled watcher's place is free again";
  for (auto& c : contexts) c->TryCancel();
  for (size_t i = 1; i < watches.size(); ++i) (void)watches[i]->Finish();
}

// With worker names bound to certificates (--tls_worker_names), a
// registration without one is refused before anything is kept, naming why;
// the coordinator serves on (client_tls_test registers with certificates).
TEST_F(CoordinatorServiceTest, ANameBoundToCertificatesIsRefusedToACallerWithoutOne) {
  coordinator_->set_bind_worker_names(true);
  const grpc::Status refused = Register("w0");
  EXPECT_EQ(refused.error_code(), StatusCode::PERMISSION_DENIED);
  EXPECT_NE(refused.error_message().find("no client certificate"), std::string::npos) << refused.error_message();
  EXPECT_TRUE(registry_->List().empty());
  coordinator_->set_bind_worker_names(false);
  EXPECT_TRUE(Register("w0").ok());
  EXPECT_EQ(registry_->List().size(), 1u);
}

// The hostile-client probe: ReportStep with an empty worker_id was accepted
// for every stage, and forged shards committed. A worker's calls must carry
// its registration's secret, and only a position's own worker may report it.
TEST_F(CoordinatorServiceTest, ReportsAndShardsComeOnlyFromThePositionsWorkerWithItsSecret) {
  std::string holder, other;
  ASSERT_TRUE(Register("w0", &holder).ok());
  grpc::Status submitted;
  const shardline::v1::JobStatus job = Submit(Spec(), &submitted);
  ASSERT_TRUE(submitted.ok());
  ASSERT_TRUE(Register("w1", &other).ok());  // idle: holds no position
  shardline::v1::ReportStepRequest report;
  report.set_job_id(job.job_id());
  report.set_plan_epoch(job.plan_epoch());
  report.set_worker_id(holder);
  report.set_step(1);
  report.set_tokens(24);

  grpc::ClientContext unsigned_call;
  shardline::v1::ReportStepResponse response;
  EXPECT_EQ(worker_stub_->ReportStep(&unsigned_call, report, &response).error_code(), StatusCode::UNAUTHENTICATED)
      << "no secret";
  grpc::ClientContext signed_by_other;
  Sign(signed_by_other, other);
  EXPECT_EQ(worker_stub_->ReportStep(&signed_by_other, report, &response).error_code(), StatusCode::UNAUTHENTICATED)
      << "another worker's secret";
  report.set_worker_id(other);
  EXPECT_EQ(ReportStep(report).error_code(), StatusCode::FAILED_PRECONDITION) << "its own secret, not its position";

  const std::string file = ShardFile(4);
  std::vector<shardline::v1::ShardChunk> chunks = Chunks(job, file, 0, static_cast<int64_t>(file.size()));
  chunks[0].mutable_header()->set_worker_id(other);
  EXPECT_EQ(ReportShard(chunks).error_code(), StatusCode::FAILED_PRECONDITION) << "a shard of a position it lacks";
  chunks[0].mutable_header()->set_worker_id(holder);
  grpc::ClientContext forged;
  Sign(forged, other);
  shardline::v1::ReportShardResponse stored;
  auto writer = worker_stub_->ReportShard(&forged, &stored);
  for (const auto& c : chunks) writer->Write(c);
  writer->WritesDone();
  EXPECT_EQ(writer->Finish().error_code(), StatusCode::UNAUTHENTICATED) << "the holder's id, another's secret";
  EXPECT_FALSE(stored.stored());

  grpc::ClientContext heartbeat;
  shardline::v1::HeartbeatRequest beat;
  beat.set_worker_id(holder);
  shardline::v1::HeartbeatResponse beat_response;
  EXPECT_EQ(worker_stub_->Heartbeat(&heartbeat, beat, &beat_response).error_code(), StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(StillServing());
}

// Links: a worker is handed probe targets only while idle, one link at a
// time and one probe a host (these workers share 127.0.0.1); a report
// names the worker's next; a report of links needs its secret and sane
// figures, and names the sender by its registration, not by anything in
// the request.
TEST_F(CoordinatorServiceTest, LinkProbesGoToOneIdleWorkerAndReportsNeedItsSecret) {
  std::string w0, w1, w2;
  ASSERT_TRUE(Register("w0", &w0).ok());
  ASSERT_TRUE(Register("w1", &w1).ok());
  ASSERT_TRUE(Register("w2", &w2).ok());
  const shardline::v1::HeartbeatResponse first = Beat(w0);
  ASSERT_EQ(first.probe_targets_size(), 1);
  EXPECT_EQ(first.probe_targets(0).worker(), "w1");
  EXPECT_EQ(first.probe_targets(0).address(), "127.0.0.1:1") << "w1's StageLink address (the fixture's)";
  EXPECT_EQ(Beat(w1).probe_targets_size(), 0) << "w0 is probing: its host is busy";
  EXPECT_EQ(Beat(w0).probe_targets_size(), 0) << "one link at a time";

  shardline::v1::ReportLinksRequest report;
  report.set_worker_id(w0);
  shardline::v1::LinkMeasurement* m = report.add_links();
  m->set_to_worker("w1");
  m->set_bytes_per_second(1.25e9);
  m->set_rtt_seconds(1e-4);
  shardline::v1::ReportLinksResponse response;
  grpc::ClientContext unsigned_call;
  EXPECT_EQ(worker_stub_->ReportLinks(&unsigned_call, report, &response).error_code(), StatusCode::UNAUTHENTICATED);
  grpc::ClientContext signed_by_other;
  Sign(signed_by_other, w1);
  EXPECT_EQ(worker_stub_->ReportLinks(&signed_by_other, report, &response).error_code(), StatusCode::UNAUTHENTICATED);
  m->set_bytes_per_second(-1);
  grpc::ClientContext absurd;
  Sign(absurd, w0);
  EXPECT_EQ(worker_stub_->ReportLinks(&absurd, report, &response).error_code(), StatusCode::INVALID_ARGUMENT);
  m->set_bytes_per_second(1.25e9);
  grpc::ClientContext good;
  Sign(good, w0);
  ASSERT_TRUE(worker_stub_->ReportLinks(&good, report, &response).ok());
  ASSERT_EQ(response.probe_targets_size(), 1) << "the answer names w0's next";
  EXPECT_EQ(response.probe_targets(0).worker(), "w2");

  grpc::ClientContext list_context;
  shardline::v1::ListLinksResponse links;
  ASSERT_TRUE(admin_stub_->ListLinks(&list_context, shardline::v1::ListLinksRequest(), &links).ok());
  ASSERT_EQ(links.links_size(), 1);
  EXPECT_EQ(links.links(0).from_worker(), "w0");
  EXPECT_EQ(links.links(0).bytes_per_second(), 1.25e9);
  EXPECT_EQ(links.pending_probes(), 5);
  EXPECT_EQ(links.probing(), 1) << "w0 to w2";

  m->set_to_worker("w2");
  grpc::ClientContext second;
  Sign(second, w0);
  ASSERT_TRUE(worker_stub_->ReportLinks(&second, report, &response).ok());
  EXPECT_EQ(response.probe_targets_size(), 0) << "w0 measured all of its links";
  EXPECT_EQ(Beat(w1).probe_targets_size(), 1) << "w0 reported: now w1's turn";
  EXPECT_TRUE(StillServing());
}

// Rates that recover: an idle worker whose jobs' reports said it was much
// slower than its probe is asked (once, never beside a link probe on its
// host) to measure its GEMM rate again; the rate comes with a heartbeat
// signed by it, absurd figures are refused, and a fast one sets those
// reports aside.
TEST_F(CoordinatorServiceTest, AnIdleWorkerSlowerThanItsProbeIsAskedToMeasureAgain) {
  std::string w0, w1, w2, w3;
  ASSERT_TRUE(Register("w0", &w0).ok());
  ASSERT_TRUE(Register("w1", &w1).ok());
  ASSERT_TRUE(Register("w3", &w3).ok());
  {  // w2 alone on another host
    grpc::ClientContext context;
    shardline::v1::RegisterRequest request;
    request.set_name("w2");
    request.mutable_capabilities()->set_listen_address("127.0.0.2:1");
    request.mutable_capabilities()->set_gemm_flops(1e9);
    request.mutable_capabilities()->set_memory_bytes(int64_t{1} << 30);
    shardline::v1::RegisterResponse response;
    ASSERT_TRUE(worker_stub_->Register(&context, request, &response).ok());
    w2 = response.worker_id();
    secrets_[w2] = response.worker_secret();
  }
  for (int i = 0; i < 5; ++i) {
    registry_->NoteAchievedRate(w0, 5e8);
    registry_->NoteAchievedRate(w3, 5e8);
    registry_->NoteAchievedRate(w1, 1e8);  // their machines were busy
    registry_->NoteAchievedRate(w2, 1e8);
  }
  auto beat = [&](const std::string& id, double gemm_flops = 0, double spread = 0) {
    grpc::ClientContext context;
    Sign(context, id);
    shardline::v1::HeartbeatRequest request;
    request.set_worker_id(id);
    if (gemm_flops != 0) {
      request.mutable_compute()->set_gemm_flops(gemm_flops);
      request.mutable_compute()->set_gemm_flops_spread(spread);
    }
    shardline::v1::HeartbeatResponse response;
    const grpc::Status status = worker_stub_->Heartbeat(&context, request, &response);
    return std::make_pair(status.error_code(), response);
  };
  // Every link measured; then w0 and w1's again: a probe inside host 127.0.0.1.
  MeasureAll({"w0", "w1", "w2", "w3"}, 1.25e9);
  ASSERT_EQ(jobs_->links().Request({"w0", "w1"}), 2);
  const auto probing = beat(w0).second;
  ASSERT_EQ(probing.probe_targets_size(), 1) << "w0 probes a link";
  EXPECT_EQ(probing.probe_targets(0).worker(), "w1") << "on its own host";
  EXPECT_FALSE(probing.measure_compute());
  EXPECT_FALSE(beat(w2).second.measure_compute()) << "not idle long enough";
  skew_seconds_ += absl::ToInt64Seconds(kComputeProbeIdle);
  EXPECT_FALSE(beat(w3).second.measure_compute()) << "as fast as its probe says";
  const auto beside = beat(w1).second;
  EXPECT_EQ(beside.probe_targets_size(), 0);
  EXPECT_FALSE(beside.measure_compute()) << "its host is in w0's probe";
  const auto asked = beat(w2).second;
  EXPECT_EQ(asked.probe_targets_size(), 0) << "its links are measured";
  EXPECT_TRUE(asked.measure_compute()) << "its host is in no probe";
  EXPECT_FALSE(beat(w2).second.measure_compute()) << "asked once a wait";

  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [flops, spread] : std::vector<std::pair<double, double>>{{-1, 0}, {nan, 0}, {1e30, 0}, {1e9, 11}}) {
    EXPECT_EQ(beat(w2, flops, spread).first, StatusCode::INVALID_ARGUMENT) << flops << " ± " << spread;
  }
  grpc::ClientContext forged;
  Sign(forged, w1);
  shardline::v1::HeartbeatRequest as_w2;
  as_w2.set_worker_id(w2);
  as_w2.mutable_compute()->set_gemm_flops(1e9);
  shardline::v1::HeartbeatResponse response;
  EXPECT_EQ(worker_stub_->Heartbeat(&forged, as_w2, &response).error_code(), StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(registry_->Get(w2)->achieved_reports, 5) << "nothing refused changed its rate";

  EXPECT_EQ(beat(w2, 1e9, 0.05).first, StatusCode::OK);
  EXPECT_EQ(registry_->Get(w2)->achieved_reports, 0) << "as fast as it registered: its reports set aside";
  EXPECT_TRUE(StillServing());
}

}  // namespace
}  // namespace shardline::server
