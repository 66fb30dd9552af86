#include "common/grpc_status.h"

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>

#include <string>

namespace shardline::common {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  // grpc::StatusCode has the 17 canonical codes; anything else is UNKNOWN.
  const absl::StatusCode absl_code =
      (code > 0 && code <= 16) ? static_cast<absl::StatusCode>(code)
                               : absl::StatusCode::kUnknown;
  return absl::Status(absl_code, status.error_message());
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace shardline::common
