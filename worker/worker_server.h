// WorkerServer is the shardline-worker daemon: it owns the compute backend,
// measures its GEMM rate, serves StageLink for its downstream neighbour,
// registers with the coordinator, keeps its lease alive, and runs each
// assignment it receives (RunStageJob) until it ends or is cancelled. When
// the coordinator no longer knows it (restarted, or its lease lapsed) it
// stops its job and registers again, with jittered exponential backoff; a
// new assignment fences an older one still running (stopped first).
// Its gRPC health service says SERVING only while it can take work
// (registered, not drained, not stopping). Stop() (or destruction) ends
// everything cleanly. Thread-safe.
#ifndef SHARDLINE_WORKER_WORKER_SERVER_H_
#define SHARDLINE_WORKER_WORKER_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/metrics_registry.h"
#include "common/transport_security.h"
#include "worker/backend/backend.h"
#include "worker/collective/collective.h"
#include "worker/grpc_coordinator_client.h"
#include "worker/grpc_job_groups.h"
#include "worker/grpc_link_probes.h"
#include "worker/runtime/stage_activity.h"
#include "worker/state_cache.h"
#include "worker/worker_state_service.h"
#include "worker/transport/grpc_stage_link.h"
#include "worker/transport/link_probe_service.h"
#include "worker/transport/stage_link_service.h"

namespace shardline::worker {

struct WorkerOptions {
  std::string coordinator = "127.0.0.1:7400";
  std::string listen = "127.0.0.1:0";  // StageLink service; port 0 picks a free one
  std::string advertise_host;          // host neighbours dial (default: the listen host)
  std::string device = "cpu";
  std::string name;
  int threads = 0;
  // The directory under which jobs' data files (data.path) must lie; a
  // relative data.path is taken from here. Must not be empty.
  std::string data_root = ".";
  // Its channels' protection (mutual TLS or plaintext), for the StageLink
  // server and every channel it dials. Null: plaintext, loopback only.
  std::shared_ptr<common::TransportSecurity> security;
  absl::Duration rpc_deadline = absl::Seconds(10);
  // Stage links: timeout, chunk size and flow-control window (the wire
  // precision and the waiting bound come from each job).
  transport::ExchangeOptions link;
  size_t link_staging_bytes = size_t{512} << 20;  // staging slots of one stage's links, at most
  // The f32 GEMM rate to report to the planner instead of measuring it (0:
  // measure): for machines known to be alike, whose start-up measurements
  // differ by noise (two workers starting at once on one host).
  double gemm_flops = 0;
  // Where its Prometheus metrics go (worker_main serves them at /metrics);
  // null: a registry of its own. Must outlive the worker, and be scraped
  // no more once the worker is gone (a refresh reads its link).
  common::MetricsRegistry* metrics = nullptr;
  // Test hook: reports reordered and duplicated on the way (ScrambledReporter).
  bool scramble_reports = false;
};

class WorkerServer {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(const WorkerOptions& options);
  ~WorkerServer();

  void Stop();
  // Blocks until Stop() is called.
  void Wait() { stopped_.WaitForNotification(); }
  // The id of the current registration.
  std::string worker_id() const ABSL_LOCKS_EXCLUDED(id_mu_);
  int port() const { return port_; }
  // Its Prometheus metrics: WorkerOptions::metrics, or its own.
  common::MetricsRegistry& metrics() { return *metrics_; }

 private:
  explicit WorkerServer(WorkerOptions options)
      : options_(std::move(options)),
        own_metrics_(options_.metrics == nullptr ? std::make_unique<common::MetricsRegistry>() : nullptr),
        metrics_(options_.metrics != nullptr ? options_.metrics : own_metrics_.get()) {}
  void HeartbeatLoop(absl::Duration every);
  // Its GEMM rate measured again while no job runs (the coordinator asked:
  // HeartbeatResponse.measure_compute); none while one runs or on error.
  std::optional<shardline::v1::ComputeProbe> MeasureIdleCompute() ABSL_LOCKS_EXCLUDED(mu_);
  // Registers (again) until it succeeds or the worker stops.
  void RegisterAgain();
  // Stops the running job, if any (cancel: the coordinator's word, or a
  // newer assignment; the links are closed so that it ends at once).
  void CancelJob(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WatchLoop();
  void OnAssignment(const shardline::v1::Assignment& assignment);
  void RunJob(shardline::v1::Assignment assignment);
  void JoinJob() ABSL_LOCKS_EXCLUDED(mu_);
  // Says SERVING on the health service (every service) while the worker is
  // registered, not drained and not stopping; NOT_SERVING otherwise.
  void PublishHealth();
  // Sets the staging-pool gauges from the running job's link (a scrape).
  void RefreshStagingMetrics() ABSL_LOCKS_EXCLUDED(mu_);

  const WorkerOptions options_;
  std::unique_ptr<common::MetricsRegistry> own_metrics_;  // when options_ names none
  common::MetricsRegistry* metrics_;
  std::unique_ptr<Backend> backend_;
  transport::StageLinkService link_service_;
  transport::LinkProbeService probe_service_;
  std::unique_ptr<GrpcLinkProbes> probes_;  // the rounds the coordinator asks for
  // The last checkpoint snapshot, kept for a restart here or a twin's fetch.
  StateCache state_cache_;
  WorkerStateService state_service_{state_cache_};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<GrpcCoordinatorClient> coordinator_;
  shardline::v1::RegisterRequest registration_;
  mutable absl::Mutex id_mu_;
  std::string worker_id_ ABSL_GUARDED_BY(id_mu_);
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> registered_{false};  // the coordinator knows this worker
  std::atomic<bool> drained_{false};     // as the last heartbeat said
  absl::Mutex health_mu_;                // orders PublishHealth's calls
  absl::Notification stopped_;
  std::thread heartbeat_, watch_;

  absl::Mutex mu_;
  std::thread job_ ABSL_GUARDED_BY(mu_);
  bool job_running_ ABSL_GUARDED_BY(mu_) = false;  // job_'s thread has not ended
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  uint64_t job_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // of the assignment job_id_ came with
  transport::GrpcStageLink* link_ ABSL_GUARDED_BY(mu_) = nullptr;  // of the running job
  JobGroups* groups_ ABSL_GUARDED_BY(mu_) = nullptr;  // its collective groups
  std::atomic<bool> job_cancelled_{false};
  std::atomic<int64_t> job_stop_after_{0};  // the running job's last step, when the coordinator re-plans
  runtime::StageActivity activity_;  // what the running job's stage does: sent with each heartbeat
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_WORKER_SERVER_H_
