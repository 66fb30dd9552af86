// WeightStore is the coordinator's checkpoint store: each pipeline stage
// reports its shard (weights and optimizer state) at a step, and once every
// shard of a step has arrived that step becomes the job's committed global
// version: the version recovery restarts from and ExportWeights serves.
//
// On disk, under `<root>/<job>/`: `step-<N>/shard-<s>.safetensors` per
// report and `manifest.json` naming the committed step, each written
// atomically (temp file, fsync, rename), so a restarted coordinator reopens
// exactly what was committed. Reports are idempotent by (job, shard, step):
// the same report again is accepted and changes nothing; a different one
// for the same key is refused. Thread-safe.
#ifndef SHARDLINE_SERVER_WEIGHT_STORE_H_
#define SHARDLINE_SERVER_WEIGHT_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/safetensors.h"

namespace shardline::server {

// Optimizer state travels in a shard under this prefix: "optimizer.m.<name>".
inline constexpr char kOptimizerPrefix[] = "optimizer.";

struct ShardReport {
  std::string job_id;
  int shard = 0;        // pipeline stage index
  int shard_count = 0;  // stages in the plan
  int64_t step = 0;     // steps completed when the shard was taken
  common::SafetensorsContents contents;
};

class WeightStore {
 public:
  // Creates `root` if needed and reloads every job's committed manifest.
  static absl::StatusOr<std::unique_ptr<WeightStore>> Open(const std::string& root);

  // Stores a shard. Returns true when this report completed (committed) its
  // step. INVALID_ARGUMENT for a malformed report; FAILED_PRECONDITION when it
  // contradicts an earlier report (other content for the same key, another
  // shard count for the step) or is older than the committed version.
  absl::StatusOr<bool> Report(const ShardReport& report);

  // Forgets the shards of steps after the committed version (a new plan
  // epoch of the job will report them again, perhaps on another cut), on
  // disk too.
  void DropUncommitted(const std::string& job_id);

  // The committed step of a job; NOT_FOUND before the first commit.
  absl::StatusOr<int64_t> CommittedStep(const std::string& job_id);
  // The committed version's weights (no optimizer state) as one file's
  // contents, tensors by global name, with `metadata` added.
  absl::StatusOr<common::SafetensorsContents> ExportWeights(
      const std::string& job_id, const std::map<std::string, std::string>& metadata);
  // One shard of the committed version, optimizer state included (recovery).
  absl::StatusOr<common::SafetensorsContents> FetchShard(const std::string& job_id, int shard);
  // The tensors `names` of the committed version with their optimizer
  // state, from whichever shards hold them (recovery onto any cut), and
  // metadata "step". NOT_FOUND names a tensor the version lacks.
  absl::StatusOr<common::SafetensorsContents> FetchTensors(const std::string& job_id,
                                                           const std::vector<std::string>& names);

 private:
  struct Job {
    int64_t committed_step = -1;
    int committed_shards = 0;
    std::map<int64_t, int> shard_count;            // pending steps: how many shards make them
    std::map<int64_t, std::set<int>> arrived;      // pending steps: shards stored
  };

  explicit WeightStore(std::string root) : root_(std::move(root)) {}
  std::string StepDir(const std::string& job_id, int64_t step) const;
  std::string ShardPath(const std::string& job_id, int64_t step, int shard) const;
  absl::Status Commit(const std::string& job_id, Job& job, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<const Job*> Committed(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string root_;
  absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
};

// Job ids become directory names: 1–64 of [A-Za-z0-9._-], not "." or "..".
absl::Status ValidateJobId(const std::string& job_id);

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_WEIGHT_STORE_H_
