// JobManager's early stopping (train.early_stopping): the version of each
// validation step commits once its pass is known, the best one kept
// (WeightStore::KeepVersion), and the job ends once its patience runs out,
// with the best version as its last (job_manager.h).
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/validation_best.h"
#include "glog/logging.h"
#include "server/job_manager.h"

namespace shardline::server {

bool JobManager::NoteValidationVersions(RunningJob& job, int64_t val_before) {
  const shardline::v1::JobStatus& s = job.status();
  if (!common::StopsEarly(job.spec()) || s.val_step() <= val_before) return false;
  const std::string& id = s.job_id();
  for (int64_t step = val_before + 1; step <= s.val_step(); ++step) {
    if (!common::EvaluatesAfter(job.spec(), step)) continue;
    if (step != s.best_val_step()) {
      if (absl::Status released = weights_.ReleaseVersion(id, step); !released.ok()) {
        LOG(WARNING) << "job " << id << ": a version that waited for the pass after step " << step
                     << " did not commit: " << released.message();
      }
    } else if (absl::Status kept = weights_.KeepVersion(id, step); !kept.ok()) {
      LOG(WARNING) << "job " << id << ": the best validation pass's version is not kept: " << kept.message();
    }
  }
  // Versions that waited for these passes commit now.
  const absl::StatusOr<WeightStore::Version> version = weights_.CommittedVersion(id);
  if (!version.ok() || version->step <= s.committed_step()) return false;
  job.Commit(version->step, version->bytes);
  Save(job);
  return true;
}

bool JobManager::StoppedEarly(const RunningJob& job) {
  const common::ValidationBest best = job.validation_best();
  if (!common::StopsEarly(job.spec()) || !common::PatienceRunOut(job.spec().train().early_stopping(), best)) {
    return false;
  }
  // It ends once the best version is stored (it commits after its pass is
  // known: each position reports a step before it uploads its shard).
  const absl::StatusOr<WeightStore::Version> version = weights_.CommittedVersion(job.status().job_id());
  return version.ok() && version->kept_step == best.step;
}

std::string JobManager::EndAtBest(RunningJob& job, const std::string& message) {
  const std::string& id = job.status().job_id();
  const common::ValidationBest best = job.validation_best();
  const absl::StatusOr<WeightStore::Version> version = weights_.CommittedVersion(id);
  if (best.step <= 0 || !version.ok() || version->step == best.step) return message;
  // Why it ends with its latest weights after all, after `message`.
  auto instead = [&](const std::string& why) {
    LOG(WARNING) << "job " << id << ": " << why;
    return absl::StrCat(message, message.empty() ? "" : "; ", why);
  };
  if (version->kept_step != best.step) {
    return instead(absl::StrCat("the version of step ", best.step, " (the best validation pass) was not kept: the "
                                "weights are step ", version->step, "'s"));
  }
  const absl::StatusOr<WeightStore::Version> restored = weights_.RestoreKept(id);
  if (!restored.ok()) {
    return instead(absl::StrCat("the weights are step ", version->step, "'s: the best validation pass's could not "
                                "be restored (", restored.status().message(), ")"));
  }
  job.Commit(restored->step, restored->bytes);
  if (!message.empty()) return message;
  return absl::StrCat("the weights are step ", best.step, "'s, the best validation pass (",
                      common::PassMeasures(best.pass), ")");
}

}  // namespace shardline::server
