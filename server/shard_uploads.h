// ShardUploads holds the shard uploads in progress at the coordinator, as
// files under one directory (`<state_dir>/.uploads`), so that a stream that
// broke is resumed by the next stream of the same shard (job, epoch, stage,
// step) from the bytes already there. One stream writes a shard at a time.
// A finished upload is fsynced and checked (length, ShardDigest) before the
// WeightStore takes the file. The directory is emptied at Open: uploads of
// an earlier coordinator are of stale epochs. Thread-safe.
#ifndef SHARDLINE_SERVER_SHARD_UPLOADS_H_
#define SHARDLINE_SERVER_SHARD_UPLOADS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/shard_digest.h"

namespace shardline::server {

struct UploadKey {
  std::string job_id;
  uint64_t epoch = 0;
  int shard = 0;
  int64_t step = 0;
  bool operator<(const UploadKey& o) const {
    return std::tie(job_id, epoch, shard, step) < std::tie(o.job_id, o.epoch, o.shard, o.step);
  }
};

class ShardUploads {
 private:
  struct Upload;

 public:
  // One stream's hold on an upload. When it goes unfinished, the bytes
  // written stay for the next stream of the shard (unless dropped).
  class Writer {
   public:
    ~Writer();
    Writer(const Writer&) = delete;
    Writer& operator=(const Writer&) = delete;

    const UploadKey& key() const;
    // The bytes held so far: where this stream's data must start.
    int64_t offset() const;
    // INVALID_ARGUMENT past the declared length; INTERNAL for a write error.
    absl::Status Append(absl::string_view bytes);
    // Every byte there, fsynced, and its digest the declared one: the
    // file's path, for WeightStore::Ingest (which moves it away).
    // INVALID_ARGUMENT for a short file; DATA_LOSS for another digest (the
    // upload is discarded).
    absl::StatusOr<std::string> Finish();

   private:
    friend class ShardUploads;
    Writer(ShardUploads& owner, std::shared_ptr<Upload> upload) : owner_(owner), upload_(std::move(upload)) {}
    ShardUploads& owner_;
    std::shared_ptr<Upload> upload_;
  };

  static absl::StatusOr<std::unique_ptr<ShardUploads>> Open(const std::string& dir);

  // The writer of `key`'s shard of `total_bytes` bytes with ShardDigest
  // `digest`, at the bytes already held. UNAVAILABLE while another stream
  // writes it. An earlier upload of the key with another length or digest
  // is started over.
  absl::StatusOr<std::unique_ptr<Writer>> Begin(const UploadKey& key, int64_t total_bytes, uint64_t digest);
  // Forgets a job's uploads of epochs before `epoch` (an upload being
  // written goes when its writer does).
  void Drop(const std::string& job_id, uint64_t epoch);
  // Uploads held (for tests and metrics).
  size_t size();

 private:
  struct Upload {
    UploadKey key;
    std::string path;
    int fd = -1;
    int64_t total_bytes = 0;
    uint64_t digest = 0;
    int64_t written = 0;
    common::ShardDigest running;
    bool busy = false;     // a writer holds it
    std::atomic<bool> dropped{false};  // discard when the writer goes
    ~Upload();
  };

  explicit ShardUploads(std::string dir) : dir_(std::move(dir)) {}
  // The writer is gone: keep the upload for a resume, or forget it.
  void Release(const std::shared_ptr<Upload>& upload);

  const std::string dir_;
  absl::Mutex mu_;
  std::map<UploadKey, std::shared_ptr<Upload>> uploads_ ABSL_GUARDED_BY(mu_);
  uint64_t next_file_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_SHARD_UPLOADS_H_
