// WeightStore's kept version: early stopping's best weights
// (train.early_stopping), kept beside the committed version until the job
// ends with them (weight_store.h).
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/weight_store.h"

namespace shardline::server {

void WeightStore::AwaitPass(const std::string& job_id, int64_t step) {
  if (!ValidateJobId(job_id).ok()) return;
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[job_id];
  if (step > job.committed_step) job.awaiting.insert(step);
}

absl::Status WeightStore::KeepVersion(const std::string& job_id, int64_t step) {
  RETURN_IF_ERROR(ValidateJobId(job_id));
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[job_id];
  job.awaiting.erase(step);
  if (step == job.kept_step || step == job.keep_next) return CommitReady(job_id, job);
  if (step > job.committed_step) {
    job.keep_next = step;  // kept when it commits
    return CommitReady(job_id, job);
  }
  if (step < job.committed_step) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, ": the version of step ", step,
                                                      " is no longer stored (the committed one is step ",
                                                      job.committed_step, "'s)"));
  }
  Manifest next = ManifestOf(job);
  next.kept_step = step;
  next.kept_shards = job.committed_shards;
  RETURN_IF_ERROR(WriteManifest(job_id, next));
  const int64_t before = job.kept_step;
  job.kept_step = step;
  job.kept_shards = job.committed_shards;
  job.kept_bytes = job.committed_bytes;
  RemoveUnlessKept(job_id, job, before);
  return absl::OkStatus();
}

absl::Status WeightStore::ReleaseVersion(const std::string& job_id, int64_t step) {
  RETURN_IF_ERROR(ValidateJobId(job_id));
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[job_id];
  if (job.awaiting.erase(step) == 0) return absl::OkStatus();
  return CommitReady(job_id, job);
}

absl::Status WeightStore::CommitReady(const std::string& job_id, Job& job) {
  // Commit erases the pending steps up to the one it commits.
  for (auto it = job.shard_count.begin(); it != job.shard_count.end();) {
    const int64_t step = it->first;
    if (AwaitsPass(job, step)) break;
    if (step <= job.committed_step || static_cast<int>(job.arrived[step].size()) < it->second) {
      ++it;
      continue;
    }
    RETURN_IF_ERROR(Commit(job_id, job, step));
    it = job.shard_count.begin();
  }
  return absl::OkStatus();
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
      job.awaiting.clear();
      job.shard_count.clear();
      job.arrived.clear();
      RemoveStepDirsExcept(job_id, {job.committed_step});
    }
  }
  return CommittedVersion(job_id);
}

}  // namespace shardline::server
