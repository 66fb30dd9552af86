#include "common/safetensors_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::common {
namespace {

// Reads exactly `n` bytes at `offset`; DATA_LOSS when the file ends first.
absl::Status ReadAt(int fd, const std::string& path, uint64_t offset, size_t n, char* out) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return absl::DataLossError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    if (got == 0) return absl::DataLossError(absl::StrCat(path, " ends at ", offset + done));
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status Named(const std::string& path, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(path, fd));
  struct stat st;
  if (::fstat(fd, &st) != 0) return absl::InternalError(absl::StrCat("cannot stat ", path));
  file->size_ = static_cast<uint64_t>(st.st_size);
  std::string head(8, '\0');
  if (file->size_ >= 8) RETURN_IF_ERROR(ReadAt(fd, path, 0, 8, head.data()));
  absl::StatusOr<uint64_t> header_size = SafetensorsHeaderSize(head, file->size_);
  if (!header_size.ok()) return Named(path, header_size.status());
  head.resize(8 + *header_size);
  RETURN_IF_ERROR(ReadAt(fd, path, 8, *header_size, head.data() + 8));
  absl::StatusOr<SafetensorsIndex> index = ParseSafetensorsIndex(head, file->size_);
  if (!index.ok()) return Named(path, index.status());
  file->index_ = *std::move(index);
  return file;
}

SafetensorsFile::~SafetensorsFile() { ::close(fd_); }

absl::StatusOr<Tensor> SafetensorsFile::Read(const std::string& name) const {
  auto it = index_.entries.find(name);
  if (it == index_.entries.end()) return absl::NotFoundError(absl::StrCat(path_, " has no tensor ", name));
  const SafetensorsEntry& entry = it->second;
  ASSIGN_OR_RETURN(Tensor tensor, Tensor::Zeros(entry.dtype, entry.shape));
  RETURN_IF_ERROR(ReadAt(fd_, path_, index_.data_offset + entry.begin, entry.end - entry.begin,
                         static_cast<char*>(tensor.raw_data())));
  return tensor;
}

absl::Status SafetensorsFile::ReadData(uint64_t offset, absl::Span<char> out) const {
  if (offset > size_ - index_.data_offset || out.size() > size_ - index_.data_offset - offset) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": ", out.size(), " bytes at ", offset, " are past its data"));
  }
  return ReadAt(fd_, path_, index_.data_offset + offset, out.size(), out.data());
}

}  // namespace shardline::common
