// The real binaries, as separate processes on loopback:
// - shardline-local with 3 workers trains exactly like shardline-train
//   (same loss at every logged step, same weights, same held-out accuracy);
// - a worker killed with SIGKILL mid-run stops the job within the lease and
//   link deadlines, with a message naming the lost worker: no hang (with
//   no standby it waits; recovery_test covers the failover).
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/admin_client.h"
#include "client/child_process.h"
#include "common/file_util.h"
#include "common/job_spec.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/client/local_equivalence.h"
#include "tests/client/process_cluster.h"
#include "tests/client/process_test_util.h"

namespace shardline::client {
namespace {

namespace fs = std::filesystem;
using testing::kBin;
using testing::RunToEnd;
using testing::TempDir;
using testing::WaitForPort;

std::string WriteSpec(const std::string& dir, int steps, int stages, int replicas = 1, bool shard_optimizer = false,
                      int eval_every = 0) {
  const std::string path = dir + "/spec.json";
  std::ofstream(path) << R"({"name": "tiny",
    "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 32, "n_heads": 2, "n_layers": 3},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": )" << steps << R"(, "global_batch": 8, "micro_batches": )" << 4 / replicas
                      << R"(, "seed": 5, "log_every": 1, "eval_examples": 200, "eval_every": )" << eval_every << R"(,
              "optimizer": {"kind": "adamw", "lr": 0.003, "warmup_steps": 2, "grad_clip": 1.0}},
    "parallel": {"pipeline_stages": )" << stages << R"(, "schedule": "1f1b", "data_parallel": )" << replicas
                      << R"(, "shard_optimizer": )" << (shard_optimizer ? "true" : "false") << R"(},
    "checkpoint": {"every_steps": 5}})";
  return path;
}

TEST(EndToEndTest, LocalClusterTrainsExactlyLikeTheReferenceTrainer) {
  const std::string dir = TempDir("equivalence");
  ExpectLocalEqualsTrain(dir, WriteSpec(dir, 12, 3), {"--workers=3"});
}

// Byte-level text on two stages × two replicas, validated every 4 steps
// (train.eval_every): the cluster's validation losses after steps 4 and 8
// (and its final one after 12, shardline-local's last record) are shardline-train's to the last digit;
// the data file, outside the working directory, is the workers' data root.
TEST(EndToEndTest, ALocalClusterValidatesExactlyLikeTheReferenceTrainer) {
  const std::string dir = TempDir("validation");
  {
    std::ofstream corpus(dir + "/corpus.txt");
    for (int i = 0; i < 300; ++i) corpus << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  const std::string spec = dir + "/text.json";
  std::ofstream(spec) << R"({"name": "text",
    "model": {"kind": "gpt", "vocab_size": 256, "context": 16, "d_model": 32, "n_heads": 2, "n_layers": 3},
    "data": {"kind": "text_bytes", "path": ")" << dir << R"(/corpus.txt"},
    "train": {"steps": 12, "global_batch": 8, "micro_batches": 2, "seed": 5, "eval_every": 4, "eval_examples": 20,
              "optimizer": {"kind": "adamw", "lr": 0.003, "warmup_steps": 2}},
    "parallel": {"pipeline_stages": 2, "data_parallel": 2}})";
  // Validation after 4 and 8, steps 10 and 12, the final validation.
  ExpectLocalEqualsTrain(dir, spec, {}, 5);
  const auto records = Lines(dir + "/local/metrics.jsonl");
  EXPECT_EQ(Field(records[0], "step"), "4");
  EXPECT_NE(Field(records[0], "val_loss"), "");
  EXPECT_EQ(Field(records[0], "examples"), "20");
  EXPECT_NE(common::ReadFile(dir + "/local.log").value_or("").find("step 8: validation loss "), std::string::npos);
}

// Two replicas of a two-stage pipeline, four worker processes (the default
// for the spec), gradients summed over gRPC: still shardline-train's bits,
// and so are the cluster's held-out exact matches after steps 3, 6 and 9
// (train.eval_every) and the final one after 12.
TEST(EndToEndTest, LocalGridOfReplicasTrainsExactlyLikeTheReferenceTrainer) {
  const std::string dir = TempDir("grid");
  ExpectLocalEqualsTrain(dir, WriteSpec(dir, 12, 2, /*replicas=*/2, /*shard_optimizer=*/false, /*eval_every=*/3), {},
                         16);
  const std::string log = common::ReadFile(dir + "/local.log").value_or("");
  EXPECT_NE(log.find("on 2 stages × 2 replicas"), std::string::npos);
  EXPECT_NE(log.find("step 9: held-out exact match: "), std::string::npos) << log;
  const auto records = Lines(dir + "/local/metrics.jsonl");
  ASSERT_EQ(records.size(), 16u);
  EXPECT_EQ(Field(records[2], "step"), "3");  // before step 3's record, as shardline-train writes it
  EXPECT_NE(Field(records[2], "accuracy"), "");
  EXPECT_EQ(Field(records[2], "examples"), "200");
}

