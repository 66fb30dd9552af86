// AdminClient is the client library for the coordinator's Admin service, used
// by shardctl and shardline-local. Every unary call has a deadline; the
// weights' streams (export, submit with weights) have none for the whole,
// however large, but each chunk must move within it (DEADLINE_EXCEEDED
// otherwise), and a submission that copies another job's weights waits for
// that copy; a watch runs until its job ends. Errors are absl::Status
// (UNAVAILABLE when the coordinator cannot be reached).
// Thread-safe.
#ifndef SHARDLINE_CLIENT_ADMIN_CLIENT_H_
#define SHARDLINE_CLIENT_ADMIN_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shardline/v1/admin.grpc.pb.h"

namespace shardline::client {

class AdminClient {
 public:
  // `credentials` protect the channel (null: plaintext); `bearer_token`,
  // when set, goes with every call (metadata "authorization: Bearer …").
  explicit AdminClient(const std::string& address, absl::Duration deadline = absl::Seconds(10),
                       std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
                       std::string bearer_token = "");

  absl::StatusOr<shardline::v1::JobStatus> Submit(const shardline::v1::JobSpec& spec);
  absl::StatusOr<shardline::v1::JobStatus> Get(const std::string& job_id);
  absl::StatusOr<shardline::v1::ListJobsResponse> ListJobs();
  absl::StatusOr<shardline::v1::JobStatus> Cancel(const std::string& job_id);
  // Forgets an ended job: its record, checkpoint, trace and metrics.
  absl::StatusOr<shardline::v1::DeleteJobResponse> Delete(const std::string& job_id);
  // Moves a running job to the best layout now, from a step a little ahead.
  absl::StatusOr<shardline::v1::JobStatus> Replan(const std::string& job_id);
  absl::StatusOr<shardline::v1::ListWorkersResponse> ListWorkers();
  // Takes a worker (name or id) out of service, or back (undo).
  absl::StatusOr<shardline::v1::WorkerStatus> Drain(const std::string& worker, bool undo, bool at_once = false);
  absl::StatusOr<shardline::v1::PlanResponse> Plan(const shardline::v1::JobSpec& spec);
  absl::StatusOr<shardline::v1::ListLinksResponse> ListLinks();
  // Queues probes between `workers` (names; empty: all live ones).
  absl::StatusOr<shardline::v1::ProbeLinksResponse> ProbeLinks(const std::vector<std::string>& workers);
  // Calls `on_status` for every status until the job ends; returns the last.
  absl::StatusOr<shardline::v1::JobStatus> Watch(
      const std::string& job_id, const std::function<void(const shardline::v1::JobStatus&)>& on_status);
  // What the job's positions did in recent steps in [first, last] (0: no bound).
  absl::StatusOr<shardline::v1::GetTraceResponse> Trace(const std::string& job_id, int64_t first, int64_t last);
  // The committed weights as safetensors bytes (with `best`: the best
  // validation pass's version that early stopping keeps).
  absl::StatusOr<std::string> Export(const std::string& job_id, bool best = false);
  // The same into the file at `path` as they come (a temporary file beside
  // it, fsynced, then renamed: nothing at `path` unless all came); the
  // bytes written. The weights are never all in memory.
  absl::StatusOr<int64_t> ExportTo(const std::string& job_id, const std::string& path, bool best = false);
  // Submit, the job starting from the weights in the safetensors file at
  // `path`, sent in chunks (NOT_FOUND: no such file, before connecting).
  absl::StatusOr<shardline::v1::JobStatus> SubmitWithWeights(const shardline::v1::JobSpec& spec,
                                                             const std::string& path);

 private:
  // The ExportWeights stream of `job_id`, each chunk to `sink` (its error
  // ends the call); the call's status.
  absl::Status ReadExport(const std::string& job_id, bool best,
                          const std::function<absl::Status(const std::string&)>& sink);
  std::unique_ptr<grpc::ClientContext> Context() const;  // with the deadline, authorized
  void Authorize(grpc::ClientContext& context) const;     // adds the bearer token, if any
  const absl::Duration deadline_;
  const std::string bearer_token_;  // never logged
  std::unique_ptr<shardline::v1::Admin::Stub> stub_;
};

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_ADMIN_CLIENT_H_
