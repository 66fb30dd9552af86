// WeightStore is the coordinator's checkpoint store: each pipeline stage
// reports its shard (weights and optimizer state) at a step, and once every
// shard of a step has arrived that step becomes the job's committed global
// version: the version recovery restarts from and ExportWeights serves.
//
// Shards arrive as uploads (ShardUploads, under `<root>/.uploads`, written
// and fsynced by the stream that carries them, outside any lock here) and
// are moved into place by Ingest. On disk, under `<root>/<job>/`:
// `step-<N>/shard-<s>.safetensors` per shard and `manifest.json` naming
// the committed step, each made durable before it counts (fsync, rename),
// so a restarted coordinator reopens exactly what was committed. Shards are
// idempotent by (job, shard, step): the same shard again (same digest) is
// accepted and changes nothing; a different one for the same key is
// refused. Each job has an epoch fence (DropUncommitted): shards of older
// plan epochs are refused, also those whose upload began before it.
// Thread-safe; readers (export, recovery) share the lock and read only the
// tensors they need.
#ifndef SHARDLINE_SERVER_WEIGHT_STORE_H_
#define SHARDLINE_SERVER_WEIGHT_STORE_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/safetensors.h"
#include "common/safetensors_concat.h"
#include "common/safetensors_file.h"
#include "server/shard_uploads.h"

namespace shardline::server {

// Optimizer state travels in a shard under this prefix: "optimizer.m.<name>".
inline constexpr char kOptimizerPrefix[] = "optimizer.";

// Which shard a file or upload is.
struct ShardKey {
  std::string job_id;
  int shard = 0;        // pipeline stage index
  int shard_count = 0;  // stages in the plan
  int64_t step = 0;     // steps completed when the shard was taken
  uint64_t epoch = 0;   // the plan epoch that sent it
};

struct ShardReport {
  ShardKey key;
  common::SafetensorsContents contents;
};

class WeightStore {
 public:
  // Creates `root` if needed and reloads every job's committed manifest.
  static absl::StatusOr<std::unique_ptr<WeightStore>> Open(const std::string& root);

  // The upload of a shard of `total_bytes` bytes with ShardDigest
  // `digest`, resumed where an earlier stream left it. INVALID_ARGUMENT for
  // a malformed key; FAILED_PRECONDITION for an epoch behind the fence;
  // UNAVAILABLE while another stream writes it.
  absl::StatusOr<std::unique_ptr<ShardUploads::Writer>> BeginUpload(const ShardKey& key, int64_t total_bytes,
                                                                    uint64_t digest);
  // Stores the finished upload at `path` (ShardUploads::Writer::Finish;
  // moved into place) as `key`'s shard. Returns true when it completed
  // (committed) its step; a complete step a pass holds back (AwaitPass)
  // commits later. INVALID_ARGUMENT for a malformed key or file;
  // FAILED_PRECONDITION when it is behind the epoch fence, contradicts an
  // earlier shard (another digest for the same key, another shard count for
  // the step) or is older than the committed version.
  absl::StatusOr<bool> Ingest(const ShardKey& key, const std::string& path, uint64_t digest);
  // A shard from memory: serialized, uploaded and ingested (tests, tools).
  absl::StatusOr<bool> Report(const ShardReport& report);

  // Forgets the shards of steps after the committed version (a new plan
  // epoch of the job will report them again, perhaps on another cut), on
  // disk too, and refuses from now on shards and uploads of epochs before
  // `epoch` (the fence only rises).
  void DropUncommitted(const std::string& job_id, uint64_t epoch);

  // Removes a job's checkpoint (everything under `<root>/<job>/`, and its
  // uploads) and returns the bytes of the files removed (0 for a job with
  // none). The directory is first moved under `<root>/.deleted/`, which Open
  // empties, so a coordinator killed midway leaves no half-deleted
  // checkpoint behind. Shards and uploads of the job are refused from then
  // on (the fence rises to the end). INVALID_ARGUMENT for a malformed id.
  absl::StatusOr<int64_t> DeleteJob(const std::string& job_id);

