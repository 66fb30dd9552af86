// The hostile-client probes of issue 16 against the real daemons (separate
// processes on loopback): a spec whose sizes overflowed int64, data paths
// outside the worker's root (/etc/shadow), /dev/zero and a FIFO, a data
// file truncated while a job reads it, a 1 MB job
// name and watchers that stop reading. Each gets a clear status, every
// daemon keeps serving, and their resident memory stays bounded (read from
// /proc/PID/status).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/admin_client.h"
#include "common/file_util.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "shardline/v1/admin.grpc.pb.h"
#include "tests/client/process_cluster.h"

namespace shardline::client::testing {
namespace {

constexpr int64_t kCoordinatorRssBoundMiB = 256;
constexpr int64_t kWorkerRssBoundMiB = 768;

// VmRSS of a process in MiB; -1 if it is gone.
int64_t RssMiB(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string key;
  while (status >> key) {
    int64_t kib = 0;
    if (key == "VmRSS:" && status >> kib) return kib / 1024;
  }
  return -1;
}

std::string Spec(const std::string& name, const std::string& data, int steps = 3) {
  return absl::StrCat(R"({"name": ")", name, R"(",
    "model": {"kind": "gpt", "vocab_size": 256, "context": 12, "d_model": 16, "n_heads": 2, "n_layers": 1},
    "data": )", data, R"(,
    "train": {"steps": )", steps, R"(, "global_batch": 4, "micro_batches": 2, "seed": 5,
              "optimizer": {"kind": "adamw", "lr": 0.003}}})");
}

class HostileInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_root_ = new std::string(TempDir("hostile-data"));  // fresh: no FIFO of an earlier run
    std::ofstream(*data_root_ + "/text.txt") << std::string(4096, 'a');
    std::ofstream(*data_root_ + "/ids.bin", std::ios::binary) << std::string(4096, '\1');  // uint16 257s
    std::string small_ids;
    for (int i = 0; i < 2048; ++i) small_ids += {static_cast<char>(i % 200), '\0'};
    std::ofstream(*data_root_ + "/small-ids.bin", std::ios::binary) << small_ids;
    ProcessCluster::Options options;
    options.worker_flags = {"--data_root=" + *data_root_};
    cluster_ = ProcessCluster::Start("hostile", options).release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    delete data_root_;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }

  ProcessCluster& cluster() { return *cluster_; }
  std::string WriteSpec(const std::string& name, const std::string& json) {
    const std::string path = absl::StrCat(cluster().dir(), "/", name, ".json");
    std::ofstream(path) << json;
    return path;
  }
  // Every daemon alive, both workers listed and idle, resident memory bounded.
  void ExpectEveryDaemonServing() {
    EXPECT_EQ(::kill(cluster().coordinator_pid(), 0), 0) << "the coordinator died";
    for (int i = 0; i < 2; ++i) EXPECT_EQ(::kill(cluster().worker_pid(i), 0), 0) << "worker w" << i << " died";
    AdminClient admin(cluster().address());
    absl::StatusOr<shardline::v1::ListWorkersResponse> workers = admin.ListWorkers();
    ASSERT_TRUE(workers.ok()) << workers.status();
    int idle = 0;
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (idle < 2 && absl::Now() < give_up) {
      workers = admin.ListWorkers();
      ASSERT_TRUE(workers.ok()) << workers.status();
      idle = 0;
      for (const auto& w : workers->workers()) idle += w.state() == "idle";
      if (idle < 2) absl::SleepFor(absl::Milliseconds(100));
    }
    EXPECT_EQ(idle, 2) << workers->DebugString();
    const int64_t coordinator = RssMiB(cluster().coordinator_pid());
    EXPECT_LT(coordinator, kCoordinatorRssBoundMiB) << "coordinator RSS";
    for (int i = 0; i < 2; ++i) EXPECT_LT(RssMiB(cluster().worker_pid(i)), kWorkerRssBoundMiB) << "w" << i << " RSS";
    RecordProperty("coordinator_rss_mib", static_cast<int>(coordinator));
  }
  // Submits `json`, waits for the job to end; its final status.
  shardline::v1::JobStatus RunToEnd(const std::string& json) {
    AdminClient admin(cluster().address());
    shardline::v1::JobSpec spec;
    auto parsed = common::ParseJobSpec(json);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    absl::StatusOr<shardline::v1::JobStatus> job = admin.Submit(*parsed);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return {};
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    absl::StatusOr<shardline::v1::JobStatus> now = job;
    while (absl::Now() < give_up) {
      now = admin.Get(job->job_id());
      if (!now.ok()) break;
      const auto state = now->state();
      if (state == shardline::v1::SUCCEEDED || state == shardline::v1::FAILED || state == shardline::v1::CANCELLED) {
        return *now;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "the job did not end within 60 s: " << (now.ok() ? now->DebugString() : now.status().ToString());
    return now.ok() ? *now : shardline::v1::JobStatus();
  }

  static ProcessCluster* cluster_;
  static std::string* data_root_;
};

ProcessCluster* HostileInputTest::cluster_ = nullptr;
std::string* HostileInputTest::data_root_ = nullptr;

// Passed validation, overflowed the planner's int64 memory estimate into a
// plan that "fit" (-8796093022208.0 MiB per stage), and every worker
// aborted with std::bad_alloc.
TEST_F(HostileInputTest, ASpecWhoseSizesOverflowIsRefusedAndNoDaemonFalls) {
  const std::string spec = WriteSpec("huge", R"({"name": "huge",
    "model": {"kind": "gpt", "vocab_size": 1048576, "context": 65536, "d_model": 65536, "n_heads": 1024,
              "n_layers": 1024},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": 10, "global_batch": 1048576, "micro_batches": 1, "seed": 3,
              "optimizer": {"kind": "adamw", "lr": 0.001}}})");
  for (const char* verb : {"plan", "submit"}) {
    const CtlRun run = cluster().Ctl({verb, spec});
    EXPECT_NE(run.ended, "exit 0") << verb;
    EXPECT_NE(run.err.find("tokens per micro-batch"), std::string::npos) << verb << ": " << run.err;
  }
  ExpectEveryDaemonServing();
}

