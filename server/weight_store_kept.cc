// WeightStore's kept version: early stopping's best weights
// (train.early_stopping), kept beside the committed version until the job
// ends with them (weight_store.h).
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/weight_store.h"

namespace shardline::server {

absl::Status WeightStore::KeepVersion(const std::string& job_id, int64_t step) {
  RETURN_IF_ERROR(ValidateJobId(job_id));
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[job_id];
  if (step == job.kept_step || step == job.keep_next) return absl::OkStatus();
  int shards = 0;
  if (step == job.committed_step) {
    shards = job.committed_shards;
  } else if (step > job.committed_step) {
    job.keep_next = step;  // kept when it commits
    job.held.erase(step);
    return absl::OkStatus();
  } else if (auto held = job.held.find(step); held != job.held.end() && held->second > 0) {
    shards = held->second;
  } else {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, ": the version of step ", step,
                                                      " is no longer stored (the committed one is step ",
                                                      job.committed_step, "'s)"));
  }
  Manifest next = ManifestOf(job);
  next.kept_step = step;
  next.kept_shards = shards;
  RETURN_IF_ERROR(WriteManifest(job_id, next));
  const int64_t before = job.kept_step;
  job.kept_step = step;
  job.kept_shards = shards;
  job.kept_bytes = VersionBytes(job_id, step, shards);
  job.held.erase(step);
  RemoveUnlessKept(job_id, job, before);
  return absl::OkStatus();
}

void WeightStore::HoldVersion(const std::string& job_id, int64_t step) {
  if (!ValidateJobId(job_id).ok()) return;
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[job_id];
  if (step < job.committed_step || step == job.kept_step || step == job.keep_next) return;
  job.held.emplace(step, 0);
}

void WeightStore::ReleaseVersion(const std::string& job_id, int64_t step) {
  if (!ValidateJobId(job_id).ok()) return;
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[job_id];
  auto held = job.held.find(step);
  if (held == job.held.end()) return;
  const bool stored = held->second > 0;  // an older version no commit removes now
  job.held.erase(held);
  if (stored) RemoveUnlessKept(job_id, job, step);
}

absl::StatusOr<WeightStore::Version> WeightStore::RestoreKept(const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(const Job* committed, Committed(job_id));
    Job& job = jobs_[job_id];
    if (committed->kept_step >= 0 && committed->kept_step != committed->committed_step) {
      RETURN_IF_ERROR(WriteManifest(job_id, {job.kept_step, job.kept_shards, job.kept_step, job.kept_shards}));
      job.committed_step = job.kept_step;
      job.committed_shards = job.kept_shards;
      job.committed_bytes = job.kept_bytes;
      job.committed_digests.clear();  // read again when needed
      job.keep_next = -1;
      job.held.clear();
      job.shard_count.clear();
      job.arrived.clear();
      RemoveStepDirsExcept(job_id, {job.committed_step});
    }
  }
  return CommittedVersion(job_id);
}

}  // namespace shardline::server