// One held-out problem on two replicas: replica 1 has no
// validation batch and its stage 0 tells stage 1 so over the gRPC link (an
// activation of no tokens); the records are still shardline-train's.
TEST(EndToEndTest, AReplicaWithoutAValidationBatchSitsThePassOut) {
  const std::string dir = TempDir("empty-share");
  const std::string spec = dir + "/spec.json";
  std::ofstream(spec) << R"({"name": "empty",
    "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 32, "n_heads": 2, "n_layers": 3},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": 4, "global_batch": 8, "micro_batches": 2, "seed": 5, "log_every": 1, "eval_every": 2,
              "eval_examples": 1, "optimizer": {"kind": "adamw", "lr": 0.003}},
    "parallel": {"pipeline_stages": 2, "data_parallel": 2}})";
  // Steps 1-4, validation after 2 and the final one.
  ExpectLocalEqualsTrain(dir, spec, {}, 6);
  EXPECT_EQ(Field(Lines(dir + "/local/metrics.jsonl")[1], "examples"), "1");
}

// The same grid with ZeRO-1: each replica updates its share and the
// replicas gather the weights (and, at the checkpoints every 5 steps, the
// optimizer state, whose digests the coordinator compares): the same bits.
TEST(EndToEndTest, LocalGridWithShardedOptimizerTrainsExactlyLikeTheReferenceTrainer) {
  const std::string dir = TempDir("zero");
  ExpectLocalEqualsTrain(dir, WriteSpec(dir, 12, 2, /*replicas=*/2, /*shard_optimizer=*/true), {});
  EXPECT_NE(common::ReadFile(dir + "/local.log").value_or("").find("2 replicas (optimizer state sharded: ZeRO-1)"),
            std::string::npos);
}

