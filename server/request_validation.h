// The coordinator's checks of every request's shape, made at the gRPC edge
// before a request touches any state: lengths of strings (names, ids,
// addresses, descriptions, messages), counts of repeated fields and ranges
// of numbers that need no state to judge (common/input_limits.h). Whether a
// job or worker exists, and whether the sender may speak for a position, is
// JobManager's and WorkerRegistry's business. Each returns INVALID_ARGUMENT
// naming the field; none quotes more than a prefix of the input. Pure
// functions, thread-safe.
#ifndef SHARDLINE_SERVER_REQUEST_VALIDATION_H_
#define SHARDLINE_SERVER_REQUEST_VALIDATION_H_

#include "absl/status/status.h"
#include "shardline/v1/admin.pb.h"
#include "shardline/v1/coordinator.pb.h"

namespace shardline::server {

// Coordinator (workers → coordinator).
absl::Status ValidateRequest(const shardline::v1::RegisterRequest& r);
absl::Status ValidateRequest(const shardline::v1::HeartbeatRequest& r);
absl::Status ValidateRequest(const shardline::v1::LeaveRequest& r);
absl::Status ValidateRequest(const shardline::v1::WatchAssignmentsRequest& r);
absl::Status ValidateRequest(const shardline::v1::ReportStepRequest& r);
absl::Status ValidateRequest(const shardline::v1::ShardHeader& h);
absl::Status ValidateRequest(const shardline::v1::FetchStateRequest& r);
// At most kMaxWorkers links, each naming a peer, with finite figures.
absl::Status ValidateRequest(const shardline::v1::ReportLinksRequest& r);

// Admin (operators → coordinator). A job spec is ValidateJobSpec's.
absl::Status ValidateRequest(const shardline::v1::GetJobRequest& r);
absl::Status ValidateRequest(const shardline::v1::ExportWeightsRequest& r);
absl::Status ValidateRequest(const shardline::v1::DrainWorkerRequest& r);
absl::Status ValidateRequest(const shardline::v1::GetTraceRequest& r);
absl::Status ValidateRequest(const shardline::v1::ProbeLinksRequest& r);

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_REQUEST_VALIDATION_H_
