#include "client/local_cluster.h"

#include <signal.h>
#include <stdlib.h>

#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/admin_client.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace shardline::client {
namespace {

namespace fs = std::filesystem;

fs::path BinDir() { return fs::read_symlink("/proc/self/exe").parent_path(); }

}  // namespace

std::string LogTail(const std::string& path) {
  absl::StatusOr<std::string> text = common::ReadFile(path);
  if (!text.ok()) return "";
  return text->size() > 2000 ? text->substr(text->size() - 2000) : *text;
}

LocalCluster::~LocalCluster() {
  workers_.clear();  // stop workers before the coordinator
  coordinator_.reset();
  if (!keep_ && !dir_.empty()) {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
}

absl::Status LocalCluster::Start(int workers, const std::string& device, int threads, int64_t lease_ms) {
  char pattern[] = "/tmp/shardline-local-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) return absl::InternalError("cannot create a temporary directory");
  dir_ = pattern;
  device_ = device;
  threads_ = threads;
  auto coordinator = ChildProcess::Start(
      {(BinDir() / "shardline-coordinator").string(), "--listen=127.0.0.1:0", "--state_dir=" + dir_ + "/state",
       "--port_file=" + dir_ + "/coordinator.port", absl::StrCat("--lease_ms=", lease_ms)},
      dir_ + "/coordinator.log");
  if (!coordinator.ok()) return coordinator.status();
  coordinator_ = std::move(*coordinator);
  int port = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (port == 0) {
    absl::StatusOr<std::string> text = common::ReadFile(dir_ + "/coordinator.port");
    if (text.ok() && absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &port) && port > 0) break;
    std::string ended;
    if (!coordinator_->Running(&ended)) {
      return absl::UnavailableError(absl::StrCat("the coordinator ", ended, ":\n", LogTail(dir_ + "/coordinator.log")));
    }
    if (absl::Now() > deadline) return absl::DeadlineExceededError("the coordinator did not start in 20 s");
    absl::SleepFor(absl::Milliseconds(20));
  }
  address_ = absl::StrCat("127.0.0.1:", port);
  for (int i = 0; i < workers; ++i) RETURN_IF_ERROR(StartWorker());
  return WaitForWorkers(workers_.size());
}

absl::Status LocalCluster::AddWorker() {
  RETURN_IF_ERROR(StartWorker());
  return WaitForWorkers(workers_.size());
}

absl::Status LocalCluster::StartWorker() {
  const int n = static_cast<int>(workers_.size());
  std::vector<std::string> argv = {(BinDir() / "shardline-worker").string(), "--coordinator=" + address_,
                                   absl::StrCat("--name=local-", n), "--listen=127.0.0.1:0", "--device=" + device_,
                                   absl::StrCat("--threads=", threads_)};
  argv.insert(argv.end(), worker_flags_.begin(), worker_flags_.end());
  auto worker = ChildProcess::Start(argv, absl::StrCat(dir_, "/worker-", n, ".log"));
  if (!worker.ok()) return worker.status();
  workers_.push_back(std::move(*worker));
  return absl::OkStatus();
}

absl::Status LocalCluster::WaitForWorkers(size_t count) {
  AdminClient admin(address_);
  const absl::Time deadline = absl::Now() + absl::Seconds(50);
  while (true) {
    absl::StatusOr<shardline::v1::ListWorkersResponse> listed = admin.ListWorkers();
    if (listed.ok() && static_cast<size_t>(listed->workers_size()) >= count) return absl::OkStatus();
    if (absl::Status s = CheckChildren(); !s.ok()) return s;
    if (absl::Now() > deadline) return absl::DeadlineExceededError("the workers did not register in time");
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status LocalCluster::CheckChildren() {
  std::string ended;
  if (!coordinator_->Running(&ended)) return absl::UnavailableError(absl::StrCat("the coordinator ", ended));
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i] != nullptr && !workers_[i]->Running(&ended)) {
      return absl::UnavailableError(absl::StrCat("worker local-", i, " ", ended, ":\n",
                                                 LogTail(absl::StrCat(dir_, "/worker-", i, ".log"))));
    }
  }
  return absl::OkStatus();
}

void LocalCluster::KillWorker(int i) {
  if (i < 0 || i >= static_cast<int>(workers_.size()) || workers_[i] == nullptr) return;
  ::kill(workers_[i]->pid(), SIGKILL);
  workers_[i].reset();  // reaps it
}

}  // namespace shardline::client
