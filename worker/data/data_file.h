// DataFile: the one way a worker opens a job's data files (data.path,
// data.val_path). The spec comes from whoever may submit jobs, so the path
// is confined and the file bounded: a regular file only (a FIFO, device or
// directory is refused without blocking: it is opened non-blocking and
// checked first), resolved with symlinks under `root` when one is set (a
// relative path is taken from there; an absolute one outside it is
// refused), at most `max_bytes`. The file is read where windows are drawn
// (positional reads, never the whole file): its pages come from the page
// cache, shared by every worker on the machine, so a data set may be
// larger than memory. A file truncated or rewritten in place while a job
// reads it gives DATA_LOSS on the read that finds it short, never a fault:
// replace a data file by renaming a new one over it (the open file keeps
// reading the old one). Thread-safe after Open.
#ifndef SHARDLINE_WORKER_DATA_DATA_FILE_H_
#define SHARDLINE_WORKER_DATA_DATA_FILE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace shardline::worker::data {

struct DataAccess {
  std::string root;  // empty: any path (the single-process trainer)
  int64_t max_bytes = int64_t{1} << 40;
  // For work over a whole file (a token file's scan for its largest id).
  absl::Duration deadline = absl::Minutes(10);
  const std::atomic<bool>* cancelled = nullptr;  // set: that work stops with CANCELLED

  // CANCELLED once `cancelled` is set, DEADLINE_EXCEEDED once `deadline`
  // has passed since `start`.
  absl::Status Check(absl::Time start) const;
};

class DataFile {
 public:
  // PERMISSION_DENIED outside the root, NOT_FOUND when it cannot be
  // opened, INVALID_ARGUMENT for a non-regular or too large file,
  // CANCELLED when `access` is.
  static absl::StatusOr<std::unique_ptr<DataFile>> Open(const std::string& path, const DataAccess& access);
  ~DataFile();
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;

  // Bytes when it was opened.
  uint64_t size() const { return size_; }
  // Which file and version it opened: device, inode, size, modification
  // and status-change times, as fstat gave them then. A file written since
  // has another (its ctime moved; a writer cannot set that back), except
  // one rewritten to the same size within the clock tick of its last write.
  const std::string& identity() const { return identity_; }
  // Bytes [offset, offset + out.size()) into `out`: OUT_OF_RANGE beyond
  // size(); DATA_LOSS when the file no longer holds them (truncated since
  // it was opened) or cannot be read.
  absl::Status ReadAt(uint64_t offset, absl::Span<unsigned char> out) const;

 private:
  DataFile(int fd, uint64_t size, std::string path, std::string identity)
      : fd_(fd), size_(size), path_(std::move(path)), identity_(std::move(identity)) {}

  const int fd_;
  const uint64_t size_;
  const std::string path_;  // as the spec names it, for errors
  const std::string identity_;
};

}  // namespace shardline::worker::data

#endif  // SHARDLINE_WORKER_DATA_DATA_FILE_H_
