// A job spec as SubmitJob and `shardctl submit` take it: JSON parsed and
// validated (sizes in checked int64). Whatever the text, a spec is either
// refused with INVALID_ARGUMENT or valid, and a valid one survives a round
// trip through its JSON unchanged.
#include <cstdint>
#include <string>

#include "common/job_spec.h"
#include "google/protobuf/util/message_differencer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<shardline::v1::JobSpec> spec = shardline::common::ParseJobSpec(json);
  if (!spec.ok()) {
    if (spec.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    if (spec.status().message().size() > 4096) __builtin_trap();  // errors quote a prefix only
    return 0;
  }
  absl::StatusOr<shardline::v1::JobSpec> again = shardline::common::ParseJobSpec(shardline::common::JobSpecToJson(*spec));
  if (!again.ok() || !google::protobuf::util::MessageDifferencer::Equals(*spec, *again)) __builtin_trap();
  return 0;
}
