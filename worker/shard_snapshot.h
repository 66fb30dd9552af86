// A ShardSnapshot is a stage's shard taken at a step boundary: its tensors
// (weights and optimizer state) copied to host memory, so training goes on
// with its own, and the safetensors file they make, read in pieces by the
// upload without the file ever being assembled in memory. ComputeDigest
// hashes that file (ShardDigest, ~0.2 s per GiB) on whichever thread calls
// it: the uploader's, not the training's. Not thread-safe; read-only once
// the digest is computed.
#ifndef SHARDLINE_WORKER_SHARD_SNAPSHOT_H_
#define SHARDLINE_WORKER_SHARD_SNAPSHOT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors.h"
#include "shardline/v1/coordinator.pb.h"

namespace shardline::worker {

class ShardSnapshot {
 public:
  // `header` names the shard (job, epoch, stage, stages, step); its
  // total_bytes is filled in here, its digest by ComputeDigest.
  // INVALID_ARGUMENT for contents safetensors cannot hold.
  static absl::StatusOr<std::unique_ptr<ShardSnapshot>> Create(shardline::v1::ShardHeader header,
                                                               common::SafetensorsContents contents);

  const shardline::v1::ShardHeader& header() const { return header_; }
  int64_t size() const { return header_.total_bytes(); }
  // Replaces `out` with the file's bytes [offset, offset + n) (n is cut at
  // the end of the file).
  void Read(int64_t offset, size_t n, std::string* out) const;
  // The whole file (tests, small shards).
  std::string Bytes() const;
  // Computes, records in the header and returns the file's ShardDigest.
  uint64_t ComputeDigest();
  // The tensors by name (what a restart from this step imports).
  const std::map<std::string, common::Tensor>& tensors() const { return contents_.tensors; }
  // The tensors back, to be written over by the next checkpoint's snapshot.
  std::map<std::string, common::Tensor> TakeTensors() && { return std::move(contents_.tensors); }

 private:
  ShardSnapshot() = default;

  shardline::v1::ShardHeader header_;
  common::SafetensorsContents contents_;
  std::string prefix_;  // the 8-byte length and the JSON header
  // The file as pieces: the prefix, then each tensor's bytes in name order,
  // with where each starts in the file.
  std::vector<int64_t> starts_;
  std::vector<absl::string_view> pieces_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_SHARD_SNAPSHOT_H_
