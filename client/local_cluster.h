// LocalCluster runs a coordinator and N workers of the real binaries (found
// beside the running program) as separate processes on loopback, in a
// temporary directory (state, logs) that goes with it unless kept; the
// workers are stopped before the coordinator. Workers are named local-0,
// local-1, …. For shardline-local and bench_recovery. Not thread-safe.
#ifndef SHARDLINE_CLIENT_LOCAL_CLUSTER_H_
#define SHARDLINE_CLIENT_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/child_process.h"

namespace shardline::client {

// The last 2000 characters of a log file ("" if unreadable).
std::string LogTail(const std::string& path);

class LocalCluster {
 public:
  ~LocalCluster();

  // More flags for every worker started from now on.
  void set_worker_flags(std::vector<std::string> flags) { worker_flags_ = std::move(flags); }
  // Starts the coordinator (lease `lease_ms`) and `workers` workers and
  // waits until every one has registered.
  absl::Status Start(int workers, const std::string& device, int threads, int64_t lease_ms);
  // One more worker (local-<N>); returns once it has registered.
  absl::Status AddWorker();
  // UNAVAILABLE naming the first daemon that has exited.
  absl::Status CheckChildren();
  // kill -9 of worker local-<i>.
  void KillWorker(int i);

  const std::string& address() const { return address_; }
  const std::string& dir() const { return dir_; }
  void keep() { keep_ = true; }

 private:
  // Starts worker local-<N> (does not wait for it).
  absl::Status StartWorker();
  absl::Status WaitForWorkers(size_t count);

  std::string dir_;
  std::string address_;
  std::string device_;
  int threads_ = 1;
  std::vector<std::string> worker_flags_;
  std::unique_ptr<ChildProcess> coordinator_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
  bool keep_ = false;
};

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_LOCAL_CLUSTER_H_
