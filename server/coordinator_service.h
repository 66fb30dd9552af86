// CoordinatorService is the gRPC face of the coordinator for workers: it
// turns Coordinator RPCs into calls on the WorkerRegistry and JobManager and
// their statuses back into gRPC ones, and keeps each worker's assignment
// mailbox. No business logic here. Thread-safe.
#ifndef SHARDLINE_SERVER_COORDINATOR_SERVICE_H_
#define SHARDLINE_SERVER_COORDINATOR_SERVICE_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/job_manager.h"
#include "server/stream_mailbox.h"
#include "server/worker_registry.h"
#include "shardline/v1/coordinator.grpc.pb.h"

namespace shardline::server {

class CoordinatorService final : public shardline::v1::Coordinator::CallbackService {
 public:
  explicit CoordinatorService(WorkerRegistry& registry) : registry_(registry) {}
  // Set once, before the server starts.
  void set_jobs(JobManager* jobs) { jobs_ = jobs; }
  // A worker registers only under a name its client certificate holds
  // (server/certificate_names.h).
  void set_bind_worker_names(bool on) { bind_worker_names_ = on; }
  // JobManager's Deliver: queue an assignment for a worker's watch stream.
  void Deliver(const std::string& worker_id, shardline::v1::Assignment assignment);

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const shardline::v1::RegisterRequest* request,
                                     shardline::v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const shardline::v1::HeartbeatRequest* request,
                                      shardline::v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context, const shardline::v1::LeaveRequest* request,
                                  shardline::v1::LeaveResponse* response) override;
  grpc::ServerWriteReactor<shardline::v1::Assignment>* WatchAssignments(
      grpc::CallbackServerContext* context,
      const shardline::v1::WatchAssignmentsRequest* request) override;
  grpc::ServerUnaryReactor* ReportStep(grpc::CallbackServerContext* context,
                                       const shardline::v1::ReportStepRequest* request,
                                       shardline::v1::ReportStepResponse* response) override;
  grpc::ServerReadReactor<shardline::v1::ShardChunk>* ReportShard(
      grpc::CallbackServerContext* context, shardline::v1::ReportShardResponse* response) override;
  grpc::ServerWriteReactor<shardline::v1::ShardChunk>* FetchState(
      grpc::CallbackServerContext* context, const shardline::v1::FetchStateRequest* request) override;
  grpc::ServerUnaryReactor* ReportLinks(grpc::CallbackServerContext* context,
                                        const shardline::v1::ReportLinksRequest* request,
                                        shardline::v1::ReportLinksResponse* response) override;

  JobManager& jobs() { return *jobs_; }

 private:
  using AssignmentMailbox = StreamMailbox<shardline::v1::Assignment>;
  // A fresh mailbox in `slot` holding what the one there (if any) has not
  // delivered; each watch stream gets its own, and assignments for a worker
  // whose stream broke wait in a new one for its next watch.
  static std::shared_ptr<AssignmentMailbox> Renew(std::shared_ptr<AssignmentMailbox>& slot);
  // The next link `worker` should measure, if it may measure one now
  // (LinkTable::Claim); a queued peer that is lost fails at once.
  void AddProbeTarget(const WorkerRecord& worker,
                      google::protobuf::RepeatedPtrField<shardline::v1::ProbeTarget>* targets);

  WorkerRegistry& registry_;
  JobManager* jobs_ = nullptr;
  std::atomic<bool> bind_worker_names_{false};
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<StreamMailbox<shardline::v1::Assignment>>> mailboxes_
      ABSL_GUARDED_BY(mu_);
  // WorkerRegistry::forgotten() when the link table last dropped the
  // workers the registry forgot (LinkTable::Retain: a scan of every link).
  uint64_t retained_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_COORDINATOR_SERVICE_H_
