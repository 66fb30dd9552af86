// The health of the real daemons as tests ask it: grpc.health.v1 Check.
#ifndef SHARDLINE_TESTS_CLIENT_HEALTH_CHECK_H_
#define SHARDLINE_TESTS_CLIENT_HEALTH_CHECK_H_

#include <string>

#include "absl/status/statusor.h"
#include "client/health_check.h"

namespace shardline::client::testing {

inline constexpr int kServing = grpc::health::v1::HealthCheckResponse::SERVING;
inline constexpr int kNotServing = grpc::health::v1::HealthCheckResponse::NOT_SERVING;

// The serving status, or the call's error (NOT_FOUND: no such service).
inline absl::StatusOr<int> HealthStatus(const std::string& address, const std::string& service) {
  absl::StatusOr<ServingStatus> status = CheckHealth(address, service, absl::Seconds(10));
  if (!status.ok()) return status.status();
  return static_cast<int>(*status);
}

}  // namespace shardline::client::testing

#endif  // SHARDLINE_TESTS_CLIENT_HEALTH_CHECK_H_
