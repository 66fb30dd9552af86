// JobManager's submissions: a job from the seed's weights, from another
// job's committed weights (JobSpec.init.from_job) or from weights sent with
// it, and the starting weights of a submission cut short, removed at start.
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/job_manager.h"

namespace shardline::server {

void JobManager::ForgetUnownedCheckpoints() {
  for (const std::string& id : weights_.CommittedJobs()) {
    if (jobs_.count(id)) continue;
    absl::StatusOr<WeightStore::Version> version = weights_.CommittedVersion(id);
    if (!version.ok()) continue;
    // A step 0 is only ever the starting weights of a submission (another
    // job's copied, or a file sent with it): one stopped before its record
    // was saved, never acknowledged.
    if (version->step == 0) {
      absl::StatusOr<int64_t> freed = weights_.DeleteJob(id);
      LOG(WARNING) << "removed the starting weights kept for " << id << ", a submission cut short before it was "
                   << "saved (" << (freed.ok() ? absl::StrCat(*freed, " bytes") : freed.status().ToString()) << ")";
      continue;
    }
    LOG(WARNING) << "--state_dir holds a checkpoint of " << id << " (step " << version->step
                 << ") that no job record names; left in place";
  }
}

absl::StatusOr<shardline::v1::JobStatus> JobManager::Submit(shardline::v1::JobSpec spec, const std::string& by) {
  RETURN_IF_ERROR(common::ValidateJobSpec(spec));
  const std::string from = spec.init().from_job();
  if (from.empty()) return SubmitSeeded(std::move(spec), by, "", nullptr);
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckInitSource(spec));
  }
  return SubmitSeeded(std::move(spec), by, from, [&](const std::string& id) -> absl::StatusOr<int64_t> {
    absl::StatusOr<int64_t> seeded = weights_.SeedWeights(id, from);
    if (absl::IsNotFound(seeded.status())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "init.from_job: job ", from, " has no checkpoint to start from yet (one comes every "
          "checkpoint.every_steps steps and at its end)"));
    }
    return seeded;
  });
}

absl::StatusOr<shardline::v1::JobStatus> JobManager::SubmitWithWeights(shardline::v1::JobSpec spec,
                                                                       const std::string& by, const std::string& path,
                                                                       uint64_t digest, int64_t step) {
  RETURN_IF_ERROR(common::ValidateJobSpec(spec));
  if (!spec.init().from_job().empty()) {
    return absl::InvalidArgumentError(
        "init.from_job and the weights sent both say where the job starts: give one (shardctl submit without "
        "--init_weights, or without init.from_job)");
  }
  return SubmitSeeded(std::move(spec), by, common::kSentWeights, [&](const std::string& id) -> absl::StatusOr<int64_t> {
    RETURN_IF_ERROR(weights_.AdoptWeights(id, path, digest));
    return step;
  });
}

absl::StatusOr<shardline::v1::JobStatus> JobManager::SubmitSeeded(
    shardline::v1::JobSpec spec, const std::string& by, const std::string& init_from,
    const std::function<absl::StatusOr<int64_t>(const std::string& id)>& seed) {
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(const int64_t number, store_.TakeJobNumber());
    id = absl::StrCat("job-", number);
  }
  // The starting weights become this job's step 0 before the job exists
  // (outside the jobs' lock: the whole model is read and written).
  int64_t init_step = -1;
  if (seed) {
    ASSIGN_OR_RETURN(init_step, seed(id));
  }
  absl::MutexLock lock(&mu_);
  RunningJob job(id, std::move(spec), registry_.Now(), by);
  if (seed) {
    absl::StatusOr<WeightStore::Version> seeded = weights_.CommittedVersion(id);
    job.Commit(0, seeded.ok() ? seeded->bytes : 0);
    job.SetInit(init_from, init_step);
  }
  // Acknowledged only once durable.
  if (absl::Status saved = store_.SaveJob(job.spec(), job.status()); !saved.ok()) {
    if (seed) (void)weights_.DeleteJob(id);
    return saved;
  }
  if (seed) {
    LOG(INFO) << "job " << id << " starts from "
              << (init_from == common::kSentWeights ? "the weights sent with it" : "the weights of " + init_from)
              << (init_step >= 0 ? absl::StrCat(", step ", init_step) : "");
  }
  jobs_.emplace(id, std::move(job));
  order_.push_back(id);
  ScheduleLocked();
  return jobs_.at(id).status();
}

absl::Status JobManager::CheckInitSource(const shardline::v1::JobSpec& spec) {
  const std::string& from = spec.init().from_job();
  auto it = jobs_.find(from);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("init.from_job: no job ", from, " (shardctl get jobs lists them)"));
  }
  const shardline::v1::ModelSpec& theirs = it->second.spec().model();
  if (!google::protobuf::util::MessageDifferencer::Equals(theirs, spec.model())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "init.from_job: job ", from, "'s model (", theirs.ShortDebugString(), ") is not this spec's (",
        spec.model().ShortDebugString(), "): its weights fit only the same model"));
  }
  return absl::OkStatus();
}

}  // namespace shardline::server
