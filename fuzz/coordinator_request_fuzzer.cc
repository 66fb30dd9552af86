// A coordinator request as gRPC hands it over: protobuf bytes of one of the
// request types (the first byte picks which), parsed and passed through
// the coordinator's edge validation. Whatever the bytes, validation
// answers OK or INVALID_ARGUMENT with a short message, never crashes.
#include <cstdint>
#include <string>

#include "server/request_validation.h"

namespace {

template <typename Request>
void Check(const uint8_t* data, size_t size) {
  Request request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  const absl::Status status = shardline::server::ValidateRequest(request);
  if (!status.ok() && status.code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
  if (status.message().size() > 1024) __builtin_trap();  // errors quote a prefix only
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t kind = data[0] % 13;
  ++data;
  --size;
  switch (kind) {
    case 0: Check<shardline::v1::RegisterRequest>(data, size); break;
    case 1: Check<shardline::v1::HeartbeatRequest>(data, size); break;
    case 2: Check<shardline::v1::LeaveRequest>(data, size); break;
    case 3: Check<shardline::v1::WatchAssignmentsRequest>(data, size); break;
    case 4: Check<shardline::v1::ReportStepRequest>(data, size); break;
    case 5: Check<shardline::v1::ShardHeader>(data, size); break;
    case 6: Check<shardline::v1::FetchStateRequest>(data, size); break;
    case 7: Check<shardline::v1::GetJobRequest>(data, size); break;
    case 8: Check<shardline::v1::DrainWorkerRequest>(data, size); break;
    case 9: Check<shardline::v1::GetTraceRequest>(data, size); break;
    case 10: Check<shardline::v1::ReportLinksRequest>(data, size); break;
    case 11: Check<shardline::v1::ProbeLinksRequest>(data, size); break;
    default: Check<shardline::v1::ExportWeightsRequest>(data, size); break;
  }
  return 0;
}
