// The safetensors file format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length, a JSON header mapping each tensor
// name to {dtype, shape, data_offsets} plus an optional "__metadata__" map of
// strings, padded with spaces to a multiple of 8 bytes, then the raw
// row-major little-endian data. Shardline writes tensors sorted by name, so
// the same weights always give the same bytes.
#ifndef SHARDLINE_COMMON_SAFETENSORS_H_
#define SHARDLINE_COMMON_SAFETENSORS_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace shardline::common {

struct SafetensorsContents {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// The file's bytes. INVALID_ARGUMENT for an empty or "__metadata__" name.
absl::StatusOr<std::string> SerializeSafetensors(const SafetensorsContents& contents);
// Parses and validates every field (header bounds, dtypes, shapes, offsets
// that tile the data exactly). INVALID_ARGUMENT describes the first problem.
absl::StatusOr<SafetensorsContents> ParseSafetensors(absl::string_view bytes);

// Serialize + WriteFileAtomically.
absl::Status WriteSafetensors(const std::string& path, const SafetensorsContents& contents);
// ReadFile + Parse; errors name the path.
absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_SAFETENSORS_H_
