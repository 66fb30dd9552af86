// shardctl, the real binary, against a real coordinator and two workers (all
// separate processes on loopback): every command, in both output formats,
// with what it prints on stdout and stderr and each exit code (0 ok, 1
// failed, 2 cannot reach the coordinator, 3 invalid input); the daemons'
// grpc.health.v1 service; and --advertise_host, the address neighbours dial.
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/child_process.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "shardline/v1/admin.pb.h"
#include "tests/client/health_check.h"
#include "tests/client/process_cluster.h"
#include "tests/client/process_test_util.h"

namespace shardline::client {
namespace {

using testing::kBin;
using testing::RunToEnd;
using testing::TempDir;

constexpr int kSteps = 8;

std::string WriteSpec(const std::string& path, int steps) {
  std::ofstream(path) << R"({"name": "ctl",
    "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 32, "n_heads": 2, "n_layers": 3},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": )" << steps << R"(, "global_batch": 8, "micro_batches": 4, "seed": 5,
              "optimizer": {"kind": "adamw", "lr": 0.003, "warmup_steps": 2}},
    "parallel": {"pipeline_stages": 2, "schedule": "1f1b"},
    "checkpoint": {"every_steps": 4}})";
  return path;
}

using testing::CtlRun;
using testing::HealthStatus;
using Cluster = testing::ProcessCluster;

template <typename Message>
Message FromJson(const std::string& json) {
  Message m;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &m);
  EXPECT_TRUE(status.ok()) << status << "\n" << json;
  return m;
}

constexpr char kOk[] = "exited with status 0";
constexpr char kFailed[] = "exited with status 1";
constexpr char kUnreachable[] = "exited with status 2";
constexpr char kInvalid[] = "exited with status 3";

class ShardctlTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = Cluster::Start("shardctl", {2, "localhost"}).release(); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr) << "the cluster did not start"; }
  Cluster& cluster() { return *cluster_; }
  std::string Spec(int steps) { return WriteSpec(absl::StrCat(cluster_->dir(), "/spec", steps, ".json"), steps); }

  static Cluster* cluster_;
};
Cluster* ShardctlTest::cluster_ = nullptr;

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
  EXPECT_NE(described.out.find(absl::StrCat("Committed:  step ", kSteps, "\n")), std::string::npos) << described.out;
  EXPECT_NE(described.out.find("Stages:\nSTAGE"), std::string::npos) << described.out;
  const CtlRun described_json = cluster().Ctl({"-o", "json", "describe", "job", job.job_id()});
  ASSERT_EQ(described_json.ended, kOk) << described_json.err;
  const auto status = FromJson<shardline::v1::JobStatus>(described_json.out);
  EXPECT_EQ(status.state(), shardline::v1::SUCCEEDED);
  EXPECT_EQ(status.step(), kSteps);
  EXPECT_EQ(status.committed_step(), kSteps);
  ASSERT_EQ(status.stages_size(), 2);
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
    found |= j.job_id() == job.job_id() && j.state() == shardline::v1::SUCCEEDED;
  }
  EXPECT_TRUE(found) << listed_json.out;

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

