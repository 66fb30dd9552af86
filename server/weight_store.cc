#include "server/weight_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/safetensors_file.h"
#include "common/shard_digest.h"
#include "common/status_macros.h"

namespace shardline::server {
namespace {

namespace fs = std::filesystem;

absl::Status ValidateKey(const ShardKey& k) {
  RETURN_IF_ERROR(ValidateJobId(k.job_id));
  if (k.shard_count < 1 || k.shard < 0 || k.shard >= k.shard_count || k.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", k.shard, " of ", k.shard_count, " at step ", k.step,
                                                   " is not a valid shard"));
  }
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", dir));
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot flush ", dir));
}

}  // namespace

absl::Status ValidateJobId(const std::string& job_id) {
  const bool ok = !job_id.empty() && job_id.size() <= 64 && job_id != "." && job_id != ".." &&
                  job_id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                           "0123456789._-") == std::string::npos;
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id '", job_id, "' must be 1-64 characters of [A-Za-z0-9._-]"));
  }
  return absl::OkStatus();
}

std::string WeightStore::StepDir(const std::string& job_id, int64_t step) const {
  return (fs::path(root_) / job_id / absl::StrCat("step-", step)).string();
}

std::string WeightStore::ShardPath(const std::string& job_id, int64_t step, int shard) const {
  return (fs::path(StepDir(job_id, step)) / absl::StrCat("shard-", shard, ".safetensors")).string();
}

absl::StatusOr<std::unique_ptr<ShardUploads::Writer>> WeightStore::BeginUpload(const ShardKey& k, int64_t total_bytes,
                                                                               uint64_t digest) {
  RETURN_IF_ERROR(ValidateKey(k));
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = jobs_.find(k.job_id);
    if (it != jobs_.end() && k.epoch < it->second.min_epoch) {
      return absl::FailedPreconditionError(absl::StrCat("plan epoch ", k.epoch, " of job ", k.job_id, " is stale"));
    }
  }
  return uploads_->Begin({k.job_id, k.epoch, k.shard, k.step}, total_bytes, digest);
}

absl::StatusOr<bool> WeightStore::Report(const ShardReport& r) {
  RETURN_IF_ERROR(ValidateKey(r.key));
  ASSIGN_OR_RETURN(std::string bytes, common::SerializeSafetensors(r.contents));
  const uint64_t digest = common::ShardDigest::Of(bytes);
  ASSIGN_OR_RETURN(std::unique_ptr<ShardUploads::Writer> writer,
                   BeginUpload(r.key, static_cast<int64_t>(bytes.size()), digest));
  if (writer->offset() != 0) return absl::UnavailableError("an upload of this shard is under way");
  RETURN_IF_ERROR(writer->Append(bytes));
  ASSIGN_OR_RETURN(std::string path, writer->Finish());
  return Ingest(r.key, path, digest);
}

