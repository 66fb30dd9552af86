// The limits on what a Shardline daemon accepts from the network or a file,
// in one place (each is named in docs/protocol.md), and the helpers that
// check them. A value over its limit is refused with INVALID_ARGUMENT before
// anything is allocated for it, and an error message quotes at most a short
// prefix of the bad input (a 1 MB id must not make a 1 MB error).
#ifndef SHARDLINE_COMMON_INPUT_LIMITS_H_
#define SHARDLINE_COMMON_INPUT_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardline::common {

inline constexpr size_t kMaxNameBytes = 128;          // job and worker names
inline constexpr size_t kMaxIdBytes = 128;            // job and worker ids
inline constexpr size_t kMaxAddressBytes = 256;       // host:port
inline constexpr size_t kMaxDescriptionBytes = 1024;  // a worker's description, device, build
inline constexpr size_t kMaxMessageBytes = 4096;      // an error or reason a worker reports
inline constexpr size_t kMaxPathBytes = 4096;         // data.path
inline constexpr size_t kMaxJobSpecBytes = 1 << 20;   // a job spec's JSON
inline constexpr size_t kMaxTraceEvents = 4096;       // spans in one step report
inline constexpr size_t kMaxStateNames = 1 << 16;     // parameter names in one FetchState
inline constexpr size_t kMaxQuotedBytes = 64;         // of bad input in an error message
// The most values in one tensor on a stage link or collective (4 GiB of f32),
// and the most tokens in one micro-batch (its targets travel in one frame).
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 30;
inline constexpr int64_t kMaxMicroBatchTokens = int64_t{1} << 22;
// Pipeline stages × micro-batches of the zero-bubble schedule, which each
// stage builds by simulating the whole pipeline (time ∝ stages × that).
inline constexpr int64_t kMaxZeroBubbleStageMicroBatches = int64_t{1} << 20;
// The most bytes of one checkpoint shard (a stage's weights and optimizer
// state as one safetensors file).
inline constexpr int64_t kMaxShardBytes = int64_t{16} << 30;

// `value` in single quotes, cut to kMaxQuotedBytes with "… (N bytes)" after
// it when longer, and bytes that are not printable ASCII as \xNN.
std::string Quote(absl::string_view value);

// INVALID_ARGUMENT "<field> is N bytes, at most <max>" when longer.
absl::Status CheckLength(absl::string_view field, absl::string_view value, size_t max);

// CheckLength, and not empty.
absl::Status CheckRequired(absl::string_view field, absl::string_view value, size_t max);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_INPUT_LIMITS_H_