// shardctl trace: Chrome Trace Event JSON that Perfetto opens, checked for
// its schema (every event's fields and types) and nesting (each step's
// spans inside the step's event, one after another, on its position's
// thread), with every micro-batch's forward and backward on each stage.
TEST_F(ShardctlTest, TraceWritesEachPositionsStepsAsNestedChromeTraceEvents) {
  const CtlRun submitted = cluster().Ctl({"-o", "json", "submit", Spec(kSteps)});
  ASSERT_EQ(submitted.ended, kOk) << submitted.err;
  const std::string job = FromJson<shardline::v1::JobStatus>(submitted.out).job_id();
  ASSERT_EQ(cluster().Ctl({"watch", job}).ended, kOk);
  const std::string path = cluster().dir() + "/trace.json";
  const CtlRun traced = cluster().Ctl({"trace", job, "--steps=2:5", "-o", path});
  ASSERT_EQ(traced.ended, kOk) << traced.err;
  const auto trace = FromJson<google::protobuf::Struct>(common::ReadFile(path).value_or(""));
  EXPECT_EQ(trace.fields().at("otherData").struct_value().fields().at("job_id").string_value(), job);
  EXPECT_EQ(trace.fields().at("displayTimeUnit").string_value(), "ms");

  struct Span {
    double ts, dur;
    std::string name, cat;
    int step, micro_batch;
  };
  std::map<int, std::vector<Span>> steps, spans;  // by pid
  std::map<int, std::string> process_names;
  for (const auto& value : trace.fields().at("traceEvents").list_value().values()) {
    const auto& e = value.struct_value().fields();
    const std::string ph = e.at("ph").string_value();
    const int pid = static_cast<int>(e.at("pid").number_value());
    ASSERT_EQ(e.at("tid").number_value(), 1);
    const auto& args = e.at("args").struct_value().fields();
    if (ph == "M") {
      if (e.at("name").string_value() == "process_name") process_names[pid] = args.at("name").string_value();
      continue;
    }
    ASSERT_EQ(ph, "X");
    Span span{e.at("ts").number_value(), e.at("dur").number_value(), e.at("name").string_value(),
              e.at("cat").string_value(), static_cast<int>(args.at("step").number_value()),
              args.count("micro_batch") ? static_cast<int>(args.at("micro_batch").number_value()) : -2};
    ASSERT_GE(span.ts, 0);
    ASSERT_GE(span.dur, 0);
    ASSERT_GE(span.step, 2);
    ASSERT_LE(span.step, 5);
    (span.cat == "step" ? steps : spans)[pid].push_back(span);
  }
  ASSERT_EQ(process_names.size(), 2u);
  EXPECT_TRUE(absl::StartsWith(process_names[1], "stage 0 ")) << process_names[1];
  EXPECT_TRUE(absl::StartsWith(process_names[2], "stage 1 ")) << process_names[2];
  const std::set<std::string> kinds = {"forward", "backward", "receive", "send", "norm", "optimizer", "flush"};
  for (int pid : {1, 2}) {
    ASSERT_EQ(steps[pid].size(), 4u) << "steps 2..5 of position " << pid;
    std::map<std::pair<std::string, int>, int> per_micro_batch;
    double previous_end = 0;
    for (const Span& span : spans[pid]) {
      EXPECT_TRUE(kinds.count(span.cat)) << span.cat;
      const Span& step = steps[pid][static_cast<size_t>(span.step - 2)];
      ASSERT_EQ(step.step, span.step);
      EXPECT_GE(span.ts, step.ts) << span.name;
      EXPECT_LE(span.ts + span.dur, step.ts + step.dur + 1e-6) << span.name;
      EXPECT_GE(span.ts + 1e-6, previous_end) << span.name << " overlaps the span before it";
      previous_end = span.ts + span.dur;
      if (span.cat == "forward" || span.cat == "backward") {
        EXPECT_EQ(span.name, absl::StrCat(span.cat, " ", span.micro_batch));
        ++per_micro_batch[{span.cat, span.micro_batch}];
      }
    }
    for (const std::string pass : {"forward", "backward"}) {
      for (int k = 0; k < 4; ++k) EXPECT_EQ((per_micro_batch[{pass, k}]), 4) << pass << " " << k << " of " << pid;
    }
  }
  // Bad ranges and a missing file are invalid input; an unknown job is too.
  EXPECT_EQ(cluster().Ctl({"trace", job, "--steps=5:2", "-o", path}).ended, kInvalid);
  EXPECT_EQ(cluster().Ctl({"trace", job, "--steps=x", "-o", path}).ended, kInvalid);
  EXPECT_EQ(cluster().Ctl({"trace", job}).ended, kInvalid);
  EXPECT_EQ(cluster().Ctl({"trace", "job-999", "-o", path}).ended, kInvalid);
}

