// The safetensors file format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length, a JSON header mapping each tensor
// name to {dtype, shape, data_offsets} plus an optional "__metadata__" map of
// strings, padded with spaces to a multiple of 8 bytes, then the raw
// row-major little-endian data. Shardline writes tensors sorted by name, so
// the same weights always give the same bytes.
#ifndef SHARDLINE_COMMON_SAFETENSORS_H_
#define SHARDLINE_COMMON_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace shardline::common {

struct SafetensorsContents {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Where a tensor's bytes are in a file (offsets relative to the data).
struct SafetensorsEntry {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// A file's header: its tensors by name, its metadata, and where the data
// starts (8 + the header's length).
struct SafetensorsIndex {
  std::map<std::string, SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;
};

// The file's bytes. INVALID_ARGUMENT for an empty or "__metadata__" name.
absl::StatusOr<std::string> SerializeSafetensors(const SafetensorsContents& contents);
// What SerializeSafetensors writes before the tensors' data (the 8-byte
// length and the padded JSON header); the data follows in name order.
absl::StatusOr<std::string> SafetensorsHeader(const SafetensorsContents& contents);
// The same for tensors known by their entries' dtype and shape (offsets are
// given in name order, whatever `entries` says).
absl::StatusOr<std::string> SafetensorsHeader(const std::map<std::string, SafetensorsEntry>& entries,
                                              const std::map<std::string, std::string>& metadata);
// The header's length from a file's first 8 bytes; INVALID_ARGUMENT when
// it cannot fit a file of `file_size` bytes (or is absurd).
absl::StatusOr<uint64_t> SafetensorsHeaderSize(absl::string_view head, uint64_t file_size);
// The index of a file of `file_size` bytes from its first bytes (`head`
// holds at least the header), validated as ParseSafetensors does.
absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(absl::string_view head, uint64_t file_size);
// Parses and validates every field (header bounds, dtypes, shapes, offsets
// that tile the data exactly). INVALID_ARGUMENT describes the first problem.
absl::StatusOr<SafetensorsContents> ParseSafetensors(absl::string_view bytes);

// Serialize + WriteFileAtomically.
absl::Status WriteSafetensors(const std::string& path, const SafetensorsContents& contents);
// ReadFile + Parse; errors name the path.
absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_SAFETENSORS_H_
