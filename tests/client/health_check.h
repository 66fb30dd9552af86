// grpc.health.v1.Health/Check by hand, for tests of the real daemons.
#ifndef SHARDLINE_TESTS_CLIENT_HEALTH_CHECK_H_
#define SHARDLINE_TESTS_CLIENT_HEALTH_CHECK_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace shardline::client::testing {

inline constexpr int kServing = 1, kNotServing = 2;

// grpc.health.v1.Health/Check by hand (the messages are one string and one
// enum: HealthCheckRequest{service = 1}, HealthCheckResponse{status = 1},
// SERVING = 1): the serving status, or the call's error.
inline absl::StatusOr<int> HealthStatus(const std::string& address, const std::string& service) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  std::string request;
  if (!service.empty()) request = absl::StrCat("\x0a", std::string(1, static_cast<char>(service.size())), service);
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1), out;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", {}, &in, &out, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  if (!status.ok()) return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  std::vector<grpc::Slice> slices;
  if (!out.Dump(&slices).ok()) return absl::InternalError("unreadable response");
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (bytes.size() != 2 || bytes[0] != 0x08) return absl::InternalError("not a HealthCheckResponse: " + bytes);
  return static_cast<int>(bytes[1]);
}

}  // namespace shardline::client::testing

#endif  // SHARDLINE_TESTS_CLIENT_HEALTH_CHECK_H_
