// Runs the link probes the coordinator hands a worker (idle; busy, checks)
// (HeartbeatResponse.probe_targets, ReportLinksResponse.probe_targets) on a
// thread of its own, one peer after another (transport::ProbeLink),
// reporting each as it ends (ReportLinks), whose answer may name the next;
// a peer that cannot be measured is reported with the error. Targets that
// arrive while a probe runs wait their turn. A peer on this worker's own
// host (the same host in its address)
// is memory, not a wire: its transfers stop at kSameHostTransferBytes,
// which keeps a cluster of many workers on one machine from spending
// seconds of CPU on probes; a target's max_transfer_bytes (a check of a
// link in doubt, run beside a job) bounds them too. Stop() cancels between
// transfers and joins.
// Thread-safe.
#ifndef SHARDLINE_WORKER_GRPC_LINK_PROBES_H_
#define SHARDLINE_WORKER_GRPC_LINK_PROBES_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "shardline/v1/coordinator.pb.h"
#include "worker/transport/grpc_link_prober.h"

namespace shardline::worker {

class GrpcLinkProbes {
 public:
  static constexpr int64_t kSameHostTransferBytes = int64_t{4} << 20;

  using Report = std::function<absl::StatusOr<shardline::v1::ReportLinksResponse>(
      const shardline::v1::ReportLinksRequest&)>;
  // `own_host`: the host part of this worker's advertised address.
  GrpcLinkProbes(std::string own_host, std::shared_ptr<grpc::ChannelCredentials> credentials, Report report,
                 transport::LinkProbeOptions options = {})
      : own_host_(std::move(own_host)),
        credentials_(std::move(credentials)),
        report_(std::move(report)),
        options_(options) {}
  ~GrpcLinkProbes() { Stop(); }

  // Probes `targets` for worker `worker_id` after those still to run.
  void Start(const std::string& worker_id, const std::vector<shardline::v1::ProbeTarget>& targets);
  void Stop();

 private:
  void Run();
  shardline::v1::LinkMeasurement Probe(const shardline::v1::ProbeTarget& target);

  const std::string own_host_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const Report report_;
  const transport::LinkProbeOptions options_;
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  std::deque<shardline::v1::ProbeTarget> targets_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_GRPC_LINK_PROBES_H_