// /etc/shadow was trained on; /dev/zero read to 2.3 GB and truncated; a FIFO
// blocked a worker forever. Each job now fails at once, saying why.
TEST_F(HostileInputTest, DataPathsOutsideTheRootOrNotRegularFilesFailTheJobClearly) {
  ASSERT_EQ(::mkfifo((*data_root_ + "/fifo").c_str(), 0600), 0);
  const std::vector<std::pair<std::string, std::string>> probes = {
      {"/etc/shadow", "outside this worker's --data_root"},
      {"/dev/zero", "outside this worker's --data_root"},
      {*data_root_ + "/fifo", "not a regular file"},
      {"fifo", "not a regular file"},
      {"../../../../../../etc/passwd", "outside this worker's --data_root"}};
  for (const auto& [path, why] : probes) {
    const absl::Time start = absl::Now();
    const shardline::v1::JobStatus job =
        RunToEnd(Spec("data", absl::StrCat(R"({"kind": "text_bytes", "path": ")", path, R"("})")));
    EXPECT_EQ(job.state(), shardline::v1::FAILED) << path;
    EXPECT_NE(job.message().find(why), std::string::npos) << path << ": " << job.message();
    EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << path;
  }
  const shardline::v1::JobStatus good = RunToEnd(Spec("data", R"({"kind": "text_bytes", "path": "text.txt"})"));
  EXPECT_EQ(good.state(), shardline::v1::SUCCEEDED) << good.message();
  // Token ids: the validation file is confined the same way; ids the
  // model's vocabulary (256) cannot hold fail the job.
  const shardline::v1::JobStatus val_outside = RunToEnd(
      Spec("data", R"({"kind": "tokens", "path": "small-ids.bin", "val_path": "../../../../../../etc/passwd"})"));
  EXPECT_EQ(val_outside.state(), shardline::v1::FAILED);
  EXPECT_NE(val_outside.message().find("outside this worker's --data_root"), std::string::npos)
      << val_outside.message();
  const shardline::v1::JobStatus too_large = RunToEnd(Spec("data", R"({"kind": "tokens", "path": "ids.bin"})"));
  EXPECT_EQ(too_large.state(), shardline::v1::FAILED);
  EXPECT_NE(too_large.message().find("needs 258 (its token ids go up to 257)"), std::string::npos)
      << too_large.message();
  const shardline::v1::JobStatus tokens =
      RunToEnd(Spec("data", R"({"kind": "tokens", "path": "small-ids.bin", "val_path": "small-ids.bin"})"));
  EXPECT_EQ(tokens.state(), shardline::v1::SUCCEEDED) << tokens.message();
  ExpectEveryDaemonServing();
}

