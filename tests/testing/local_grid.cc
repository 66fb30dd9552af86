#include "tests/testing/local_grid.h"

#include <thread>

#include "common/status_macros.h"
#include "worker/backend/backend_factory.h"

namespace shardline::testing {

absl::StatusOr<std::unique_ptr<LocalGrid>> LocalGrid::Create(const shardline::v1::JobSpec& spec,
                                                             const std::vector<int>& cuts,
                                                             absl::Duration timeout) {
  std::unique_ptr<LocalGrid> grid(new LocalGrid());
  const int replicas = spec.parallel().data_parallel();
  std::vector<worker::collective::InProcessGroup*> groups;
  for (size_t s = 0; s <= cuts.size(); ++s) {
    ASSIGN_OR_RETURN(auto group, worker::collective::InProcessGroup::Create(replicas, timeout));
    groups.push_back(group.get());
    grid->groups_.push_back(std::move(group));
  }
  for (int r = 0; r < replicas; ++r) {
    ASSIGN_OR_RETURN(auto pipeline,
                     LocalPipeline::Create(spec, cuts, timeout, [] { return worker::CreateBackend("cpu", {1}); },
                                           r, groups));
    grid->replicas_.push_back(std::move(pipeline));
  }
  return grid;
}

absl::StatusOr<LocalGrid::Step> LocalGrid::RunStep(int64_t step) {
  std::vector<absl::StatusOr<std::vector<worker::runtime::StageStepResult>>> results(
      replicas_.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t r = 0; r < replicas_.size(); ++r) {
    threads.emplace_back([&, r] { results[r] = replicas_[r]->RunStep(step); });
  }
  for (std::thread& t : threads) t.join();
  Step out;
  for (auto& r : results) {
    RETURN_IF_ERROR(r.status());
    out.loss += r->back().loss;
    out.results.push_back(std::move(*r));
  }
  return out;
}

}  // namespace shardline::testing
