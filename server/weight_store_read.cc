// WeightStore's readers: a committed version pinned and read as one
// stream (exports), copied or adopted as another job's starting weights,
// and the shards and tensors restarting positions fetch.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors_file.h"
#include "common/shard_digest.h"
#include "common/status_macros.h"
#include "server/weight_store.h"

namespace shardline::server {

namespace fs = std::filesystem;

absl::StatusOr<WeightStore::Pinned> WeightStore::Pin(const std::string& job_id, bool kept) {
  absl::ReaderMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const Job* job, Committed(job_id));
  if (kept && job->kept_step < 0) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " keeps no best validation pass's version (it needs "
                                            "train.early_stopping and one validation pass stored)"));
  }
  Pinned out;
  out.step = kept ? job->kept_step : job->committed_step;
  const int shards = kept ? job->kept_shards : job->committed_shards;
  for (int s = 0; s < shards; ++s) {
    ASSIGN_OR_RETURN(std::unique_ptr<common::SafetensorsFile> shard,
                     common::SafetensorsFile::Open(ShardPath(job_id, out.step, s)));
    out.shards.push_back(std::move(shard));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<common::SafetensorsConcat>> WeightStore::WeightsOf(
    const std::string& job_id, Pinned pinned, const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::unique_ptr<common::SafetensorsConcat>> file = common::SafetensorsConcat::Create(
      std::move(pinned.shards), [](const std::string& name) { return !absl::StartsWith(name, kOptimizerPrefix); },
      metadata);
  if (!file.ok()) return absl::Status(file.status().code(), absl::StrCat("job ", job_id, ": ", file.status().message()));
  return file;
}

absl::StatusOr<std::unique_ptr<common::SafetensorsConcat>> WeightStore::OpenWeights(
    const std::string& job_id, std::map<std::string, std::string> metadata, bool kept) {
  ASSIGN_OR_RETURN(Pinned pinned, Pin(job_id, kept));
  metadata["step"] = std::to_string(pinned.step);
  return WeightsOf(job_id, std::move(pinned), metadata);
}

absl::StatusOr<common::SafetensorsContents> WeightStore::ExportWeights(
    const std::string& job_id, const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(std::unique_ptr<common::SafetensorsConcat> file, OpenWeights(job_id, metadata));
  ASSIGN_OR_RETURN(const std::string bytes, file->ReadAll());
  return common::ParseSafetensors(bytes);
}

absl::StatusOr<int64_t> WeightStore::SeedWeights(const std::string& to, const std::string& from) {
  RETURN_IF_ERROR(ValidateJobId(to));
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = jobs_.find(to);
    if (it != jobs_.end() && (it->second.committed_step >= 0 || !it->second.arrived.empty())) {
      return absl::FailedPreconditionError(absl::StrCat("job ", to, " has shards already"));
    }
  }
  ASSIGN_OR_RETURN(Pinned pinned, Pin(from));
  const int64_t step = pinned.step;
  // to's step 0; from's step stays in init_step.
  ASSIGN_OR_RETURN(std::unique_ptr<common::SafetensorsConcat> weights,
                   WeightsOf(from, std::move(pinned),
                             {{"init_from", from}, {"init_step", std::to_string(step)}, {"step", "0"}}));
  // A megabyte at a time into the uploads' directory (emptied at start, so
  // a coordinator stopped midway leaves nothing), then in as an upload.
  const std::string path = UploadPath(absl::StrCat("seed-", to, ".part"));
  common::ShardDigest digest;
  absl::Status written = [&]() -> absl::Status {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
    absl::Status status;
    for (uint64_t offset = 0; status.ok() && offset < weights->size();) {
      absl::StatusOr<std::string> chunk = weights->Read(offset, 1 << 20);
      if (!chunk.ok()) {
        status = chunk.status();
        break;
      }
      digest.Update(*chunk);
      for (size_t done = 0; status.ok() && done < chunk->size();) {
        const ssize_t n = ::write(fd, chunk->data() + done, chunk->size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) status = absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
        if (n > 0) done += static_cast<size_t>(n);
      }
      offset += chunk->size();
    }
    if (status.ok() && ::fsync(fd) != 0) status = absl::InternalError(absl::StrCat("cannot flush ", path));
    ::close(fd);
    return status;
  }();
  if (written.ok()) written = AdoptWeights(to, path, digest.Finish());
  if (!written.ok()) {
    std::error_code ignored;
    fs::remove(path, ignored);
    return written;
  }
  return step;
}

