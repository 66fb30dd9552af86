// WeightStore's manifest (`<root>/<job>/manifest.json`): the committed
// version and the kept one, written at each commit, read back when the
// store opens (weight_store.h).
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "server/weight_store.h"

namespace shardline::server {

namespace fs = std::filesystem;

absl::StatusOr<WeightStore::Manifest> WeightStore::ReadManifest(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, common::ReadFile(path));
  google::protobuf::Struct manifest;
  if (!google::protobuf::util::JsonStringToMessage(text, &manifest).ok()) {
    return absl::DataLossError(absl::StrCat(path, " is not JSON"));
  }
  const auto& f = manifest.fields();
  auto step = f.find("committed_step"), shards = f.find("shards");
  if (step == f.end() || shards == f.end() || step->second.number_value() < 0 ||
      shards->second.number_value() < 1) {
    return absl::DataLossError(absl::StrCat(path, " lacks committed_step or shards"));
  }
  Manifest m{static_cast<int64_t>(step->second.number_value()), static_cast<int>(shards->second.number_value())};
  auto kept = f.find("kept_step"), kept_shards = f.find("kept_shards");
  if (kept != f.end()) {
    if (kept_shards == f.end() || kept->second.number_value() < 0 || kept_shards->second.number_value() < 1) {
      return absl::DataLossError(absl::StrCat(path, " has kept_step without kept_shards"));
    }
    m.kept_step = static_cast<int64_t>(kept->second.number_value());
    m.kept_shards = static_cast<int>(kept_shards->second.number_value());
  }
  return m;
}

absl::StatusOr<std::unique_ptr<WeightStore>> WeightStore::Open(const std::string& root) {
  std::error_code error;
  fs::create_directories(root, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", root, ": ", error.message()));
  ASSIGN_OR_RETURN(std::unique_ptr<ShardUploads> uploads, ShardUploads::Open((fs::path(root) / ".uploads").string()));
  std::unique_ptr<WeightStore> store(new WeightStore(root, std::move(uploads)));
  // What a deletion moved aside and had not removed when the process ended.
  fs::remove_all(fs::path(root) / kDeletedDir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot empty ", root, "/", kDeletedDir, ": ", error.message()));
  absl::MutexLock lock(&store->mu_);
  for (const auto& entry : fs::directory_iterator(root, error)) {
    const std::string job_id = entry.path().filename().string();
    const fs::path manifest = entry.path() / "manifest.json";
    if (!entry.is_directory() || job_id[0] == '.' || !ValidateJobId(job_id).ok() || !fs::exists(manifest)) continue;
    ASSIGN_OR_RETURN(const Manifest m, ReadManifest(manifest.string()));
    // Every shard the manifest names is there.
    auto check = [&](int64_t step, int shards, const char* which) -> absl::Status {
      for (int s = 0; s < shards; ++s) {
        if (!fs::exists(store->ShardPath(job_id, step, s))) {
          return absl::DataLossError(
              absl::StrCat("job ", job_id, ": shard ", s, " of step ", step, ", the ", which, " version, is missing"));
        }
      }
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(check(m.committed_step, m.shards, "committed"));
    if (m.kept_step >= 0) RETURN_IF_ERROR(check(m.kept_step, m.kept_shards, "kept"));
    Job& job = store->jobs_[job_id];
    job.committed_step = m.committed_step;
    job.committed_shards = m.shards;
    job.committed_bytes = store->VersionBytes(job_id, job.committed_step, job.committed_shards);
    job.kept_step = m.kept_step;
    job.kept_shards = m.kept_shards;
    if (m.kept_step >= 0) job.kept_bytes = store->VersionBytes(job_id, job.kept_step, job.kept_shards);
  }
  if (error) return absl::InternalError(absl::StrCat("cannot list ", root, ": ", error.message()));
  return store;
}

absl::Status WeightStore::WriteManifest(const std::string& job_id, const Manifest& m) const {
  std::string manifest = absl::StrCat("{\"committed_step\": ", m.committed_step, ", \"shards\": ", m.shards);
  if (m.kept_step >= 0) absl::StrAppend(&manifest, ", \"kept_step\": ", m.kept_step, ", \"kept_shards\": ", m.kept_shards);
  absl::StrAppend(&manifest, "}\n");
  return common::WriteFileAtomically((fs::path(root_) / job_id / "manifest.json").string(), manifest);
}

}  // namespace shardline::server
