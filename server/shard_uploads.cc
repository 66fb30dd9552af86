#include "server/shard_uploads.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace shardline::server {
namespace {

namespace fs = std::filesystem;

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

ShardUploads::Upload::~Upload() {
  if (fd >= 0) ::close(fd);
  if (!path.empty()) ::unlink(path.c_str());  // gone already once the WeightStore took it
}

absl::StatusOr<std::unique_ptr<ShardUploads>> ShardUploads::Open(const std::string& dir) {
  std::error_code error;
  fs::remove_all(dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot empty ", dir, ": ", error.message()));
  fs::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  return std::unique_ptr<ShardUploads>(new ShardUploads(dir));
}

absl::StatusOr<std::unique_ptr<ShardUploads::Writer>> ShardUploads::Begin(const UploadKey& key, int64_t total_bytes,
                                                                          uint64_t digest) {
  absl::MutexLock lock(&mu_);
  auto it = uploads_.find(key);
  if (it != uploads_.end() && it->second->busy) {
    return absl::UnavailableError(absl::StrCat("an earlier stream of shard ", key.shard, " of step ", key.step,
                                               " is still open; try again"));
  }
  if (it != uploads_.end() && (it->second->total_bytes != total_bytes || it->second->digest != digest)) {
    uploads_.erase(it);  // another file under the same key: start over
    it = uploads_.end();
  }
  if (it == uploads_.end()) {
    auto upload = std::make_shared<Upload>();
    upload->key = key;
    upload->total_bytes = total_bytes;
    upload->digest = digest;
    const std::string path = absl::StrCat(dir_, "/", next_file_++, ".part");
    upload->fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (upload->fd < 0) return Errno("cannot create", path);
    upload->path = path;
    it = uploads_.emplace(key, std::move(upload)).first;
  }
  it->second->busy = true;
  return std::unique_ptr<Writer>(new Writer(*this, it->second));
}

void ShardUploads::Release(const std::shared_ptr<Upload>& upload) {
  absl::MutexLock lock(&mu_);
  upload->busy = false;
  if (!upload->dropped) return;  // kept for the next stream
  auto it = uploads_.find(upload->key);
  if (it != uploads_.end() && it->second == upload) uploads_.erase(it);
}

void ShardUploads::Drop(const std::string& job_id, uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  for (auto it = uploads_.begin(); it != uploads_.end();) {
    if (it->first.job_id != job_id || it->first.epoch >= epoch) {
      ++it;
    } else if (it->second->busy) {
      it->second->dropped = true;
      ++it;
    } else {
      it = uploads_.erase(it);
    }
  }
}

size_t ShardUploads::size() {
  absl::MutexLock lock(&mu_);
  return uploads_.size();
}

ShardUploads::Writer::~Writer() { owner_.Release(upload_); }

const UploadKey& ShardUploads::Writer::key() const { return upload_->key; }

int64_t ShardUploads::Writer::offset() const { return upload_->written; }

absl::Status ShardUploads::Writer::Append(absl::string_view bytes) {
  Upload& u = *upload_;
  if (u.written + static_cast<int64_t>(bytes.size()) > u.total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("shard data longer than the ", u.total_bytes,
                                                   " bytes its header declares"));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(u.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      u.dropped = true;  // the file's end is unknown now
      return Errno("cannot write", u.path);
    }
    done += static_cast<size_t>(n);
  }
  u.running.Update(bytes);
  u.written += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::StatusOr<std::string> ShardUploads::Writer::Finish() {
  Upload& u = *upload_;
  if (u.written != u.total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("shard stream ended after ", u.written, " of ",
                                                   u.total_bytes, " bytes"));
  }
  // Whatever happens next, this upload is over: the WeightStore moves the
  // file, or it goes with the upload.
  u.dropped = true;
  if (u.running.Finish() != u.digest) {
    return absl::DataLossError(absl::StrCat("shard ", u.key.shard, " of step ", u.key.step,
                                            " arrived with another digest than its header's (",
                                            absl::Hex(u.running.Finish()), " vs ", absl::Hex(u.digest),
                                            "): corrupted on the way"));
  }
  if (::fsync(u.fd) != 0) return Errno("cannot flush", u.path);
  return u.path;
}

}  // namespace shardline::server
