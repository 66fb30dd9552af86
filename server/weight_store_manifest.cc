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
namespace {

namespace fs = std::filesystem;

struct Manifest {
  int64_t committed_step = -1;
  int shards = 0;
  int64_t kept_step = -1;  // WeightStore::KeepVersion's (-1: none)
  int kept_shards = 0;
};

absl::StatusOr<Manifest> ReadManifest(const std::string& path) {
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

}  // namespace

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
    Job& job = store->jobs_[job_id];
    job.committed_step = m.committed_step;
    job.committed_shards = m.shards;
    for (int s = 0; s < job.committed_shards; ++s) {
      if (!fs::exists(store->ShardPath(job_id, job.committed_step, s))) {
        return absl::DataLossError(absl::StrCat("job ", job_id, ": committed shard ", s,
                                                " of step ", job.committed_step, " is missing"));
      }
    }
    job.committed_bytes = store->VersionBytes(job_id, job.committed_step, job.committed_shards);
    if (m.kept_step >= 0) {
      for (int s = 0; s < m.kept_shards; ++s) {
        if (!fs::exists(store->ShardPath(job_id, m.kept_step, s))) {
          return absl::DataLossError(absl::StrCat("job ", job_id, ": shard ", s, " of step ", m.kept_step,
                                                  ", the kept version, is missing"));
        }
      }
      job.kept_step = m.kept_step;
      job.kept_shards = m.kept_shards;
      job.kept_bytes = store->VersionBytes(job_id, job.kept_step, job.kept_shards);
    }
  }
  if (error) return absl::InternalError(absl::StrCat("cannot list ", root, ": ", error.message()));
  return store;
}

absl::Status WeightStore::WriteManifest(const std::string& job_id, const Job& job) const {
  std::string manifest = absl::StrCat("{\"committed_step\": ", job.committed_step, ", \"shards\": ",
                                      job.committed_shards);
  if (job.kept_step >= 0) {
    absl::StrAppend(&manifest, ", \"kept_step\": ", job.kept_step, ", \"kept_shards\": ", job.kept_shards);
  }
  absl::StrAppend(&manifest, "}\n");
  return common::WriteFileAtomically((fs::path(root_) / job_id / "manifest.json").string(), manifest);
}

}  // namespace shardline::server
