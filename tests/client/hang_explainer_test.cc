// The hang explainer through the real binaries: a worker frozen (SIGSTOP)
// in the middle of a 3-stage run, with a lease and link timeout long enough
// that nothing fails for a while, and `shardctl describe job` says what
// every position waits for and that the frozen one's heartbeats stopped.
#include <signal.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/admin_client.h"
#include "gtest/gtest.h"
#include "tests/client/process_cluster.h"

namespace shardline::client {
namespace {

// The line of `describe`'s "Now:" section about `position` ("stage 1").
std::string NowLine(const std::string& describe, const std::string& position) {
  const size_t now = describe.find("Now:\n");
  if (now == std::string::npos) return "";
  for (absl::string_view line : absl::StrSplit(describe.substr(now), '\n')) {
    if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), position + " (")) return std::string(line);
  }
  return "";
}

TEST(HangExplainerTest, DescribeSaysWhatEachPositionWaitsForAndWhoStoppedTalking) {
  testing::ProcessCluster::Options options;
  options.workers = 3;
  options.lease_ms = 60000;
  options.link_timeout_ms = 60000;
  auto cluster = testing::ProcessCluster::Start("hang", options);
  ASSERT_NE(cluster, nullptr);
  const std::string spec = cluster->dir() + "/spec.json";
  std::ofstream(spec) << R"({"name": "hang",
    "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 32, "n_heads": 2, "n_layers": 3},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": 100000, "global_batch": 8, "micro_batches": 4, "seed": 5,
              "optimizer": {"kind": "adamw", "lr": 0.003}},
    "parallel": {"pipeline_stages": 3, "schedule": "1f1b"}})";
  ASSERT_EQ(cluster->Ctl({"submit", spec}).ended, "exited with status 0");
  AdminClient admin(cluster->address());
  shardline::v1::JobStatus status;
  // Running, and every position has told what it does (heartbeats come
  // once a second).
  auto reported = [&] {
    if (status.step() < 3 || status.stages_size() != 3) return false;
    for (const auto& stage : status.stages()) {
      if (stage.activity().empty()) return false;
    }
    return true;
  };
  for (int i = 0; i < 3000 && !reported(); ++i) {
    status = admin.Get("job-1").value_or(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(reported()) << status.DebugString();
  const std::string frozen = status.stages(2).worker();  // "w<i>"
  const pid_t pid = cluster->worker_pid(std::stoi(frozen.substr(1)));

  ::kill(pid, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(4));  // the others run into it and wait
  const testing::CtlRun describe = cluster->Ctl({"describe", "job", "job-1"});
  ::kill(pid, SIGCONT);
  ASSERT_EQ(describe.ended, "exited with status 0") << describe.err;
  const std::string& out = describe.out;
  const std::string stage0 = NowLine(out, "stage 0"), stage1 = NowLine(out, "stage 1"),
                    stage2 = NowLine(out, "stage 2");
  // The neighbour of the frozen stage waits for it, and the one before waits
  // for that neighbour; each for about as long as the worker has been frozen.
  EXPECT_TRUE(absl::StrContains(stage1, "waits for") || absl::StrContains(stage1, "sends")) << out;
  EXPECT_TRUE(absl::StrContains(stage1, "stage 2")) << out;
  EXPECT_TRUE(absl::StrContains(stage0, "stage 1")) << out;
  EXPECT_TRUE(absl::StrContains(stage0, "since")) << out;
  EXPECT_TRUE(absl::StrContains(stage2, "no heartbeat for")) << out;
  EXPECT_TRUE(absl::StrContains(stage2, "step ")) << "what it did last: " << out;
  EXPECT_FALSE(absl::StrContains(stage1, "no heartbeat")) << out;

  // Thawed, it goes on: nothing was lost.
  const int64_t before = admin.Get("job-1")->step();
  shardline::v1::JobStatus after;
  for (int i = 0; i < 3000 && after.step() <= before; ++i) {
    after = admin.Get("job-1").value_or(after);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(after.step(), before);
  EXPECT_EQ(after.state(), shardline::v1::RUNNING) << after.message();
  EXPECT_EQ(cluster->Ctl({"cancel", "job-1"}).ended, "exited with status 0");
}

}  // namespace
}  // namespace shardline::client
