#include "worker/data/data_file.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/input_limits.h"
#include "common/status_macros.h"

namespace shardline::worker::data {
namespace {

// The canonical path (symlinks and .. resolved); NOT_FOUND when it does not exist.
absl::StatusOr<std::string> Canonical(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    return absl::NotFoundError(absl::StrCat("data.path: cannot open ", common::Quote(path), ": ", std::strerror(errno)));
  }
  return std::string(resolved);
}

// Closes its descriptor unless it was released.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

absl::Status DataAccess::Check(absl::Time start) const {
  if (cancelled != nullptr && cancelled->load()) return absl::CancelledError("reading data.path was cancelled");
  if (absl::Now() > start + deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat("reading data.path took longer than ", absl::FormatDuration(deadline)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DataFile>> DataFile::Open(const std::string& path, const DataAccess& access) {
  if (path.empty() || path.size() > common::kMaxPathBytes || path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("data.path: empty, too long, or holds a NUL byte");
  }
  RETURN_IF_ERROR(access.Check(absl::Now()));
  std::string candidate = path;
  if (!access.root.empty()) {
    absl::StatusOr<std::string> root = Canonical(access.root);
    if (!root.ok()) return absl::FailedPreconditionError(absl::StrCat("the worker's --data_root ", root.status().message()));
    if (path[0] != '/') candidate = absl::StrCat(*root, "/", path);
    absl::StatusOr<std::string> resolved = Canonical(candidate);
    if (!resolved.ok()) return resolved.status();
    if (*resolved != *root && !absl::StartsWith(*resolved, *root == "/" ? *root : absl::StrCat(*root, "/"))) {
      return absl::PermissionDeniedError(absl::StrCat("data.path ", common::Quote(path),
                                                      " is outside this worker's --data_root ", common::Quote(*root)));
    }
    candidate = *resolved;
  }
  // Non-blocking, so that opening a FIFO nobody writes returns at once.
  Fd fd(::open(candidate.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (fd.get() < 0) {
    return absl::NotFoundError(absl::StrCat("data.path: cannot open ", common::Quote(path), ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("data.path: cannot stat ", common::Quote(path), ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("data.path ", common::Quote(path), " is not a regular file"));
  }
  if (st.st_size > access.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("data.path ", common::Quote(path), " holds ", st.st_size,
                                                   " bytes, more than the ", access.max_bytes, " a worker reads"));
  }
  // (O_NONBLOCK does not change how a regular file reads.)
  std::string identity = absl::StrCat(st.st_dev, ":", st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
                                      st.st_mtim.tv_nsec, ":", st.st_ctim.tv_sec, ".", st.st_ctim.tv_nsec);
  return std::unique_ptr<DataFile>(
      new DataFile(fd.Release(), static_cast<uint64_t>(st.st_size), path, std::move(identity)));
}

DataFile::~DataFile() { ::close(fd_); }

absl::Status DataFile::ReadAt(uint64_t offset, absl::Span<unsigned char> out) const {
  if (offset > size_ || out.size() > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("data.path ", common::Quote(path_), ": bytes [", offset, ", ",
                                              offset + out.size(), ") are beyond its ", size_, " bytes"));
  }
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::DataLossError(absl::StrCat("data.path ", common::Quote(path_), ": cannot read ", out.size(),
                                              " bytes at ", offset, ": ", std::strerror(errno)));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(
          "data.path ", common::Quote(path_), " ends before byte ", offset + out.size(), " of the ", size_,
          " it held when the job opened it: it was truncated or rewritten in place (replace a data file by "
          "renaming a new one over it)"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace shardline::worker::data
