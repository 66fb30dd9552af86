#include "worker/grpc_link_probes.h"

#include <algorithm>

#include "glog/logging.h"

namespace shardline::worker {

void GrpcLinkProbes::Start(const std::string& worker_id, const std::vector<shardline::v1::ProbeTarget>& targets) {
  if (targets.empty()) return;
  absl::MutexLock lock(&mu_);
  if (cancelled_) return;
  worker_id_ = worker_id;
  targets_.insert(targets_.end(), targets.begin(), targets.end());
  if (running_) return;  // the running thread takes them
  if (thread_.joinable()) thread_.join();  // the last round, finished
  running_ = true;
  thread_ = std::thread([this] { Run(); });
}

void GrpcLinkProbes::Stop() {
  std::thread finishing;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;  // under the lock: no round starts after this
    finishing = std::move(thread_);
  }
  if (finishing.joinable()) finishing.join();
}

void GrpcLinkProbes::Run() {
  while (true) {
    shardline::v1::ReportLinksRequest request;
    shardline::v1::ProbeTarget target;
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_ || targets_.empty()) {
        targets_.clear();
        running_ = false;
        return;
      }
      target = std::move(targets_.front());
      targets_.pop_front();
      request.set_worker_id(worker_id_);
    }
    *request.add_links() = Probe(target);
    if (cancelled_) continue;
    absl::StatusOr<shardline::v1::ReportLinksResponse> answer = report_(request);
    if (!answer.ok()) {
      LOG(WARNING) << "reporting the link to " << target.worker() << " failed: " << answer.status();
      continue;
    }
    absl::MutexLock lock(&mu_);
    targets_.insert(targets_.end(), answer->probe_targets().begin(), answer->probe_targets().end());
  }
}

shardline::v1::LinkMeasurement GrpcLinkProbes::Probe(const shardline::v1::ProbeTarget& target) {
  shardline::v1::LinkMeasurement m;
  m.set_to_worker(target.worker());
  transport::LinkProbeOptions options = options_;
  const std::string& address = target.address();
  if (address.substr(0, address.rfind(':')) == own_host_) {
    options.max_transfer_bytes = std::min(options.max_transfer_bytes, kSameHostTransferBytes);
  }
  if (target.max_transfer_bytes() > 0) {  // a check beside a job: short
    options.max_transfer_bytes = std::min(options.max_transfer_bytes, target.max_transfer_bytes());
    options.first_transfer_bytes = std::min(options.first_transfer_bytes, options.max_transfer_bytes);
  }
  absl::StatusOr<transport::LinkProbeResult> result = transport::ProbeLink(address, credentials_, options, cancelled_);
  if (!result.ok()) {
    m.set_error(std::string(result.status().ToString()).substr(0, 512));
    LOG(WARNING) << "link to " << target.worker() << " (" << target.address() << "): " << result.status();
    return m;
  }
  m.set_bytes_per_second(result->bytes_per_second);
  m.set_bytes_per_second_spread(result->spread);
  m.set_rtt_seconds(result->rtt_seconds);
  LOG(INFO) << "link to " << target.worker() << ": " << result->bytes_per_second * 8 / 1e6 << " Mbit/s ± "
            << 50 * result->spread << "%, round trip " << result->rtt_seconds * 1e3 << " ms ("
            << result->transfer_bytes << "-byte transfers)";
  return m;
}

}  // namespace shardline::worker
