// AdminService is the gRPC face of the coordinator for operators and tools
// (shardctl, shardline-local): jobs, workers, plans, weight export. It
// translates between RPCs and the JobManager / WorkerRegistry / WeightStore.
// With AdminTokens every call needs a bearer token of the role it asks for
// (admin: SubmitJob, SubmitJobWithWeights, CancelJob, ReplanJob, DeleteJob,
// DrainWorker, ExportWeights, ProbeLinks; viewer: the rest); without, the service is open (a coordinator on loopback, or one
// run with --insecure). Thread-safe.
#ifndef SHARDLINE_SERVER_ADMIN_SERVICE_H_
#define SHARDLINE_SERVER_ADMIN_SERVICE_H_

#include "server/admin_tokens.h"
#include "server/job_manager.h"
#include "server/weight_store.h"
#include "server/worker_registry.h"
#include "shardline/v1/admin.grpc.pb.h"

namespace shardline::server {

class AdminService final : public shardline::v1::Admin::CallbackService {
 public:
  // `tokens` (may be null: no token needed) outlives the service.
  AdminService(JobManager& jobs, WorkerRegistry& registry, WeightStore& weights, AdminTokens* tokens = nullptr)
      : jobs_(jobs), registry_(registry), weights_(weights), tokens_(tokens) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const shardline::v1::SubmitJobRequest* request,
                                      shardline::v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const shardline::v1::GetJobRequest* request,
                                   shardline::v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const shardline::v1::ListJobsRequest* request,
                                     shardline::v1::ListJobsResponse* response) override;
  grpc::ServerWriteReactor<shardline::v1::JobStatus>* WatchJob(
      grpc::CallbackServerContext* context, const shardline::v1::GetJobRequest* request) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const shardline::v1::GetJobRequest* request,
                                      shardline::v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* ReplanJob(grpc::CallbackServerContext* context,
                                      const shardline::v1::GetJobRequest* request,
                                      shardline::v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const shardline::v1::GetJobRequest* request,
                                      shardline::v1::DeleteJobResponse* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const shardline::v1::ListWorkersRequest* request,
                                        shardline::v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* DrainWorker(grpc::CallbackServerContext* context,
                                        const shardline::v1::DrainWorkerRequest* request,
                                        shardline::v1::WorkerStatus* response) override;
  grpc::ServerUnaryReactor* PlanJob(grpc::CallbackServerContext* context,
                                    const shardline::v1::SubmitJobRequest* request,
                                    shardline::v1::PlanResponse* response) override;
  grpc::ServerWriteReactor<shardline::v1::ExportChunk>* ExportWeights(
      grpc::CallbackServerContext* context, const shardline::v1::ExportWeightsRequest* request) override;
  grpc::ServerReadReactor<shardline::v1::WeightsChunk>* SubmitJobWithWeights(
      grpc::CallbackServerContext* context, shardline::v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* ListLinks(grpc::CallbackServerContext* context,
                                      const shardline::v1::ListLinksRequest* request,
                                      shardline::v1::ListLinksResponse* response) override;
  grpc::ServerUnaryReactor* ProbeLinks(grpc::CallbackServerContext* context,
                                       const shardline::v1::ProbeLinksRequest* request,
                                       shardline::v1::ProbeLinksResponse* response) override;
  grpc::ServerUnaryReactor* GetTrace(grpc::CallbackServerContext* context,
                                     const shardline::v1::GetTraceRequest* request,
                                     shardline::v1::GetTraceResponse* response) override;

 private:
  JobManager& jobs_;
  WorkerRegistry& registry_;
  WeightStore& weights_;
  AdminTokens* const tokens_;
  // The call's bearer token grants `role` (always, without tokens_); who
  // asked: the token's name, else the client certificate's first name
  // ("certificate shardctl"), else kAnOperator. What an admin call changed
  // is logged with it ("admin: ops: cancelled job j-3").
  absl::StatusOr<std::string> Authorize(const grpc::CallbackServerContext* context, AdminRole role);
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_ADMIN_SERVICE_H_
