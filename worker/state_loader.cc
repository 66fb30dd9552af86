#include "worker/state_loader.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace shardline::worker {
namespace {

bool HoldsAll(const std::map<std::string, common::Tensor>& tensors, const shardline::v1::FetchStateRequest& request) {
  for (const std::string& name : request.names()) {
    if (!tensors.count(name)) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> LoadState(const shardline::v1::Assignment& a, const std::string& worker_id,
                                      runtime::ShardRuntime& runtime, runtime::PipelineStage& stage,
                                      StageReporter& reporter, StateCache& cache) {
  const int64_t step = a.first_step() - 1;
  shardline::v1::FetchStateRequest request;
  request.set_job_id(a.job_id());
  request.set_plan_epoch(a.plan_epoch());
  request.set_stage(a.stage());
  request.set_replica(a.replica());
  request.set_tensor_rank(a.tensor_rank());
  request.set_worker_id(worker_id);
  request.set_link_token(a.link_token());
  request.set_step(step);
  for (const nn::Parameter* p : runtime.parameters()) request.add_names(p->name);
  const std::string position = absl::StrCat("job ", a.job_id(), " stage ", a.stage(), " replica ", a.replica());

  // Nearest first. A source that fails leaves the next to overwrite
  // whatever it imported.
  if (std::shared_ptr<const ShardSnapshot> own = cache.Get(a.job_id(), step);
      own != nullptr && HoldsAll(own->tensors(), request)) {
    const absl::Status imported = stage.ImportState(own->tensors());
    if (imported.ok()) return std::string("its own memory");
    LOG(WARNING) << position << ": its own snapshot of step " << step << " does not fit: " << imported;
  }
  for (const std::string& twin : a.state_peers()) {
    absl::StatusOr<common::SafetensorsContents> state = reporter.FetchStateFromTwin(twin, request);
    absl::Status imported = state.status();
    if (imported.ok() && state->metadata["step"] != std::to_string(step)) {
      imported = absl::FailedPreconditionError(absl::StrCat("it holds step ", state->metadata["step"]));
    }
    if (imported.ok()) imported = stage.ImportState(state->tensors);
    if (imported.ok()) return absl::StrCat("its twin at ", twin);
    LOG(INFO) << position << ": not from its twin at " << twin << ": " << imported;
  }
  ASSIGN_OR_RETURN(common::SafetensorsContents state, reporter.FetchState(request));
  if (state.metadata["step"] != std::to_string(step)) {
    return absl::FailedPreconditionError(absl::StrCat("the committed version is of step ", state.metadata["step"],
                                                      ", not ", step, " as the assignment says"));
  }
  // Step 0 is a job's starting weights (Assignment.initial_weights): no
  // optimizer state.
  RETURN_IF_ERROR(step == 0 ? stage.ImportWeights(state.tensors) : stage.ImportState(state.tensors));
  return std::string("the coordinator");
}

}  // namespace shardline::worker
