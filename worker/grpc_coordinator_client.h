// GrpcCoordinatorClient is a worker's connection to the coordinator: register,
// heartbeat, the assignment stream, and the StageReporter calls. Every unary
// call has a deadline, every stream a deadline per chunk; statuses come back
// as absl::Status. Checkpoints and state travel on a TCP connection of their
// own, so that a heartbeat never waits behind them. Thread-safe (gRPC stubs
// are).
#ifndef SHARDLINE_WORKER_GRPC_COORDINATOR_CLIENT_H_
#define SHARDLINE_WORKER_GRPC_COORDINATOR_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "worker/stage_reporter.h"

namespace shardline::worker {

class GrpcCoordinatorClient final : public StageReporter {
 public:
  // `credentials` protect the channel to the coordinator and those to twins.
  GrpcCoordinatorClient(const std::string& address, absl::Duration deadline,
                        std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

  // Keeps the registration's id and secret: every later call carries the
  // secret (metadata common::kWorkerSecretKey), a shard header the id.
  absl::StatusOr<shardline::v1::RegisterResponse> Register(const shardline::v1::RegisterRequest& r);
  // With what the worker's stage does now, if it runs one (the hang
  // explainer), and a fresh GEMM probe where one was asked for; the answer
  // says whether the worker is drained, which links to probe, whether to
  // measure its GEMM rate again.
  absl::StatusOr<shardline::v1::HeartbeatResponse> Heartbeat(
      const std::string& worker_id, const std::optional<shardline::v1::StageActivity>& activity = std::nullopt,
      const std::optional<shardline::v1::ComputeProbe>& compute = std::nullopt);
  // What this worker measured of its links (HeartbeatResponse.probe_targets);
  // the answer's targets are the next to measure.
  absl::StatusOr<shardline::v1::ReportLinksResponse> ReportLinks(const shardline::v1::ReportLinksRequest& request);
  // Tells the coordinator this worker is going (a short deadline: best effort).
  absl::Status Leave(const std::string& worker_id, const std::string& reason);
  // Blocks, calling `on_assignment` for each assignment, until the stream
  // ends (its status) or Cancel() is called.
  absl::Status WatchAssignments(const std::string& worker_id,
                                const std::function<void(const shardline::v1::Assignment&)>& on_assignment);
  void CancelWatch();
  // New connections for every later call, made with the certificate files
  // as they are now: after the coordinator refused this worker's
  // certificate as revoked (common::kRevokedCertificate) on a connection
  // opened before, a replaced certificate is used at once; gRPC keeps a
  // connection as long as it works. Calls under way finish on the old ones.
  void Reconnect();

  // Retried (jittered backoff, one deadline in all) while UNAVAILABLE or
  // DEADLINE_EXCEEDED: the coordinator applies a report once.
  absl::StatusOr<bool> ReportStep(const shardline::v1::ReportStepRequest& report) override;
  // Chunked with a deadline per chunk, resumed after a broken stream where
  // the coordinator's copy ends (jittered backoff), given up once nothing
  // went through for three deadlines or on a refusal.
  absl::Status ReportShard(const ShardSnapshot& shard, const std::atomic<bool>& cancelled) override;
  // As long as the state takes to come, each chunk within a deadline of the
  // last (a stalled stream is cut: DEADLINE_EXCEEDED).
  absl::StatusOr<common::SafetensorsContents> FetchState(const shardline::v1::FetchStateRequest& request) override;
  // A fresh channel to the twin, the same deadlines as FetchState's.
  absl::StatusOr<common::SafetensorsContents> FetchStateFromTwin(
      const std::string& address, const shardline::v1::FetchStateRequest& request) override;

 private:
  void SetDeadline(grpc::ClientContext& context) const;
  // Adds the registration's secret to the call.
  void Authorize(grpc::ClientContext& context);
  std::string worker_id();
  // The stubs of the current connections (Reconnect replaces them).
  std::shared_ptr<shardline::v1::Coordinator::Stub> Control();  // everything small
  std::shared_ptr<shardline::v1::Coordinator::Stub> Bulk();     // ReportShard, FetchState

  const std::string address_;
  const absl::Duration deadline_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  std::mutex stubs_mu_;
  int connections_ = 0;  // guarded by stubs_mu_: how many times connected
  std::shared_ptr<shardline::v1::Coordinator::Stub> stub_;       // guarded by stubs_mu_
  std::shared_ptr<shardline::v1::Coordinator::Stub> bulk_stub_;  // guarded by stubs_mu_
  std::mutex watch_mu_;
  grpc::ClientContext* watch_context_ = nullptr;  // guarded by watch_mu_
  std::mutex registration_mu_;
  std::string worker_id_;      // guarded by registration_mu_
  std::string worker_secret_;  // guarded by registration_mu_; never logged
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_GRPC_COORDINATOR_CLIENT_H_
