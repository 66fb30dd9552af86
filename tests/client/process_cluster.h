// ProcessCluster: a coordinator and N workers of the real binaries, each a
// process on loopback (lease 1 s by default, free ports learnt through --port_file),
// stopped with SIGTERM when the cluster goes, and shardctl runs against it.
// For the end-to-end tests.
#ifndef SHARDLINE_TESTS_CLIENT_PROCESS_CLUSTER_H_
#define SHARDLINE_TESTS_CLIENT_PROCESS_CLUSTER_H_

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/child_process.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "tests/client/process_test_util.h"

namespace shardline::client::testing {

// One shardctl run: how it ended and what it wrote on stdout and stderr.
struct CtlRun {
  std::string ended;
  std::string out;
  std::string err;
  std::vector<std::string> lines() const { return absl::StrSplit(out, '\n', absl::SkipEmpty()); }
};

// shardctl --coordinator=COORDINATOR ARGS, its output kept in `dir`
// (ctlN.out / ctlN.err, N counting the runs of this process).
inline CtlRun RunShardctl(const std::vector<std::string>& args, const std::string& coordinator,
                          const std::string& dir) {
  static std::atomic<int> runs{0};
  std::vector<std::string> argv = {kBin + "/shardctl", "--coordinator=" + coordinator};
  argv.insert(argv.end(), args.begin(), args.end());
  const int run = runs++;
  const std::string out = absl::StrCat(dir, "/ctl", run, ".out"), err = absl::StrCat(dir, "/ctl", run, ".err");
  CtlRun r;
  r.ended = RunToEnd(argv, out, 120, err);
  r.out = common::ReadFile(out).value_or("");
  r.err = common::ReadFile(err).value_or("");
  return r;
}

class ProcessCluster {
 public:
  struct Options {
    int workers = 2;
    std::string advertise_host;  // empty: the listen host (127.0.0.1)
    int64_t link_timeout_ms = 3000;
    std::vector<std::string> worker_flags;  // more flags for every worker (w<i>: %W is replaced by i)
    std::vector<std::string> coordinator_flags;  // more flags for the coordinator
    int64_t lease_ms = 1000;
  };

  // Workers w0, w1, … listen on 127.0.0.1; each has registered when this
  // returns. Null (with a test failure) if a daemon did not come up.
  static std::unique_ptr<ProcessCluster> Start(const std::string& name, const Options& options) {
    auto c = std::unique_ptr<ProcessCluster>(new ProcessCluster(TempDir(name), options.lease_ms));
    c->coordinator_flags_ = options.coordinator_flags;
    if (!c->StartCoordinator("0")) return nullptr;
    for (int i = 0; i < options.workers; ++i) {
      const std::string port_file = absl::StrCat(c->dir_, "/w", i, ".port");
      std::vector<std::string> argv = {kBin + "/shardline-worker", "--coordinator=" + c->address_,
                                       absl::StrCat("--name=w", i), "--threads=1", "--listen=127.0.0.1:0",
                                       absl::StrCat("--link_timeout_ms=", options.link_timeout_ms),
                                       "--port_file=" + port_file};
      if (!options.advertise_host.empty()) argv.push_back("--advertise_host=" + options.advertise_host);
      for (std::string flag : options.worker_flags) {
        if (const size_t at = flag.find("%W"); at != std::string::npos) flag.replace(at, 2, std::to_string(i));
        argv.push_back(std::move(flag));
      }
      auto worker = ChildProcess::Start(argv, absl::StrCat(c->dir_, "/w", i, ".log"));
      EXPECT_TRUE(worker.ok()) << worker.status();
      if (!worker.ok()) return nullptr;
      c->workers_.push_back(std::move(*worker));
      c->worker_ports_.push_back(WaitForPort(port_file));  // written once registered
      EXPECT_FALSE(c->worker_ports_.back().empty());
      if (c->worker_ports_.back().empty()) return nullptr;
    }
    return c;
  }

  // shardctl ARGS against this cluster (or `coordinator` when given).
  CtlRun Ctl(const std::vector<std::string>& args, const std::string& coordinator = "") {
    return RunShardctl(args, coordinator.empty() ? address_ : coordinator, dir_);
  }

  // kill -9 of the coordinator; RestartCoordinator() starts it again on the
  // same port and state dir (the workers find it there).
  void KillCoordinator() {
    ::kill(coordinator_->pid(), SIGKILL);
    while (coordinator_->Running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  bool RestartCoordinator() { return StartCoordinator(address_.substr(address_.rfind(':') + 1)); }

  const std::string& dir() const { return dir_; }
  const std::string& address() const { return address_; }
  const std::vector<std::string>& worker_ports() const { return worker_ports_; }
  // The process of worker `w<i>`, and the coordinator's.
  pid_t worker_pid(int i) const { return workers_[i]->pid(); }
  pid_t coordinator_pid() const { return coordinator_->pid(); }

 private:
  ProcessCluster(std::string dir, int64_t lease_ms) : dir_(std::move(dir)), lease_ms_(lease_ms) {}
  bool StartCoordinator(const std::string& port) {
    const std::string port_file = absl::StrCat(dir_, "/port", starts_);
    std::vector<std::string> argv = {kBin + "/shardline-coordinator", "--listen=127.0.0.1:" + port,
                                     "--state_dir=" + dir_ + "/state", "--port_file=" + port_file,
                                     absl::StrCat("--lease_ms=", lease_ms_)};
    argv.insert(argv.end(), coordinator_flags_.begin(), coordinator_flags_.end());
    auto coordinator = ChildProcess::Start(argv, absl::StrCat(dir_, "/coordinator", starts_, ".log"));
    EXPECT_TRUE(coordinator.ok()) << coordinator.status();
    if (!coordinator.ok()) return false;
    coordinator_ = std::move(*coordinator);
    const std::string bound = WaitForPort(port_file);
    EXPECT_FALSE(bound.empty()) << common::ReadFile(absl::StrCat(dir_, "/coordinator", starts_, ".log")).value_or("");
    ++starts_;
    if (bound.empty()) return false;
    address_ = "127.0.0.1:" + bound;
    return true;
  }
  const std::string dir_;
  const int64_t lease_ms_;
  std::vector<std::string> coordinator_flags_;
  std::string address_;
  std::vector<std::string> worker_ports_;
  // Stopped (SIGTERM, then SIGKILL) when the cluster goes: workers first.
  std::unique_ptr<ChildProcess> coordinator_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
  int starts_ = 0;  // coordinator starts
};

}  // namespace shardline::client::testing

#endif  // SHARDLINE_TESTS_CLIENT_PROCESS_CLUSTER_H_
