// JobManager's checkpoint shards: uploads checked against the plan and the
// stage's size, committed into the WeightStore, and the state a restarted
// worker fetches (job_manager.h).
#include "absl/strings/str_cat.h"
#include "common/checked_int.h"
#include "common/cost_model.h"
#include "common/job_spec.h"
#include "common/shard_digest.h"
#include "common/status_macros.h"
#include "server/job_manager.h"

namespace shardline::server {

absl::Status JobManager::CheckShard(const shardline::v1::ShardHeader& h) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(RunningJob * job, Find(h.job_id()));
  if (!job->running()) return absl::FailedPreconditionError(absl::StrCat("job ", h.job_id(), " is not running"));
  // Replica 0's tensor rank 0 sends the shards (the others' agree: their digests).
  RETURN_IF_ERROR(job->CheckSender(h.plan_epoch(), h.stage(), 0, 0, h.worker_id()).status());
  if (h.stages() != job->stages()) {
    return absl::InvalidArgumentError(absl::StrCat("shard says ", h.stages(), " stages; the plan has ",
                                                   job->stages()));
  }
  if (h.step() < 0 || h.step() > job->status().total_steps()) {
    return absl::InvalidArgumentError(absl::StrCat("shard of step ", h.step(), " is out of range"));
  }
  return absl::OkStatus();
}

namespace {

ShardKey KeyOf(const shardline::v1::ShardHeader& h) {
  return {h.job_id(), h.stage(), h.stages(), h.step(), h.plan_epoch()};
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardUploads::Writer>> JobManager::BeginShard(const shardline::v1::ShardHeader& h) {
  RETURN_IF_ERROR(CheckShard(h));
  // The declared size against what the stage holds, before a byte is stored.
  int64_t most = 0;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(RunningJob * job, Find(h.job_id()));
    // With early stopping, a validation step's version (and any later one)
    // commits once its pass is known: whether it is the best, and so that
    // a restart never starts after a pass that did not complete
    // (JobManager::NoteValidationVersions).
    if (common::StopsEarly(job->spec()) && common::EvaluatesAfter(job->spec(), h.step()) &&
        h.step() > job->status().val_step()) {
      weights_.AwaitPass(h.job_id(), h.step());
    }
    const int position = job->PositionOf(h.stage(), 0, 0);
    if (position >= job->status().stages_size()) return absl::InternalError("the job has no such position");
    const shardline::v1::StageStatus& stage = job->status().stages(position);
    const common::CheckedInt64 parameters =
        common::UnitRangeParameters(job->spec().model(), stage.unit_begin(), stage.unit_end());
    const int64_t optimizer_copies = job->spec().train().optimizer().kind() == "adamw" ? 2 : 1;
    // The safetensors header: a few hundred bytes per tensor, a few tensors per unit.
    most = (parameters * 4 * (1 + optimizer_copies) + int64_t{64 << 10} * (stage.unit_end() - stage.unit_begin() + 1))
               .value();
  }
  if (h.total_bytes() > most) {
    return absl::InvalidArgumentError(absl::StrCat("shard of stage ", h.stage(), " declares ", h.total_bytes(),
                                                   " bytes; its units' weights and optimizer state are at most ",
                                                   most));
  }
  return weights_.BeginUpload(KeyOf(h), h.total_bytes(), h.digest());
}

absl::StatusOr<bool> JobManager::CompleteShard(const shardline::v1::ShardHeader& h, ShardUploads::Writer& writer) {
  ASSIGN_OR_RETURN(const std::string path, writer.Finish());
  ASSIGN_OR_RETURN(const bool committed, weights_.Ingest(KeyOf(h), path, h.digest()));
  if (!committed) return false;
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(RunningJob * job, Find(h.job_id()));
  // A job that moved on since (a new epoch) took its committed step from
  // the WeightStore then (Fence).
  if (job->running() && h.step() > job->status().committed_step()) {
    const absl::StatusOr<WeightStore::Version> version = weights_.CommittedVersion(h.job_id());
    job->Commit(h.step(), version.ok() && version->step == h.step() ? version->bytes : 0);
    Save(*job);
    MaybeSucceed(*job);
    ReplanIfDue(*job);
  }
  return true;
}

absl::StatusOr<bool> JobManager::ReportShard(shardline::v1::ShardHeader h, const std::string& bytes) {
  h.set_total_bytes(static_cast<int64_t>(bytes.size()));
  h.set_digest(common::ShardDigest::Of(bytes));
  ASSIGN_OR_RETURN(std::unique_ptr<ShardUploads::Writer> writer, BeginShard(h));
  if (writer->offset() != 0) return absl::UnavailableError("an upload of this shard is under way");
  RETURN_IF_ERROR(writer->Append(bytes));
  return CompleteShard(h, *writer);
}

absl::StatusOr<common::SafetensorsContents> JobManager::FetchState(const shardline::v1::FetchStateRequest& r) {
  if (r.worker_id().empty()) return absl::InvalidArgumentError("worker_id is required");
  if (r.names().empty()) return absl::InvalidArgumentError("no tensor names");
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(RunningJob * job, Find(r.job_id()));
    if (!job->running()) return absl::FailedPreconditionError(absl::StrCat("job ", r.job_id(), " is not running"));
    RETURN_IF_ERROR(job->CheckSender(r.plan_epoch(), r.stage(), r.replica(), r.tensor_rank(), r.worker_id()).status());
  }
  return weights_.FetchTensors(r.job_id(), std::vector<std::string>(r.names().begin(), r.names().end()));
}

}  // namespace shardline::server
