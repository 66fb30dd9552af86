// A safetensors file as the coordinator reads an uploaded shard and a
// worker reads a fetched state: parsed and validated. Whatever the bytes,
// the reader refuses them or returns tensors that lie inside them.
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<shardline::common::SafetensorsContents> contents = shardline::common::ParseSafetensors(bytes);
  if (!contents.ok()) return 0;
  size_t total = 0;
  for (const auto& [name, tensor] : contents->tensors) total += tensor.byte_size();
  if (total > size) __builtin_trap();  // tensors must come from the file's bytes
  // What we parsed, we can write again and read back.
  absl::StatusOr<std::string> written = shardline::common::SerializeSafetensors(*contents);
  if (!written.ok() || !shardline::common::ParseSafetensors(*written).ok()) __builtin_trap();
  return 0;
}
