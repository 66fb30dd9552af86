#include "client/health_check.h"

#include <grpcpp/grpcpp.h>

#include "common/grpc_status.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace shardline::client {

absl::StatusOr<ServingStatus> CheckHealth(const std::string& address, const std::string& service,
                                          absl::Duration deadline,
                                          std::shared_ptr<grpc::ChannelCredentials> credentials) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, credentials != nullptr ? credentials : grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return common::FromGrpcStatus(status);
  return response.status();
}

}  // namespace shardline::client