// get workers -w: the table, then a row for each worker that changes (a
// drain and an undrain of w1 here), until --watch_seconds; and the bash
// completion script completing commands, flags and the workers' names.
TEST_F(ShardctlTest, GetWorkersWatchPrintsEachChangeAndCompletionCompletesNames) {
  const std::string out = cluster().dir() + "/watch.out";
  std::string ended;
  std::thread watcher([&] {
    ended = RunToEnd({kBin + "/shardctl", "--coordinator=" + cluster().address(), "get", "workers", "-w",
                      "--watch_seconds=5"},
                     out, 60, cluster().dir() + "/watch.err");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(cluster().Ctl({"drain", "w1"}).ended, kOk);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(cluster().Ctl({"undrain", "w1"}).ended, kOk);
  watcher.join();
  EXPECT_EQ(ended, kOk);
  const std::vector<std::string> lines = absl::StrSplit(common::ReadFile(out).value_or(""), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 5u) << absl::StrJoin(lines, "\n");
  EXPECT_TRUE(absl::StartsWith(lines[0], "NAME ")) << lines[0];
  EXPECT_TRUE(absl::StartsWith(lines[3], "w1 ") && absl::StrContains(lines[3], " drained ")) << lines[3];
  EXPECT_TRUE(absl::StartsWith(lines[4], "w1 ") && absl::StrContains(lines[4], " idle ")) << lines[4];

  const std::string ctl = kBin + "/shardctl --coordinator=" + cluster().address();
  const auto complete = [&](const std::string& words, int cword) {
    const std::string script = absl::StrCat("source <(", ctl, " completion bash) && PATH=", kBin,
                                            ":$PATH && COMP_WORDS=(", words, ") && COMP_CWORD=", cword,
                                            " && _shardctl && echo \"${COMPREPLY[*]}\"");
    const std::string log = cluster().dir() + "/complete.out";
    EXPECT_EQ(RunToEnd({"/bin/bash", "-c", script}, log, 60), kOk);
    return std::string(absl::StripTrailingAsciiWhitespace(common::ReadFile(log).value_or("")));
  };
  EXPECT_EQ(complete("shardctl get ''", 2), "workers jobs");
  EXPECT_EQ(complete("shardctl --coordinator=" + cluster().address() + " drain ''", 3), "w0 w1");
  EXPECT_EQ(complete("shardctl --wat", 1), "--watch --watch_seconds");
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

TEST_F(ShardctlTest, EveryDaemonAnswersTheHealthService) {
  std::vector<std::string> addresses = {cluster().address()};
  for (const std::string& port : cluster().worker_ports()) addresses.push_back("127.0.0.1:" + port);
  for (const std::string& address : addresses) {
    absl::StatusOr<int> serving = HealthStatus(address, "");
    ASSERT_TRUE(serving.ok()) << address << ": " << serving.status();
    EXPECT_EQ(*serving, testing::kServing) << address << " is not SERVING";
    EXPECT_EQ(HealthStatus(address, "no.such.Service").status().code(), absl::StatusCode::kNotFound) << address;
    // shardctl health: what container health checks run.
    const CtlRun r = cluster().Ctl({"health", address});
    EXPECT_EQ(r.ended, kOk) << r.err;
    EXPECT_EQ(r.out, "SERVING\n");
    const CtlRun json = cluster().Ctl({"-o", "json", "health", address, "shardline.v1.WorkerState"});
    if (address != cluster().address()) {
      EXPECT_EQ(json.ended, kOk) << json.err;
      EXPECT_EQ(json.out, "{\"status\": \"SERVING\"}\n");
    }
  }
  // The coordinator by default; a service it does not serve is invalid input.
  EXPECT_EQ(cluster().Ctl({"health"}).out, "SERVING\n");
  const CtlRun unknown = cluster().Ctl({"health", cluster().address(), "no.such.Service"});
  EXPECT_EQ(unknown.ended, kInvalid);
  EXPECT_TRUE(absl::StartsWith(unknown.err, "Error: ")) << unknown.err;
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
