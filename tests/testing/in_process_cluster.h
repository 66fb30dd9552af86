// InProcessCluster runs a coordinator (registry, job manager, weight store,
// both services) and N worker daemons (WorkerServer) as threads of the test
// process, all on 127.0.0.1 with ports chosen by the kernel. Fast cluster
// tests use it; a few tests run the real binaries instead.
#ifndef SHARDLINE_TESTS_TESTING_IN_PROCESS_CLUSTER_H_
#define SHARDLINE_TESTS_TESTING_IN_PROCESS_CLUSTER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/admin_service.h"
#include "server/coordinator_service.h"
#include "server/job_manager.h"
#include "server/coordinator_store.h"
#include "server/weight_store.h"
#include "server/worker_registry.h"
#include "worker/worker_server.h"

namespace shardline::testing {

class InProcessCluster {
 public:
  // `configure`, if set, adjusts each worker's options before it starts.
  static absl::StatusOr<std::unique_ptr<InProcessCluster>> Start(
      int workers, absl::Duration lease = absl::Seconds(5),
      const std::function<void(worker::WorkerOptions&)>& configure = nullptr);
  ~InProcessCluster();

  const std::string& address() const { return address_; }
  server::JobManager& jobs() { return *jobs_; }
  worker::WorkerServer& worker(int i) { return *workers_[i]; }

 private:
  InProcessCluster() = default;

  std::unique_ptr<server::WeightStore> weights_;
  std::unique_ptr<server::CoordinatorStore> store_;
  std::unique_ptr<server::WorkerRegistry> registry_;
  std::unique_ptr<server::CoordinatorService> coordinator_;
  std::unique_ptr<server::JobManager> jobs_;
  std::unique_ptr<server::AdminService> admin_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread reaper_;
  std::vector<std::unique_ptr<worker::WorkerServer>> workers_;
};

}  // namespace shardline::testing

#endif  // SHARDLINE_TESTS_TESTING_IN_PROCESS_CLUSTER_H_