absl::Status WeightStore::AdoptWeights(const std::string& to, const std::string& path, uint64_t digest) {
  RETURN_IF_ERROR(ValidateJobId(to));
  {
    ASSIGN_OR_RETURN(std::unique_ptr<common::SafetensorsFile> file, common::SafetensorsFile::Open(path));
    for (const auto& [name, entry] : file->index().entries) {
      if (absl::StartsWith(name, kOptimizerPrefix)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the weights hold optimizer state (", name, "): a job starts with a fresh optimizer"));
      }
    }
  }
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = jobs_.find(to);
    if (it != jobs_.end() && (it->second.committed_step >= 0 || !it->second.arrived.empty())) {
      return absl::FailedPreconditionError(absl::StrCat("job ", to, " has shards already"));
    }
  }
  ASSIGN_OR_RETURN(const bool committed,
                   Ingest({to, /*shard=*/0, /*shard_count=*/1, /*step=*/0, /*epoch=*/0}, path, digest));
  if (!committed) return absl::InternalError(absl::StrCat("job ", to, ": its weights of step 0 did not commit"));
  return absl::OkStatus();
}

std::string WeightStore::UploadPath(const std::string& name) const {
  return (fs::path(root_) / ".uploads" / name).string();
}

absl::StatusOr<common::SafetensorsContents> WeightStore::FetchShard(const std::string& job_id,
                                                                     int shard) {
  absl::ReaderMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const Job* job, Committed(job_id));
  if (shard < 0 || shard >= job->committed_shards) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job_id, " has ", job->committed_shards,
                                                   " shards, not ", shard));
  }
  return common::ReadSafetensors(ShardPath(job_id, job->committed_step, shard));
}

absl::StatusOr<common::SafetensorsContents> WeightStore::FetchTensors(const std::string& job_id,
                                                                       const std::vector<std::string>& names) {
  absl::ReaderMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const Job* job, Committed(job_id));
  const std::set<std::string> wanted(names.begin(), names.end());
  auto is_wanted = [&](const std::string& name) {
    if (wanted.count(name)) return true;
    if (!absl::StartsWith(name, kOptimizerPrefix)) return false;
    // "optimizer.<kind>.<name>"
    const size_t dot = name.find('.', sizeof(kOptimizerPrefix) - 1);
    return dot != std::string::npos && wanted.count(name.substr(dot + 1));
  };
  common::SafetensorsContents out;
  out.metadata["step"] = std::to_string(job->committed_step);
  for (int s = 0; s < job->committed_shards; ++s) {
    ASSIGN_OR_RETURN(std::unique_ptr<common::SafetensorsFile> shard,
                     common::SafetensorsFile::Open(ShardPath(job_id, job->committed_step, s)));
    for (const auto& [name, entry] : shard->index().entries) {
      if (!is_wanted(name) || out.tensors.count(name)) continue;
      ASSIGN_OR_RETURN(common::Tensor tensor, shard->Read(name));
      out.tensors.emplace(name, std::move(tensor));
    }
  }
  for (const std::string& name : wanted) {
    if (!out.tensors.count(name)) {
      return absl::NotFoundError(absl::StrCat("job ", job_id, ": the committed version (step ", job->committed_step,
                                              ") has no tensor ", name));
    }
  }
  return out;
}

}  // namespace shardline::server
