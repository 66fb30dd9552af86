// The gRPC metadata keys Shardline's calls carry besides their messages.
#ifndef SHARDLINE_COMMON_GRPC_METADATA_H_
#define SHARDLINE_COMMON_GRPC_METADATA_H_

#include <string>

#include "absl/strings/string_view.h"

namespace shardline::common {

// A worker's registration secret (RegisterResponse.worker_secret), on every
// call it makes to the coordinator after Register.
inline constexpr char kWorkerSecretKey[] = "x-shardline-worker-secret";

// The value of `key` in a server call's client metadata ("" when absent).
template <typename Context>
std::string MetadataValue(const Context& context, absl::string_view key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(std::string(key));
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_GRPC_METADATA_H_