  // The jobs with a committed version.
  std::vector<std::string> CommittedJobs();
  // The committed step of a job; NOT_FOUND before the first commit.
  absl::StatusOr<int64_t> CommittedStep(const std::string& job_id);
  // And the bytes its files take on disk (the shards, optimizer state
  // included; and the kept version's, KeepVersion), and the step of the
  // kept version (-1: none).
  struct Version {
    int64_t step = -1;
    int64_t bytes = 0;
    int64_t kept_step = -1;
  };
  absl::StatusOr<Version> CommittedVersion(const std::string& job_id);
  // Early stopping's best version (train.early_stopping), kept beside the
  // committed one until the job ends (and in the manifest across restarts).
  // AwaitPass(step): the validation pass after `step` is not known yet, so
  // neither the version of `step` nor a later one commits (a restart from
  // it would not run that pass again) until KeepVersion or ReleaseVersion
  // says what the pass made of it; complete ones commit then, in order.
  void AwaitPass(const std::string& job_id, int64_t step);
  // KeepVersion(step): the version of `step` is the one to keep, from when
  // it commits where it has not yet; the version kept before goes (unless
  // it is the committed one). FAILED_PRECONDITION when that version is
  // gone (older than the committed one). ReleaseVersion(step): its pass
  // is known and it is not the best. Both may commit awaiting versions
  // (an error: one could not be).
  absl::Status KeepVersion(const std::string& job_id, int64_t step);
  absl::Status ReleaseVersion(const std::string& job_id, int64_t step);
  // Makes the kept version the committed one (the job ends with its best
  // weights) and removes every other; returns the committed version.
  // Call after DropUncommitted: a shard arriving later would commit anew.
  absl::StatusOr<Version> RestoreKept(const std::string& job_id);

  // The committed version's weights (no optimizer state) as one
  // safetensors file, tensors by global name, with `metadata` and "step",
  // read a piece at a time (its shard files stay open: a newer commit
  // meanwhile does not change it).
  // With `kept`: the kept version's (KeepVersion), NOT_FOUND without one.
  absl::StatusOr<std::unique_ptr<common::SafetensorsConcat>> OpenWeights(const std::string& job_id,
                                                                         std::map<std::string, std::string> metadata,
                                                                         bool kept = false);
  // OpenWeights, read whole (tests, small models).
  absl::StatusOr<common::SafetensorsContents> ExportWeights(
      const std::string& job_id, const std::map<std::string, std::string>& metadata);
  // `to`'s version of step 0: the weights of `from`'s committed version (no
  // optimizer state), one shard, durable; returns `from`'s committed step.
  // A job that starts from another's weights (JobSpec.init.from_job) loads
  // them as a restart loads a checkpoint, and keeps them when `from` goes.
  // NOT_FOUND: `from` has no committed version; FAILED_PRECONDITION: `to`
  // has shards already.
  absl::StatusOr<int64_t> SeedWeights(const std::string& to, const std::string& from);
  // `to`'s version of step 0 from a weights file of `path` whose
  // ShardDigest is `digest` (moved into place; best written under
  // UploadPath). INVALID_ARGUMENT: no safetensors file, or one holding
  // optimizer state; FAILED_PRECONDITION: `to` has shards already.
  absl::Status AdoptWeights(const std::string& to, const std::string& path, uint64_t digest);
  // Where to write a file on its way in (the uploads' directory, emptied
  // when the store opens): `name` under it.
  std::string UploadPath(const std::string& name) const;
  // One shard of the committed version, optimizer state included (recovery).
  absl::StatusOr<common::SafetensorsContents> FetchShard(const std::string& job_id, int shard);
  // The tensors `names` of the committed version with their optimizer
  // state, from whichever shards hold them (recovery onto any cut), and
  // metadata "step". NOT_FOUND names a tensor the version lacks.
  absl::StatusOr<common::SafetensorsContents> FetchTensors(const std::string& job_id,
                                                           const std::vector<std::string>& names);

