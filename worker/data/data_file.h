// ReadDataFile: the one way a worker reads a job's data file (data.path).
// The spec comes from whoever may submit jobs, so the path is confined and
// the read bounded: a regular file only (a FIFO, device or directory is
// refused without blocking: it is opened non-blocking and checked first),
// resolved with symlinks under `root` when one is set (a relative path is
// taken from there; an absolute one outside it is refused), at most
// `max_bytes`, read in pieces between which `cancelled` and the deadline
// are checked. Thread-safe.
#ifndef SHARDLINE_WORKER_DATA_DATA_FILE_H_
#define SHARDLINE_WORKER_DATA_DATA_FILE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shardline::worker::data {

struct DataAccess {
  std::string root;  // empty: any path (the single-process trainer)
  int64_t max_bytes = int64_t{4} << 30;
  absl::Duration deadline = absl::Minutes(10);
  const std::atomic<bool>* cancelled = nullptr;  // set: the read stops with CANCELLED
};

// The file's bytes. PERMISSION_DENIED outside the root, NOT_FOUND when it
// cannot be opened, INVALID_ARGUMENT for a non-regular or too large file,
// CANCELLED / DEADLINE_EXCEEDED when stopped.
absl::StatusOr<std::string> ReadDataFile(const std::string& path, const DataAccess& access);

}  // namespace shardline::worker::data

#endif  // SHARDLINE_WORKER_DATA_DATA_FILE_H_
