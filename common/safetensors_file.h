// SafetensorsFile is a safetensors file opened for reading tensors one at a
// time: Open reads and validates the header only (against the file's size),
// Read copies one tensor's bytes out with pread, so a reader of a few
// tensors of a large shard never holds the rest. Owns its descriptor.
// Thread-safe after Open (pread has no shared offset).
#ifndef SHARDLINE_COMMON_SAFETENSORS_FILE_H_
#define SHARDLINE_COMMON_SAFETENSORS_FILE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/safetensors.h"
#include "common/tensor.h"

namespace shardline::common {

class SafetensorsFile {
 public:
  // NOT_FOUND when the file cannot be opened; INVALID_ARGUMENT (naming the
  // path) for a header that is malformed or does not tile the file.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const SafetensorsIndex& index() const { return index_; }
  uint64_t size() const { return size_; }
  // NOT_FOUND for a name the file lacks; DATA_LOSS when the read comes short.
  absl::StatusOr<Tensor> Read(const std::string& name) const;
  // `out.size()` bytes of the data from `offset` (relative to the data's
  // start: an entry's begin). OUT_OF_RANGE past the file; DATA_LOSS short.
  absl::Status ReadData(uint64_t offset, absl::Span<char> out) const;

 private:
  SafetensorsFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  const std::string path_;
  const int fd_;
  uint64_t size_ = 0;
  SafetensorsIndex index_;
};

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_SAFETENSORS_FILE_H_
