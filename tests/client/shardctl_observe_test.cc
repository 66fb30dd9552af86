// shardctl watching a cluster, the real binaries on loopback: traces of
// every position's steps, get workers -w, bash completion, and the health
// of every daemon (grpc.health.v1, and shardctl health).
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "google/protobuf/struct.pb.h"
#include "gtest/gtest.h"
#include "shardline/v1/admin.pb.h"
#include "tests/client/health_check.h"
#include "tests/client/shardctl_fixture.h"

namespace shardline::client {
namespace {

using namespace testing::shardctl;  // the fixture, spec and exit descriptions
using testing::CtlRun;
using testing::HealthStatus;
using testing::kBin;
using testing::RunToEnd;

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
  EXPECT_EQ(cluster().Ctl({"undrain", "--at_once", "w1"}).ended, kInvalid) << "--at_once is for drain";
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
  EXPECT_EQ(complete("shardctl get ''", 2), "workers jobs links");
  EXPECT_EQ(complete("shardctl --coordinator=" + cluster().address() + " probe w0 ''", 4), "w0 w1");
  EXPECT_EQ(complete("shardctl --coordinator=" + cluster().address() + " drain ''", 3), "w0 w1");
  EXPECT_EQ(complete("shardctl --wat", 1), "--watch --watch_seconds");
}

// The workers measured the links between them when they joined (the
// coordinator queues both directions for each newcomer); probe measures
// them again and prints them; bad names are refused.
TEST_F(ShardctlTest, GetLinksShowsWhatTheWorkersMeasuredAndProbeMeasuresAgain) {
  shardline::v1::ListLinksResponse links;
  for (int i = 0; i < 200; ++i) {
    const CtlRun json = cluster().Ctl({"-o", "json", "get", "links"});
    ASSERT_EQ(json.ended, kOk) << json.err;
    links = FromJson<shardline::v1::ListLinksResponse>(json.out);
    if (links.links_size() == 2 && links.pending_probes() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(links.links_size(), 2) << links.DebugString();
  std::set<std::pair<std::string, std::string>> directions;
  for (const auto& l : links.links()) {
    directions.insert({l.from_worker(), l.to_worker()});
    EXPECT_EQ(l.error(), "") << l.DebugString();
    EXPECT_GT(l.bytes_per_second(), 1e6) << "loopback: " << l.DebugString();
    EXPECT_GT(l.rtt_seconds(), 0) << l.DebugString();
    EXPECT_FALSE(l.stale());
  }
  EXPECT_EQ(directions, (std::set<std::pair<std::string, std::string>>{{"w0", "w1"}, {"w1", "w0"}}));

  // Probe again: each direction's measurement is newer than the one before.
  const auto measured_at = [&](const shardline::v1::ListLinksResponse& l, int i) {
    return absl::Now() - absl::Seconds(l.links(i).age_seconds());
  };
  std::vector<absl::Time> before = {measured_at(links, 0), measured_at(links, 1)};
  const CtlRun probe = cluster().Ctl({"probe", "w0", "w1"});
  ASSERT_EQ(probe.ended, kOk) << probe.err;
  EXPECT_TRUE(absl::StrContains(probe.err, "2 link directions queued")) << probe.err;
  const auto lines = probe.lines();
  ASSERT_EQ(lines.size(), 3u) << probe.out;
  EXPECT_TRUE(absl::StartsWith(lines[0], "FROM")) << lines[0];
  EXPECT_TRUE(absl::StartsWith(lines[1], "w0 ") && absl::StrContains(lines[1], " w1 ")) << lines[1];
  const CtlRun again = cluster().Ctl({"-o", "json", "get", "links"});
  ASSERT_EQ(again.ended, kOk) << again.err;
  const auto after = FromJson<shardline::v1::ListLinksResponse>(again.out);
  ASSERT_EQ(after.links_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_GT(measured_at(after, i), before[static_cast<size_t>(i)] + absl::Milliseconds(50)) << after.DebugString();
  }
  const CtlRun unknown = cluster().Ctl({"probe", "w0", "nobody"});
  EXPECT_EQ(unknown.ended, kInvalid) << unknown.err;
  EXPECT_TRUE(absl::StrContains(unknown.err, "no live worker named 'nobody'")) << unknown.err;
  EXPECT_EQ(cluster().Ctl({"probe", "w0"}).ended, kFailed) << "one worker makes no link";
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

}  // namespace
}  // namespace shardline::client