// The held-out exact match a run printed ("held-out exact match: 100.00% of
// 993 problems"), or -1.
double HeldOutAccuracy(const std::string& log) {
  const std::string text = common::ReadFile(log).value_or("");
  const size_t at = text.rfind("held-out exact match: ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + 22));
}

// The default example with each of its 2 stages split over 2 tensor
// ranks (examples/addition-tensor.json, 4 worker processes) learns addition
// as shardline-train does on examples/addition.json (100% of the held-out
// problems; the trainer's own run is left out: it doubled the test's time,
// and the int8 test below holds the same 99%).
TEST(EndToEndTensorParallelTest, ASplitLocalClusterReachesTheTrainersAccuracyOnAddition) {
  const std::string dir = TempDir("addition-tensor");
  const std::string examples = std::string(SHARDLINE_SOURCE_DIR) + "/examples";
  ASSERT_EQ(RunToEnd({kBin + "/shardline-local", examples + "/addition-tensor.json", "--out=" + dir + "/tp.safetensors"},
                     dir + "/local.log", 600),
            "exited with status 0")
      << common::ReadFile(dir + "/local.log").value_or("");
  const std::string log = common::ReadFile(dir + "/local.log").value_or("");
  EXPECT_NE(log.find("on 2 stages × 2 tensor ranks"), std::string::npos) << log;
  EXPECT_GE(HeldOutAccuracy(dir + "/local.log"), 99.0) << log;
  auto weights = common::ReadSafetensors(dir + "/tp.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->tensors.at("blocks.0.attn.qkv.weight").shape(), (std::vector<int64_t>{384, 128}))
      << "the exported weights are whole, in the global layout";
}

// The default example on 2 stages × 2 replicas over gRPC with
// parallel.wire_dtype "int8": every activation and gradient crosses as
// 8-bit blocks, and so does each stage's all-reduce (with error feedback;
// each worker says both), and the held-out exact match still reaches 99%.
TEST(EndToEndInt8Test, AnInt8LinkedLocalClusterStillLearnsAddition) {
  const std::string dir = TempDir("addition-int8");
  auto spec = common::LoadJobSpec(std::string(SHARDLINE_SOURCE_DIR) + "/examples/addition.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->mutable_parallel()->set_wire_dtype("int8");
  spec->mutable_parallel()->set_pipeline_stages(2);
  spec->mutable_parallel()->set_data_parallel(2);
  std::ofstream(dir + "/spec.json") << common::JobSpecToJson(*spec);
  ASSERT_EQ(RunToEnd({kBin + "/shardline-local", dir + "/spec.json", "--out=" + dir + "/int8.safetensors", "--keep_logs"},
                     dir + "/local.log", 600),
            "exited with status 0")
      << common::ReadFile(dir + "/local.log").value_or("");
  const std::string log = common::ReadFile(dir + "/local.log").value_or("");
  const size_t kept = log.rfind("logs kept in ");
  ASSERT_NE(kept, std::string::npos) << log;
  const std::string logs = log.substr(kept + 13, log.find('\n', kept) - kept - 13);
  int linking = 0, reducing = 0;
  for (int w = 0; w < 4; ++w) {
    const std::string worker = common::ReadFile(absl::StrCat(logs, "/worker-", w, ".log")).value_or("");
    if (worker.find("8-bit blocks on the link") != std::string::npos) ++linking;
    if (worker.find("all-reduce over 8-bit blocks with error feedback") != std::string::npos) ++reducing;
  }
  EXPECT_EQ(linking, 4) << "every stage's links carry 8-bit blocks (logs in " << logs << ")";
  EXPECT_EQ(reducing, 4) << "every replica sums over 8-bit blocks (logs in " << logs << ")";
  std::filesystem::remove_all(logs);
  EXPECT_GE(HeldOutAccuracy(dir + "/local.log"), 99.0) << log;
}

// Kills the worker of the last stage of the last replica of a `stages` ×
// `replicas` grid mid-run, with no standby: within the deadlines the job
// stops, naming it (no hang, no failure), and a lease later runs again on
// the survivors, one stage fewer per replica.
void ExpectAKilledWorkerIsNamedAndTheJobReplans(const std::string& name, int stages, int replicas) {
  const std::string dir = TempDir(name + "-spec");
  const std::string spec_path = WriteSpec(dir, 100000, stages, replicas);
  const int n = stages * replicas;
  auto cluster = testing::ProcessCluster::Start(name, {n, "", 20000});
  ASSERT_NE(cluster, nullptr);
  AdminClient admin(cluster->address());
  auto spec = common::LoadJobSpec(spec_path);
  ASSERT_TRUE(spec.ok());
  auto job = admin.Submit(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  // Wait for training to be under way, then kill the last position's worker.
  std::string victim;
  for (int i = 0; i < 1000; ++i) {
    auto status = admin.Get(job->job_id());
    ASSERT_TRUE(status.ok());
    if (status->step() >= 3) {
      ASSERT_EQ(status->stages_size(), n);
      victim = status->stages(n - 1).worker();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(victim.empty());
  const int index = victim.back() - '0';
  ::kill(cluster->worker_pid(index), SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  shardline::v1::JobStatus final_status;
  for (int i = 0; i < 1500; ++i) {
    auto status = admin.Get(job->job_id());
    ASSERT_TRUE(status.ok());
    final_status = *status;
    if (status->state() != shardline::v1::RUNNING) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  // It recovers, naming the lost worker.
  EXPECT_EQ(final_status.state(), shardline::v1::RECOVERING) << final_status.message();
  EXPECT_NE(final_status.message().find("recovering (worker " + victim), std::string::npos) << final_status.message();
  EXPECT_NE(final_status.message().find("lost"), std::string::npos) << final_status.message();
  if (replicas > 1) {
    EXPECT_NE(final_status.message().find(absl::StrCat("of replica ", replicas - 1)), std::string::npos)
        << final_status.message();
  }
  EXPECT_LT(seconds, 10.0) << "lease 1 s: the loss must be noticed well within the deadlines";
  // No standby: within a lease (1 s) more it runs on the survivors.
  shardline::v1::JobStatus replanned;
  for (int i = 0; i < 1000; ++i) {
    auto status = admin.Get(job->job_id());
    ASSERT_TRUE(status.ok());
    replanned = *status;
    if (replanned.state() == shardline::v1::RUNNING && replanned.step() > final_status.step()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(replanned.state(), shardline::v1::RUNNING) << replanned.message();
  EXPECT_GT(replanned.step(), final_status.step());
  EXPECT_EQ(replanned.stages_size(), (stages - 1) * replicas);
  EXPECT_NE(replanned.message().find(absl::StrCat("re-planned onto ", stages - 1, " of the spec's ", stages)),
            std::string::npos)
      << replanned.message();
  for (const auto& stage : replanned.stages()) EXPECT_NE(stage.worker(), victim);
}

TEST(EndToEndTest, AKilledWorkerIsNamedAndTheJobReplansOntoTheSurvivors) {
  ExpectAKilledWorkerIsNamedAndTheJobReplans("kill", 3, 1);
}

// A replica's worker dies: its twins' all-reduce fails at once, the job
// stops naming the lost worker and its place in the grid, and goes on with
// every replica one stage shorter.
TEST(EndToEndTest, AKilledReplicaIsNamedAndTheJobReplansOntoTheSurvivors) {
  ExpectAKilledWorkerIsNamedAndTheJobReplans("kill-grid", 2, 2);
}

// Processes whose command line contains every one of `needles`.
std::string CommandLine(const std::string& pid) {
  std::string cmdline = common::ReadFile("/proc/" + pid + "/cmdline").value_or("");
  std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
  return cmdline;
}

// The processes `parent` started whose command line holds `needle` (other
// tests' clusters may run alongside: only this one's count).
std::vector<std::string> ChildrenOf(pid_t parent, const std::string& needle) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    const std::string status = common::ReadFile(entry.path().string() + "/status").value_or("");
    if (status.find(absl::StrCat("\nPPid:\t", parent, "\n")) == std::string::npos) continue;
    if (CommandLine(pid).find(needle) != std::string::npos) out.push_back(pid);
  }
  return out;
}

// How many of `pids` still run the program they ran (not reaped, not reused).
int StillRunning(const std::vector<std::string>& pids, const std::string& needle) {
  int count = 0;
  for (const std::string& pid : pids) {
    const std::string status = common::ReadFile("/proc/" + pid + "/status").value_or("");
    const bool zombie = status.find("\nState:\tZ") != std::string::npos;
    count += !zombie && CommandLine(pid).find(needle) != std::string::npos;
  }
  return count;
}

TEST(EndToEndTest, DaemonsStopCleanlyOnSigterm) {
  const std::string dir = TempDir("sigterm");
  auto coordinator = ChildProcess::Start({kBin + "/shardline-coordinator", "--listen=127.0.0.1:0",
                                          "--state_dir=" + dir + "/state", "--port_file=" + dir + "/port"},
                                         dir + "/coordinator.log");
  ASSERT_TRUE(coordinator.ok());
  const std::string port = WaitForPort(dir + "/port");
  ASSERT_FALSE(port.empty());
  auto worker = ChildProcess::Start({kBin + "/shardline-worker", "--coordinator=127.0.0.1:" + port, "--name=calm",
                                     "--threads=1", "--port_file=" + dir + "/worker.port"},
                                    dir + "/worker.log");
  ASSERT_TRUE(worker.ok());
  for (int i = 0; i < 500 && !fs::exists(dir + "/worker.port"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto* child : {worker->get(), coordinator->get()}) {
    ::kill(child->pid(), SIGTERM);
    std::string ended;
    for (int i = 0; i < 500 && child->Running(&ended); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(ended, "exited with status 0") << child->name();
  }
}

TEST(EndToEndTest, InterruptingTheLocalClusterCancelsAndCleansUp) {
  const std::string dir = TempDir("interrupt");
  const std::string spec = WriteSpec(dir, 100000, 2);
  auto local = ChildProcess::Start({kBin + "/shardline-local", spec, "--workers=2", "--threads_per_worker=1"},
                                   dir + "/local.log");
  ASSERT_TRUE(local.ok());
  bool running = false;
  for (int i = 0; i < 1500 && !running; ++i) {
    running = common::ReadFile(dir + "/local.log").value_or("").find("RUNNING [") != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(running) << common::ReadFile(dir + "/local.log").value_or("");
  const std::vector<std::string> workers = ChildrenOf((*local)->pid(), "shardline-worker");
  const std::vector<std::string> coordinator = ChildrenOf((*local)->pid(), "shardline-coordinator");
  EXPECT_EQ(workers.size(), 2u);
  EXPECT_EQ(coordinator.size(), 1u);
  ::kill((*local)->pid(), SIGINT);
  std::string ended;
  for (int i = 0; i < 1500 && (*local)->Running(&ended); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(ended, "exited with status 130");
  EXPECT_EQ(StillRunning(workers, "shardline-worker"), 0) << "no daemon left behind";
  EXPECT_EQ(StillRunning(coordinator, "shardline-coordinator"), 0);
}

}  // namespace
}  // namespace shardline::client
