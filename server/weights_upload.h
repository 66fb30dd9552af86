// WeightsUpload reads SubmitJobWithWeights: a job spec and the weights it
// starts from, a safetensors file sent in chunks. The first message is
// checked before a byte is kept (the spec, init.from_job not set, a length
// the state directory has room for), the bytes go to a file under the
// uploads' directory (emptied at start) as they come, and once all have
// come, on a thread of its own (fsync and checks take a while for a large
// file): the file must be weights Shardline wrote for the spec's model
// (its __metadata__ "spec", no optimizer state); then it becomes the job's
// version of step 0 (JobManager::SubmitWithWeights) without a copy. Any
// failure removes the file and nothing else is kept.
#ifndef SHARDLINE_SERVER_WEIGHTS_UPLOAD_H_
#define SHARDLINE_SERVER_WEIGHTS_UPLOAD_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/shard_digest.h"
#include "server/job_manager.h"
#include "server/weight_store.h"
#include "shardline/v1/admin.pb.h"

namespace shardline::server {

class WeightsUpload final : public grpc::ServerReadReactor<shardline::v1::WeightsChunk> {
 public:
  // `who` submits (AdminService::Authorize); `submitted` is called with
  // the job once it is (the audit line).
  WeightsUpload(JobManager& jobs, WeightStore& weights, std::string who, shardline::v1::JobStatus* response,
                std::function<void(const shardline::v1::JobStatus&)> submitted);

  void OnReadDone(bool ok) override;
  void OnDone() override;

 private:
  // The first message: the spec and the length, checked; the file opened.
  absl::Status Begin();
  absl::Status Append(const std::string& bytes);
  // After the last byte: on completion_.
  void Complete();
  absl::Status Submit();
  void Fail(const absl::Status& status);

  JobManager& jobs_;
  WeightStore& weights_;
  const std::string who_;
  shardline::v1::JobStatus* const response_;
  const std::function<void(const shardline::v1::JobStatus&)> submitted_;
  shardline::v1::WeightsChunk chunk_;
  shardline::v1::JobSpec spec_;
  int64_t total_ = -1;  // -1: no first message yet
  int64_t written_ = 0;
  int fd_ = -1;
  std::string path_;
  common::ShardDigest digest_;
  std::thread completion_;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_WEIGHTS_UPLOAD_H_
