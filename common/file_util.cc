#include "common/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace shardline::common {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::string temp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", temp);
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      const absl::Status status = ErrnoError("cannot write", temp);
      ::close(fd);
      ::unlink(temp.c_str());
      return status;
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const absl::Status status = ErrnoError("cannot flush", temp);
    ::unlink(temp.c_str());
    return status;
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const absl::Status status = ErrnoError("cannot rename onto", path);
    ::unlink(temp.c_str());
    return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream content;
  content << file.rdbuf();
  if (file.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return content.str();
}

absl::StatusOr<std::string> ReadFileBounded(const std::string& path, size_t max_bytes) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string content(max_bytes + 1, '\0');
  file.read(content.data(), static_cast<std::streamsize>(content.size()));
  if (file.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  content.resize(static_cast<size_t>(file.gcount()));
  if (content.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is larger than ", max_bytes, " bytes"));
  }
  return content;
}

}  // namespace shardline::common
