// CheckHealth asks a daemon's grpc.health.v1 service how it is: what
// `shardctl health` and container health checks use.
#ifndef SHARDLINE_CLIENT_HEALTH_CHECK_H_
#define SHARDLINE_CLIENT_HEALTH_CHECK_H_

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.pb.h"

namespace shardline::client {

using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

// The serving status of `service` ("" for the server as a whole) at
// `address`; NOT_FOUND for a service the daemon does not know, UNAVAILABLE
// or DEADLINE_EXCEEDED when it cannot be reached within `deadline`.
absl::StatusOr<ServingStatus> CheckHealth(const std::string& address, const std::string& service,
                                          absl::Duration deadline = absl::Seconds(5),
                                          std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_HEALTH_CHECK_H_
