// shardctl, the real binary, against a real coordinator and two workers (all
// separate processes on loopback): every command, in both output formats,
// with what it prints on stdout and stderr and each exit code (0 ok, 1
// failed, 2 cannot reach the coordinator, 3 invalid input); and
// --advertise_host, the address neighbours dial. (Traces, get workers -w,
// completion and health: shardctl_observe_test.)
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/child_process.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "shardline/v1/admin.pb.h"
#include "tests/client/process_cluster.h"
#include "tests/client/shardctl_fixture.h"
#include "tests/client/process_test_util.h"

namespace shardline::client {
namespace {

using namespace testing::shardctl;  // the fixture, spec and exit descriptions
using testing::CtlRun;
using testing::kBin;
using testing::RunToEnd;
using testing::TempDir;

TEST_F(ShardctlTest, GetWorkersShowsEveryWorkerAtItsAdvertisedAddress) {
  const CtlRun table = cluster().Ctl({"get", "workers"});
  ASSERT_EQ(table.ended, kOk) << table.err;
  EXPECT_EQ(table.err, "");
  const auto lines = table.lines();
  ASSERT_EQ(lines.size(), 3u) << table.out;
  EXPECT_TRUE(absl::StartsWith(lines[0], "NAME")) << lines[0];
  for (const std::string& port : cluster().worker_ports()) {
    EXPECT_NE(table.out.find("localhost:" + port), std::string::npos) << table.out;
  }
  const CtlRun json = cluster().Ctl({"-o", "json", "get", "workers"});
  ASSERT_EQ(json.ended, kOk) << json.err;
  const auto workers = FromJson<shardline::v1::ListWorkersResponse>(json.out);
  ASSERT_EQ(workers.workers_size(), 2);
  std::set<std::string> names, addresses;
  for (const auto& w : workers.workers()) {
    names.insert(w.name());
    addresses.insert(w.listen_address());
    EXPECT_EQ(w.state(), "idle") << w.name();
    EXPECT_EQ(w.device(), "cpu") << w.name();
    EXPECT_GT(w.gemm_flops(), 0) << w.name();
    // Measured by repeated probes: how much they disagreed, a relative range.
    EXPECT_GE(w.gemm_flops_spread(), 0) << w.name();
    EXPECT_LE(w.gemm_flops_spread(), 10) << w.name();
    EXPECT_TRUE(absl::StartsWith(w.worker_id(), "worker-")) << w.worker_id();
    // The table row of this worker.
    EXPECT_NE(table.out.find(w.worker_id()), std::string::npos) << table.out;
  }
  EXPECT_EQ(names, (std::set<std::string>{"w0", "w1"}));
  EXPECT_EQ(addresses, (std::set<std::string>{"localhost:" + cluster().worker_ports()[0],
                                              "localhost:" + cluster().worker_ports()[1]}));
}

TEST_F(ShardctlTest, PlanShowsTheCutAndPredictedStepWithoutRunningIt) {
  const std::string spec = Spec(kSteps);
  // The workers measure their links once they join; plans made while they
  // do may differ (the links' figures change), so plan after.
  for (int i = 0; i < 200; ++i) {
    const auto links = FromJson<shardline::v1::ListLinksResponse>(cluster().Ctl({"-o", "json", "get", "links"}).out);
    if (links.links_size() == 2 && links.pending_probes() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const CtlRun jobs_before = cluster().Ctl({"-o", "json", "get", "jobs"});
  ASSERT_EQ(jobs_before.ended, kOk) << jobs_before.err;
  const CtlRun table = cluster().Ctl({"plan", spec});
  ASSERT_EQ(table.ended, kOk) << table.err;
  const auto lines = table.lines();
  ASSERT_EQ(lines.size(), 4u) << table.out;  // header, two stages, the prediction
  EXPECT_TRUE(absl::StartsWith(lines[0], "STAGE")) << lines[0];
  EXPECT_TRUE(absl::StartsWith(lines[1], "0 ")) << lines[1];
  EXPECT_TRUE(absl::StartsWith(lines[2], "1 ")) << lines[2];
  EXPECT_TRUE(absl::StartsWith(lines[3], "predicted step: ")) << lines[3];

  const CtlRun json = cluster().Ctl({"-o", "json", "plan", spec});
  ASSERT_EQ(json.ended, kOk) << json.err;
  const auto plan = FromJson<shardline::v1::PlanResponse>(json.out);
  ASSERT_EQ(plan.stages_size(), 2);
  // The 3 blocks plus the embedding and the head: 5 units, cut in two
  // contiguous ranges, each on its own worker.
  EXPECT_EQ(plan.stages(0).unit_begin(), 0);
  EXPECT_EQ(plan.stages(0).unit_end(), plan.stages(1).unit_begin());
  EXPECT_EQ(plan.stages(1).unit_end(), 5);
  EXPECT_LT(plan.stages(0).unit_begin(), plan.stages(0).unit_end());
  EXPECT_LT(plan.stages(1).unit_begin(), plan.stages(1).unit_end());
  EXPECT_NE(plan.stages(0).worker(), plan.stages(1).worker());
  for (const auto& s : plan.stages()) {
    EXPECT_GT(s.seconds_per_micro_batch(), 0) << s.stage();
    EXPECT_GT(s.memory_bytes(), 0) << s.stage();
    EXPECT_NE(lines[1 + s.stage()].find(s.worker()), std::string::npos) << lines[1 + s.stage()];
    EXPECT_NE(lines[1 + s.stage()].find(absl::StrCat("[", s.unit_begin(), ", ", s.unit_end(), ")")),
              std::string::npos)
        << lines[1 + s.stage()];
  }
  EXPECT_DOUBLE_EQ(plan.bubble_fraction(), 1.0 / 5);  // (p − 1) / (m + p − 1), p = 2, m = 4
  EXPECT_GT(plan.predicted_step_seconds(), 0);
  EXPECT_NE(lines[3].find("pipeline bubble 20%"), std::string::npos) << lines[3];
  // The prediction's parts: every position's compute (and, before the
  // last stage, its hop), the slot and what sets the pace.
  EXPECT_GT(plan.slot_seconds(), 0);
  // One micro-batch through both stages and the hop and back, then the
  // other m − 1 = 3 a slot apart; no all-reduce.
  const double fill = plan.stages(0).compute_seconds() + plan.stages(1).compute_seconds() +
                      2 * plan.stages(0).hop_seconds();
  EXPECT_NEAR(plan.fill_seconds(), fill, 1e-12);
  EXPECT_NEAR(plan.predicted_step_seconds(), 3 * plan.slot_seconds() + fill + plan.optimizer_seconds(), 1e-12)
      << "(m − 1) · slot + fill + optimizer, no all-reduce";
  EXPECT_FALSE(plan.critical_path().empty());
  for (const auto& s : plan.stages()) {
    EXPECT_GT(s.compute_seconds(), 0) << s.stage();
    EXPECT_EQ(s.hop_seconds() > 0, s.stage() == 0) << s.stage();
    EXPECT_LE(s.compute_seconds(), plan.slot_seconds()) << s.stage();
  }
  const CtlRun explained = cluster().Ctl({"plan", "--explain", spec});
  ASSERT_EQ(explained.ended, kOk) << explained.err;
  const auto explain = explained.lines();
  ASSERT_EQ(explain.size(), 9u) << explained.out;  // header, two positions, 3 of legend, slot, step, path
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(explain[0], ' ', absl::SkipEmpty())),
            (std::vector<std::string>{"STAGE", "REPLICA", "TENSOR", "WORKER", "UNITS", "COMPUTE", "MS", "TENSOR", "MS",
                                      "HOP", "MS", "WIRE", "ALL-REDUCE", "MS/STEP", "REDUCE", "WIRE", "MEMORY"}))
      << explain[0];
  EXPECT_TRUE(absl::StartsWith(explain[6], "slot: ")) << explain[6];
  EXPECT_EQ(explain[8], "critical path: " + plan.critical_path());
  // Planning ran nothing.
  const CtlRun jobs_after = cluster().Ctl({"-o", "json", "get", "jobs"});
  EXPECT_EQ(FromJson<shardline::v1::ListJobsResponse>(jobs_after.out).jobs_size(),
            FromJson<shardline::v1::ListJobsResponse>(jobs_before.out).jobs_size());
}

TEST_F(ShardctlTest, ASubmittedJobIsWatchedDescribedListedAndExported) {
  const std::string spec = Spec(kSteps);
  const CtlRun submitted = cluster().Ctl({"-o", "json", "submit", spec});
  ASSERT_EQ(submitted.ended, kOk) << submitted.err;
  const auto job = FromJson<shardline::v1::JobStatus>(submitted.out);
  ASSERT_TRUE(absl::StartsWith(job.job_id(), "job-")) << submitted.out;
  EXPECT_EQ(job.name(), "ctl");
  EXPECT_EQ(job.total_steps(), kSteps);

  // watch: one progress line per status (stdout is not a terminal), steps
  // that never go back, the last one SUCCEEDED at the last step; exit 0.
  const CtlRun watched = cluster().Ctl({"watch", job.job_id()});
  ASSERT_EQ(watched.ended, kOk) << watched.out << watched.err;
  const auto lines = watched.lines();
  ASSERT_FALSE(lines.empty());
  int64_t previous = 0;
  for (const std::string& line : lines) {
    ASSERT_TRUE(absl::StartsWith(line, job.job_id() + " ")) << line;
    const std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    ASSERT_GE(words.size(), 4u) << line;
    const std::vector<std::string> progress = absl::StrSplit(words[3], '/');
    int64_t step = 0, total = 0;
    ASSERT_TRUE(progress.size() == 2 && absl::SimpleAtoi(progress[0], &step) && absl::SimpleAtoi(progress[1], &total))
        << line;
    EXPECT_EQ(total, kSteps) << line;
    EXPECT_GE(step, previous) << line;
    previous = step;
  }
  EXPECT_TRUE(absl::StartsWith(lines.back(), absl::StrCat(job.job_id(), " SUCCEEDED [####################] ",
                                                          kSteps, "/", kSteps)))
      << lines.back();

  // watch -o json on the finished job: its status, as JSON lines; exit 0.
  const CtlRun watched_json = cluster().Ctl({"-o", "json", "watch", job.job_id()});
  ASSERT_EQ(watched_json.ended, kOk) << watched_json.err;
  ASSERT_FALSE(watched_json.lines().empty());
  EXPECT_EQ(FromJson<shardline::v1::JobStatus>(watched_json.lines().back()).state(), shardline::v1::SUCCEEDED);

  const CtlRun described = cluster().Ctl({"describe", "job", job.job_id()});
  ASSERT_EQ(described.ended, kOk) << described.err;
  EXPECT_NE(described.out.find("State:      SUCCEEDED\n"), std::string::npos) << described.out;
  EXPECT_NE(described.out.find(absl::StrCat("Step:       ", kSteps, "/", kSteps, "\n")), std::string::npos)
      << described.out;
  EXPECT_NE(described.out.find(absl::StrCat("Committed:  step ", kSteps, " (")), std::string::npos) << described.out;
  EXPECT_NE(described.out.find("Stages:\nSTAGE"), std::string::npos) << described.out;
  // The last step as measured beside the plan's prediction.
  EXPECT_NE(described.out.find("Step time:  "), std::string::npos) << described.out;
  EXPECT_NE(described.out.find("(measured "), std::string::npos) << described.out;
  EXPECT_NE(described.out.find("Paced by:   "), std::string::npos) << described.out;
  const CtlRun described_json = cluster().Ctl({"-o", "json", "describe", "job", job.job_id()});
  ASSERT_EQ(described_json.ended, kOk) << described_json.err;
  const auto status = FromJson<shardline::v1::JobStatus>(described_json.out);
  EXPECT_EQ(status.state(), shardline::v1::SUCCEEDED);
  EXPECT_EQ(status.step(), kSteps);
  EXPECT_EQ(status.committed_step(), kSteps);
  EXPECT_GT(status.checkpoint_bytes(), 0) << "the committed version's files";
  ASSERT_EQ(status.stages_size(), 2);
  EXPECT_GT(status.step_seconds(), 0);
  EXPECT_GT(status.predicted_step_seconds(), 0);
  for (const auto& stage : status.stages()) {
    EXPECT_NE(described.out.find("\n" + absl::StrCat(stage.stage()) + "      " + stage.worker()), std::string::npos)
        << described.out;
  }

  const CtlRun listed = cluster().Ctl({"get", "jobs"});
  ASSERT_EQ(listed.ended, kOk) << listed.err;
  bool row = false;
  for (const std::string& line : listed.lines()) {
    row |= absl::StartsWith(line, job.job_id() + " ") && absl::StrContains(line, " ctl ") &&
           absl::StrContains(line, absl::StrCat(" SUCCEEDED  ", kSteps, "/", kSteps, " "));
  }
  EXPECT_TRUE(row) << listed.out;
  const CtlRun listed_json = cluster().Ctl({"-o", "json", "get", "jobs"});
  bool found = false;
  const auto jobs = FromJson<shardline::v1::ListJobsResponse>(listed_json.out);
  for (const auto& j : jobs.jobs()) {
    if (j.job_id() != job.job_id()) continue;
    found = j.state() == shardline::v1::SUCCEEDED;
    // Submitted, started and ended in that order, by the coordinator's clock (this machine's).
    EXPECT_GT(j.submitted_at(), 0) << listed_json.out;
    EXPECT_LE(j.submitted_at(), j.started_at()) << listed_json.out;
    EXPECT_LE(j.started_at(), j.ended_at()) << listed_json.out;
    EXPECT_LE(j.ended_at(), absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch())) << listed_json.out;
  }
  EXPECT_TRUE(found) << listed_json.out;
  EXPECT_TRUE(absl::StrContains(listed.lines().front(), " AGE ")) << listed.out;
  EXPECT_TRUE(absl::StrContains(described.out, "\nEnded:      ")) << described.out;

