// SafetensorsConcat: the tensors of several safetensors files (those a
// filter keeps) as one safetensors file, read piece by piece: the header is
// made from the files' headers, each tensor's bytes come from its file with
// pread when asked for. A committed checkpoint's weights are exported, or
// copied as another job's start, with a megabyte in memory at a time, not
// the whole model. The files stay open: their bytes stay readable when a
// newer version's commit deletes them. Thread-compatible (Read is const
// and holds no offset).
#ifndef SHARDLINE_COMMON_SAFETENSORS_CONCAT_H_
#define SHARDLINE_COMMON_SAFETENSORS_CONCAT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/safetensors_file.h"

namespace shardline::common {

class SafetensorsConcat {
 public:
  // The tensors of `files` whose names `keep` accepts, in name order, with
  // `metadata`. DATA_LOSS for a name kept from two files.
  static absl::StatusOr<std::unique_ptr<SafetensorsConcat>> Create(
      std::vector<std::unique_ptr<SafetensorsFile>> files, const std::function<bool(const std::string&)>& keep,
      const std::map<std::string, std::string>& metadata);

  // The whole file's length in bytes.
  uint64_t size() const { return header_.size() + data_bytes_; }
  // Up to `max` bytes from `offset` (fewer at the end; none from size() on).
  absl::StatusOr<std::string> Read(uint64_t offset, size_t max) const;
  // Every byte: tests and small files.
  absl::StatusOr<std::string> ReadAll() const { return Read(0, size()); }

 private:
  // Where a tensor's bytes are: in this file's data, and in its source's.
  struct Piece {
    uint64_t begin = 0;  // in the data, after the header
    uint64_t end = 0;
    const SafetensorsFile* file = nullptr;
    uint64_t source_begin = 0;  // in `file`'s data
  };
  SafetensorsConcat() = default;

  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::string header_;
  std::vector<Piece> pieces_;  // by begin
  uint64_t data_bytes_ = 0;
};

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_SAFETENSORS_CONCAT_H_
