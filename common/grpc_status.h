// Conversion between absl::Status (used everywhere inside Shardline) and
// grpc::Status (used only at the gRPC edge: service implementations and
// client stubs). The canonical codes are the same numbers in both, so a code
// survives a round trip unchanged; payloads are not carried.
#ifndef SHARDLINE_COMMON_GRPC_STATUS_H_
#define SHARDLINE_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace grpc {
class CallbackServerContext;
class ServerUnaryReactor;
}  // namespace grpc

namespace shardline::common {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Ends a callback service's unary call with `status` (its default reactor).
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, const absl::Status& status);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_GRPC_STATUS_H_