  // export: the committed weights, exactly what shardline-train makes of the spec.
  const std::string file = cluster().dir() + "/exported.safetensors";
  const CtlRun exported = cluster().Ctl({"export", job.job_id(), "-o", file});
  ASSERT_EQ(exported.ended, kOk) << exported.err;
  EXPECT_EQ(exported.out, absl::StrCat("wrote ", std::filesystem::file_size(file), " bytes to ", file, "\n"));
  ASSERT_EQ(RunToEnd({kBin + "/shardline-train", spec, "--threads=1", "--out=" + cluster().dir() + "/ref.safetensors",
                      "--metrics_out=" + cluster().dir() + "/ref.jsonl"},
                     cluster().dir() + "/train.log", 120),
            kOk);
  auto got = common::ReadSafetensors(file);
  auto want = common::ReadSafetensors(cluster().dir() + "/ref.safetensors");
  ASSERT_TRUE(got.ok() && want.ok()) << got.status() << want.status();
  ASSERT_EQ(got->tensors.size(), want->tensors.size());
  for (const auto& [name, tensor] : want->tensors) {
    ASSERT_EQ(got->tensors.count(name), 1u) << name;
    const common::Tensor& mine = got->tensors.at(name);
    const auto a = mine.values<float>(), b = tensor.values<float>();
    ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << name;
  }
}

TEST_F(ShardctlTest, CancelStopsARunningJobAndWatchThenFails) {
  const CtlRun submitted = cluster().Ctl({"-o", "json", "submit", Spec(100000)});
  ASSERT_EQ(submitted.ended, kOk) << submitted.err;
  const std::string id = FromJson<shardline::v1::JobStatus>(submitted.out).job_id();
  // Under way: some step done.
  for (int i = 0; i < 300; ++i) {
    const CtlRun d = cluster().Ctl({"-o", "json", "describe", "job", id});
    if (FromJson<shardline::v1::JobStatus>(d.out).step() >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // An operator's re-plan: the job stops a little ahead and moves (here
  // onto the same layout: its workers are alike); the status says when.
  const CtlRun replanned = cluster().Ctl({"replan", id});
  ASSERT_EQ(replanned.ended, kOk) << replanned.err;
  EXPECT_NE(replanned.out.find("re-planning after step "), std::string::npos) << replanned.out;
  const CtlRun twice = cluster().Ctl({"replan", id});
  EXPECT_EQ(twice.ended, kFailed) << "one re-plan at a time: " << twice.out << twice.err;
  // A running job cannot be deleted.
  const CtlRun running = cluster().Ctl({"delete", id});
  EXPECT_EQ(running.ended, kFailed) << running.out << running.err;
  EXPECT_NE(running.err.find("cancel it first"), std::string::npos) << running.err;
  const CtlRun cancelled = cluster().Ctl({"cancel", id});
  ASSERT_EQ(cancelled.ended, kOk) << cancelled.err;
  EXPECT_TRUE(absl::StartsWith(cancelled.out, id + " CANCELLED [")) << cancelled.out;
  // A job that did not succeed: watch says so and exits 1.
  const CtlRun watched = cluster().Ctl({"watch", id});
  EXPECT_EQ(watched.ended, kFailed) << watched.out << watched.err;
  ASSERT_FALSE(watched.lines().empty());
  EXPECT_TRUE(absl::StartsWith(watched.lines().back(), id + " CANCELLED [")) << watched.out;
  // Cancelling an ended job fails (exit 1) and says why on stderr.
  const CtlRun again = cluster().Ctl({"cancel", id});
  EXPECT_EQ(again.ended, kFailed) << again.out << again.err;
  EXPECT_EQ(again.out, "");
  EXPECT_TRUE(absl::StartsWith(again.err, "Error: ")) << again.err;
  EXPECT_EQ(cluster().Ctl({"replan", id}).ended, kFailed) << "an ended job does not re-plan";
  // An ended job can be deleted, once: it is gone from the coordinator.
  const CtlRun deleted = cluster().Ctl({"delete", id});
  ASSERT_EQ(deleted.ended, kOk) << deleted.err;
  EXPECT_TRUE(absl::StartsWith(deleted.out, "deleted " + id + " (cancelled; ")) << deleted.out;
  EXPECT_EQ(cluster().Ctl({"describe", "job", id}).ended, kInvalid) << "no such job now";
  EXPECT_EQ(cluster().Ctl({"delete", id}).ended, kInvalid);
  // The workers are free again.
  const CtlRun workers = cluster().Ctl({"-o", "json", "get", "workers"});
  const auto listed = FromJson<shardline::v1::ListWorkersResponse>(workers.out);
  for (const auto& w : listed.workers()) {
    EXPECT_EQ(w.state(), "idle") << w.name();
  }
}

TEST_F(ShardctlTest, BadInputExitsThreeWithTheReasonOnStderr) {
  const std::string bad_spec = cluster().dir() + "/bad.json";
  std::ofstream(bad_spec) << R"({"name": "x", "modle": {}})";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "no command"},
      {{"frobnicate"}, "unknown command"},
      {{"get", "pods"}, "unknown command"},
      {{"-o", "yaml", "get", "jobs"}, "-o must be table or json"},
      {{"describe", "job", "job-999"}, "job-999"},
      {{"watch", "job-999"}, "job-999"},
      {{"export", "job-999", "-o", cluster().dir() + "/none.safetensors"}, "job-999"},
      {{"export", "job-1"}, "export needs -o FILE"},
      {{"plan", cluster().dir() + "/missing.json"}, "missing.json"},
      {{"submit", bad_spec}, "modle"},
  };
  for (const auto& [args, reason] : cases) {
    const CtlRun r = cluster().Ctl(args);
    const std::string what = absl::StrJoin(args, " ");
    EXPECT_EQ(r.ended, kInvalid) << what << ": " << r.err;
    EXPECT_EQ(r.out, "") << what;
    EXPECT_TRUE(absl::StartsWith(r.err, "Error: ")) << what << ": " << r.err;
    EXPECT_NE(r.err.find(reason), std::string::npos) << what << ": " << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(cluster().dir() + "/none.safetensors")) << "nothing written on failure";
}

TEST_F(ShardctlTest, AnUnreachableCoordinatorExitsTwo) {
  // A loopback port that was just free: nothing listens there.
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(s);
  const std::string nowhere = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"get", "workers"}, {"get", "jobs"}, {"describe", "job", "job-1"}}) {
    const CtlRun r = cluster().Ctl(args, nowhere);
    EXPECT_EQ(r.ended, kUnreachable) << absl::StrJoin(args, " ") << ": " << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_TRUE(absl::StartsWith(r.err, "Error: ")) << r.err;
  }
}