absl::StatusOr<bool> WeightStore::Ingest(const ShardKey& k, const std::string& path, uint64_t digest) {
  RETURN_IF_ERROR(ValidateKey(k));
  // The header only: that it is a safetensors file whose tensors tile it.
  ASSIGN_OR_RETURN(std::unique_ptr<common::SafetensorsFile> file, common::SafetensorsFile::Open(path));
  if (file->index().entries.empty()) return absl::InvalidArgumentError("a shard with no tensors");
  file.reset();
  const std::string key = absl::StrCat("job ", k.job_id, " shard ", k.shard, " step ", k.step);

  absl::MutexLock lock(&mu_);
  Job& job = jobs_[k.job_id];
  if (k.epoch < job.min_epoch) {
    return absl::FailedPreconditionError(absl::StrCat(key, " is of plan epoch ", k.epoch, ", which is stale"));
  }
  if (k.step < job.committed_step) {
    return absl::FailedPreconditionError(absl::StrCat(
        key, " is older than the committed version (step ", job.committed_step, ")"));
  }
  const bool committed = k.step == job.committed_step;
  const int count = committed ? job.committed_shards
                              : job.shard_count.count(k.step) ? job.shard_count[k.step]
                                                              : k.shard_count;
  if (count != k.shard_count) {
    return absl::FailedPreconditionError(absl::StrCat(key, " says ", k.shard_count,
                                                      " shards; earlier reports said ", count));
  }
  if (committed || job.arrived[k.step].count(k.shard)) {
    // A retried shard: fine when it is the same, refused when it is not.
    ASSIGN_OR_RETURN(const uint64_t stored,
                     committed ? CommittedDigest(k.job_id, job, k.shard) : job.arrived[k.step][k.shard]);
    if (stored != digest) {
      return absl::FailedPreconditionError(absl::StrCat(key, " was already stored with other content"));
    }
    return false;
  }
  const std::string dir = StepDir(k.job_id, k.step);
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", dir));
  const std::string target = ShardPath(k.job_id, k.step, k.shard);
  if (::rename(path.c_str(), target.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot move ", path, " to ", target, ": ", std::strerror(errno)));
  }
  RETURN_IF_ERROR(FsyncDir(dir));
  job.shard_count[k.step] = k.shard_count;
  job.arrived[k.step][k.shard] = digest;
  if (static_cast<int>(job.arrived[k.step].size()) < k.shard_count) return false;
  if (AwaitsPass(job, k.step)) return false;  // complete: it commits once the pass is known
  RETURN_IF_ERROR(Commit(k.job_id, job, k.step));
  return true;
}

absl::StatusOr<uint64_t> WeightStore::CommittedDigest(const std::string& job_id, Job& job, int shard) {
  auto it = job.committed_digests.find(shard);
  if (it != job.committed_digests.end()) return it->second;
  ASSIGN_OR_RETURN(std::string bytes, common::ReadFile(ShardPath(job_id, job.committed_step, shard)));
  const uint64_t digest = common::ShardDigest::Of(bytes);
  job.committed_digests[shard] = digest;
  return digest;
}

void WeightStore::RemoveUnlessKept(const std::string& job_id, const Job& job, int64_t step) const {
  if (step < 0 || step == job.committed_step || step == job.kept_step || step == job.keep_next) return;
  std::error_code ignored;
  fs::remove_all(StepDir(job_id, step), ignored);
}

absl::Status WeightStore::Commit(const std::string& job_id, Job& job, int64_t step) {
  Manifest next = ManifestOf(job);
  next.committed_step = step;
  next.shards = job.shard_count[step];
  if (job.keep_next == step) {
    next.kept_step = step;
    next.kept_shards = next.shards;
  }
  RETURN_IF_ERROR(WriteManifest(job_id, next));
  const Manifest previous = ManifestOf(job);
  job.committed_step = step;
  job.committed_shards = next.shards;
  job.kept_step = next.kept_step;
  job.kept_shards = next.kept_shards;
  if (job.keep_next >= 0 && job.keep_next <= step) job.keep_next = -1;  // kept now, or it can no longer commit
  job.committed_digests = job.arrived[step];
  job.committed_bytes = VersionBytes(job_id, step, job.committed_shards);
  if (job.kept_step == step) job.kept_bytes = job.committed_bytes;
  // Older versions and steps that can no longer complete are obsolete.
  RemoveUnlessKept(job_id, job, previous.committed_step);
  RemoveUnlessKept(job_id, job, previous.kept_step);
  std::error_code ignored;
  for (auto it = job.shard_count.begin(); it != job.shard_count.end() && it->first <= step;) {
    if (it->first < step) fs::remove_all(StepDir(job_id, it->first), ignored);
    job.arrived.erase(it->first);
    it = job.shard_count.erase(it);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> WeightStore::DeleteJob(const std::string& job_id) {
  RETURN_IF_ERROR(ValidateJobId(job_id));
  if (job_id[0] == '.') {
    return absl::InvalidArgumentError(absl::StrCat("'", job_id, "' is the store's own directory, not a job's"));
  }
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  uploads_->Drop(job_id, kNever);
  const fs::path dir = fs::path(root_) / job_id, trash = fs::path(root_) / kDeletedDir, aside = trash / job_id;
  int64_t bytes = 0;
  std::error_code error;
  {
    absl::MutexLock lock(&mu_);
    Job& job = jobs_[job_id];
    job = Job{};
    job.min_epoch = kNever;
    if (!fs::exists(dir, error)) return 0;
    for (const auto& entry : fs::recursive_directory_iterator(dir, error)) {
      std::error_code ignored;
      if (entry.is_regular_file(ignored)) bytes += static_cast<int64_t>(entry.file_size(ignored));
    }
    fs::create_directories(trash, error);
    fs::rename(dir, aside, error);
    if (error) return absl::InternalError(absl::StrCat("cannot move ", dir.string(), " aside: ", error.message()));
    RETURN_IF_ERROR(FsyncDir(root_));
  }
  // Outside the lock: other jobs' shards and reads go on meanwhile.
  fs::remove_all(aside, error);
  if (error) return absl::InternalError(absl::StrCat("cannot remove ", aside.string(), ": ", error.message()));
  return bytes;
}

void WeightStore::DropUncommitted(const std::string& job_id, uint64_t epoch) {
  if (!ValidateJobId(job_id).ok()) return;
  uploads_->Drop(job_id, epoch);
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[job_id];
  job.min_epoch = std::max(job.min_epoch, epoch);
  job.shard_count.clear();
  job.arrived.clear();
  // The steps after the committed version run again, their passes too. A
  // version to keep commits when its step runs again.
  job.awaiting.clear();
  RemoveStepDirsExcept(job_id, {job.committed_step, job.kept_step});
}

void WeightStore::RemoveStepDirsExcept(const std::string& job_id, std::initializer_list<int64_t> keep) const {
  std::set<std::string> kept;
  for (int64_t step : keep) {
    if (step >= 0) kept.insert(StepDir(job_id, step));
  }
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(fs::path(root_) / job_id, error)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && absl::StartsWith(name, "step-") && !kept.count(entry.path().string())) {
      std::error_code ignored;
      fs::remove_all(entry.path(), ignored);
    }
  }
}

absl::StatusOr<const WeightStore::Job*> WeightStore::Committed(const std::string& job_id) {
  RETURN_IF_ERROR(ValidateJobId(job_id));
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.committed_step < 0) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " has no committed weights"));
  }
  return &it->second;
}

std::vector<std::string> WeightStore::CommittedJobs() {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [id, job] : jobs_) {
    if (job.committed_step >= 0) out.push_back(id);
  }
  return out;
}

absl::StatusOr<int64_t> WeightStore::CommittedStep(const std::string& job_id) {
  ASSIGN_OR_RETURN(const Version version, CommittedVersion(job_id));
  return version.step;
}

absl::StatusOr<WeightStore::Version> WeightStore::CommittedVersion(const std::string& job_id) {
  absl::ReaderMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const Job* job, Committed(job_id));
  const bool apart = job->kept_step >= 0 && job->kept_step != job->committed_step;
  return Version{job->committed_step, job->committed_bytes + (apart ? job->kept_bytes : 0), job->kept_step};
}

int64_t WeightStore::VersionBytes(const std::string& job_id, int64_t step, int shards) const {
  int64_t bytes = 0;
  for (int s = 0; s < shards; ++s) {
    std::error_code ignored;
    const uintmax_t size = fs::file_size(ShardPath(job_id, step, s), ignored);
    if (!ignored) bytes += static_cast<int64_t>(size);
  }
  return bytes;
}

}  // namespace shardline::server
