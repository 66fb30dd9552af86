// Small file helpers with absl::Status errors that name the path.
#ifndef SHARDLINE_COMMON_FILE_UTIL_H_
#define SHARDLINE_COMMON_FILE_UTIL_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline::common {

// Writes `contents` to a temporary file beside `path`, fsyncs it and renames
// it over `path`, so readers see the old file or the new one, never a part.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);
// The whole file. NOT_FOUND when it cannot be opened.
absl::StatusOr<std::string> ReadFile(const std::string& path);
// At most `max_bytes` of it: INVALID_ARGUMENT when it holds more (read no
// further than one byte past the bound, so /dev/zero ends too).
absl::StatusOr<std::string> ReadFileBounded(const std::string& path, size_t max_bytes);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_FILE_UTIL_H_