// A data file truncated in place while a job trained on it killed the
// worker reading it (SIGBUS from its mapping). Now the step that finds it
// short fails the job with what happened, and the worker keeps serving.
TEST_F(HostileInputTest, ADataFileTruncatedWhileAJobReadsItFailsTheJobClearly) {
  const std::string path = *data_root_ + "/cut.txt";
  std::ofstream(path) << std::string(1 << 16, 'b');
  auto spec = common::ParseJobSpec(Spec("cut", R"({"kind": "text_bytes", "path": "cut.txt"})", 1'000'000));
  ASSERT_TRUE(spec.ok()) << spec.status();
  AdminClient admin(cluster().address());
  absl::StatusOr<shardline::v1::JobStatus> job = admin.Submit(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  absl::StatusOr<shardline::v1::JobStatus> now = job;
  while (now.ok() && now->step() < 3 && now->state() != shardline::v1::FAILED && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
    now = admin.Get(job->job_id());
  }
  ASSERT_TRUE(now.ok() && now->step() >= 3) << (now.ok() ? now->DebugString() : now.status().ToString());
  ASSERT_EQ(::truncate(path.c_str(), 16), 0);
  while (now.ok() && now->state() == shardline::v1::RUNNING && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(50));
    now = admin.Get(job->job_id());
  }
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->state(), shardline::v1::FAILED) << now->DebugString();
  EXPECT_NE(now->message().find("'cut.txt' ends before byte"), std::string::npos) << now->message();
  EXPECT_NE(now->message().find("it was truncated or rewritten in place"), std::string::npos) << now->message();
  ExpectEveryDaemonServing();
}

// A 1 MB job name and a few WatchJob streams that stopped reading grew the
// coordinator from 82 MB to 1.49 GB.
TEST_F(HostileInputTest, ALongNameIsRefusedAndWatchersThatStopReadingStayBounded) {
  AdminClient admin(cluster().address());
  auto spec = common::ParseJobSpec(Spec("w", R"({"kind": "addition", "digits": 2})", 400));
  ASSERT_TRUE(spec.ok()) << spec.status();
  shardline::v1::JobSpec named = *spec;
  named.set_name(std::string(1 << 20, 'n'));
  absl::StatusOr<shardline::v1::JobStatus> refused = admin.Submit(named);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(refused.status().message().size(), 200u);

  absl::StatusOr<shardline::v1::JobStatus> job = admin.Submit(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  auto stub = shardline::v1::Admin::NewStub(grpc::CreateChannel(cluster().address(), grpc::InsecureChannelCredentials()));
  shardline::v1::GetJobRequest request;
  request.set_job_id(job->job_id());
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<shardline::v1::JobStatus>>> watchers;
  int refused_watchers = 0;
  for (int i = 0; i < 100; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    watchers.push_back(stub->WatchJob(contexts.back().get(), request));
    shardline::v1::JobStatus first;
    if (!watchers.back()->Read(&first)) ++refused_watchers;  // then it reads no more
  }
  EXPECT_EQ(refused_watchers, 100 - 64) << "a job takes 64 watchers";
  // The job runs its 400 steps meanwhile, each a status for every watcher.
  const absl::Time give_up = absl::Now() + absl::Seconds(120);
  while (absl::Now() < give_up) {
    absl::StatusOr<shardline::v1::JobStatus> now = admin.Get(job->job_id());
    ASSERT_TRUE(now.ok()) << now.status();
    if (now->state() == shardline::v1::SUCCEEDED || now->state() == shardline::v1::FAILED) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  const int64_t with_watchers = RssMiB(cluster().coordinator_pid());
  EXPECT_LT(with_watchers, kCoordinatorRssBoundMiB);
  for (auto& c : contexts) c->TryCancel();
  for (auto& w : watchers) (void)w->Finish();
  ExpectEveryDaemonServing();
}

}  // namespace
}  // namespace shardline::client::testing