 private:
  // The committed version's shard files, open.
  struct Pinned {
    int64_t step = -1;
    std::vector<std::unique_ptr<common::SafetensorsFile>> shards;
  };
  absl::StatusOr<Pinned> Pin(const std::string& job_id, bool kept = false);
  // Their weights as one file with `metadata`.
  static absl::StatusOr<std::unique_ptr<common::SafetensorsConcat>> WeightsOf(
      const std::string& job_id, Pinned pinned, const std::map<std::string, std::string>& metadata);

  struct Job {
    int64_t committed_step = -1;
    int committed_shards = 0;
    int64_t committed_bytes = 0;                    // of its shard files
    std::map<int, uint64_t> committed_digests;      // known ones (a restart forgets them)
    std::map<int64_t, int> shard_count;             // pending steps: how many shards make them
    std::map<int64_t, std::map<int, uint64_t>> arrived;  // pending steps: digests of the shards stored
    uint64_t min_epoch = 0;                         // the fence
    // KeepVersion's: the kept version (-1: none), and the step to keep
    // once it commits.
    int64_t kept_step = -1;
    int kept_shards = 0;
    int64_t kept_bytes = 0;
    int64_t keep_next = -1;
    std::set<int64_t> awaiting;  // AwaitPass's steps: none from the first on commits
  };

  // Where DeleteJob moves a job's directory before removing it (Open
  // empties it).
  static constexpr char kDeletedDir[] = ".deleted";

  WeightStore(std::string root, std::unique_ptr<ShardUploads> uploads)
      : root_(std::move(root)), uploads_(std::move(uploads)) {}
  // The digest of a stored shard of the committed version.
  absl::StatusOr<uint64_t> CommittedDigest(const std::string& job_id, Job& job, int shard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string StepDir(const std::string& job_id, int64_t step) const;
  std::string ShardPath(const std::string& job_id, int64_t step, int shard) const;
  // The bytes of the shard files of `step` (0 for files that cannot be read).
  int64_t VersionBytes(const std::string& job_id, int64_t step, int shards) const;
  absl::Status Commit(const std::string& job_id, Job& job, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the complete version of `step` must wait for a pass (AwaitPass).
  static bool AwaitsPass(const Job& job, int64_t step) {
    return !job.awaiting.empty() && step >= *job.awaiting.begin();
  }
  // Commits, in order, the complete versions no pass holds back.
  absl::Status CommitReady(const std::string& job_id, Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What manifest.json names: the committed version and the kept one.
  struct Manifest {
    int64_t committed_step = -1;
    int shards = 0;
    int64_t kept_step = -1;  // KeepVersion's (-1: none)
    int kept_shards = 0;
  };
  static Manifest ManifestOf(const Job& job) {
    return {job.committed_step, job.committed_shards, job.kept_step, job.kept_shards};
  }
  static absl::StatusOr<Manifest> ReadManifest(const std::string& path);
  // Written durably before the Job's fields change to match it.
  absl::Status WriteManifest(const std::string& job_id, const Manifest& m) const;
  // Removes every step directory of the job but those of `keep` (-1s ignored).
  void RemoveStepDirsExcept(const std::string& job_id, std::initializer_list<int64_t> keep) const;
  // Removes the version of `step` unless it is the committed, kept or
  // to-be-kept one.
  void RemoveUnlessKept(const std::string& job_id, const Job& job, int64_t step) const;
  absl::StatusOr<const Job*> Committed(const std::string& job_id) ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::string root_;
  const std::unique_ptr<ShardUploads> uploads_;
  absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
};

// Job ids become directory names: 1–64 of [A-Za-z0-9._-], not "." or "..".
absl::Status ValidateJobId(const std::string& job_id);

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_WEIGHT_STORE_H_