// Workers that advertise a host nobody listens on (127.0.0.3, loopback, while
// they listen on 127.0.0.1): their neighbours dial what was advertised, so
// the job fails at the link, and shardctl shows the address and the failure.
TEST(AdvertiseHostTest, NeighboursDialTheAdvertisedHost) {
  auto cluster = Cluster::Start("advertise", {2, "127.0.0.3"});
  ASSERT_NE(cluster, nullptr);
  const CtlRun workers = cluster->Ctl({"-o", "json", "get", "workers"});
  ASSERT_EQ(workers.ended, kOk) << workers.err;
  const auto listed = FromJson<shardline::v1::ListWorkersResponse>(workers.out);
  for (const auto& w : listed.workers()) {
    EXPECT_TRUE(absl::StartsWith(w.listen_address(), "127.0.0.3:")) << w.listen_address();
  }
  const CtlRun submitted = cluster->Ctl({"-o", "json", "submit", WriteSpec(cluster->dir() + "/spec.json", kSteps)});
  ASSERT_EQ(submitted.ended, kOk) << submitted.err;
  const std::string id = FromJson<shardline::v1::JobStatus>(submitted.out).job_id();
  const CtlRun watched = cluster->Ctl({"watch", id});
  EXPECT_EQ(watched.ended, kFailed) << watched.out << watched.err;
  const CtlRun described = cluster->Ctl({"-o", "json", "describe", "job", id});
  const auto status = FromJson<shardline::v1::JobStatus>(described.out);
  EXPECT_EQ(status.state(), shardline::v1::FAILED);
  EXPECT_EQ(status.step(), 0) << "no step can complete without the link";
  EXPECT_NE(status.message().find("no message from the neighbouring stage"), std::string::npos) << status.message();
}

}  // namespace
}  // namespace shardline::client
