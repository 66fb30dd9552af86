#include "tests/testing/local_grid.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/eval_shares.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "worker/backend/backend_factory.h"

namespace shardline::testing {

absl::StatusOr<std::unique_ptr<LocalGrid>> LocalGrid::Create(const shardline::v1::JobSpec& spec_asked,
                                                             const std::vector<int>& cuts,
                                                             absl::Duration timeout, int folded_replicas) {
  std::unique_ptr<LocalGrid> grid(new LocalGrid());
  const int asked = std::max(1, spec_asked.parallel().data_parallel());
  if (folded_replicas == 0) folded_replicas = asked;
  if (folded_replicas < 1 || asked % folded_replicas != 0) {
    return absl::InvalidArgumentError(absl::StrCat(folded_replicas, " replicas do not divide ", asked));
  }
  const shardline::v1::JobSpec spec = common::FoldReplicas(spec_asked, folded_replicas);
  const int groups = asked / folded_replicas;
  const int replicas = spec.parallel().data_parallel();
  const int tensor_ranks = std::max(1, spec.parallel().tensor_parallel());
  const size_t stages = cuts.size() + 1;
  auto make_groups = [&](int ranks, size_t count) -> absl::StatusOr<std::vector<worker::collective::InProcessGroup*>> {
    std::vector<worker::collective::InProcessGroup*> out;
    for (size_t i = 0; i < count; ++i) {
      ASSIGN_OR_RETURN(auto group, worker::collective::InProcessGroup::Create(ranks, timeout));
      out.push_back(group.get());
      grid->groups_.push_back(std::move(group));
    }
    return out;
  };
  // By tensor rank: the data-parallel group of each stage; by replica: the
  // tensor-parallel group of each stage.
  std::vector<std::vector<worker::collective::InProcessGroup*>> data_groups, tensor_groups;
  for (int k = 0; k < tensor_ranks; ++k) {
    ASSIGN_OR_RETURN(auto groups, make_groups(replicas, stages));
    data_groups.push_back(std::move(groups));
  }
  for (int r = 0; r < replicas; ++r) {
    ASSIGN_OR_RETURN(auto groups, make_groups(tensor_ranks, stages));
    tensor_groups.push_back(std::move(groups));
  }
  for (int r = 0; r < replicas; ++r) {
    grid->positions_.emplace_back();
    for (int k = 0; k < tensor_ranks; ++k) {
      ASSIGN_OR_RETURN(auto pipeline,
                       LocalPipeline::Create(spec, cuts, timeout, [] { return worker::CreateBackend("cpu", {1}); }, r,
                                             data_groups[k], k, tensor_groups[r], groups));
      grid->positions_.back().push_back(std::move(pipeline));
    }
  }
  return grid;
}

template <typename Result>
std::vector<absl::StatusOr<Result>> LocalGrid::OnEveryPosition(
    const std::function<absl::StatusOr<Result>(LocalPipeline&)>& run) {
  const int d = replicas(), t = tensor_ranks();
  std::vector<absl::StatusOr<Result>> results(static_cast<size_t>(d * t), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < d; ++r) {
    for (int k = 0; k < t; ++k) {
      threads.emplace_back([&, r, k] { results[r * t + k] = run(*positions_[r][k]); });
    }
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

absl::StatusOr<LocalGrid::Step> LocalGrid::RunStep(int64_t step) {
  const int d = replicas(), t = tensor_ranks();
  auto results = OnEveryPosition<std::vector<worker::runtime::StageStepResult>>(
      [step](LocalPipeline& position) { return position.RunStep(step); });
  Step out;
  for (auto& result : results) RETURN_IF_ERROR(result.status());
  for (int r = 0; r < d; ++r) {
    const worker::runtime::StageStepResult& last = results[r * t]->back();
    if (last.group_losses.empty()) out.loss += last.loss;
    for (double group_loss : last.group_losses) out.loss += group_loss;
    out.results.push_back(*results[r * t]);
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<worker::runtime::StageEvalResult>>> LocalGrid::Evaluate(int64_t step) {
  const int d = replicas(), t = tensor_ranks();
  auto results = OnEveryPosition<std::vector<worker::runtime::StageEvalResult>>(
      [step](LocalPipeline& position) { return position.Evaluate(step); });
  std::vector<std::vector<worker::runtime::StageEvalResult>> last(static_cast<size_t>(d));
  for (int r = 0; r < d; ++r) {
    for (int k = 0; k < t; ++k) {
      RETURN_IF_ERROR(results[r * t + k].status());
      last[r].push_back(results[r * t + k]->back());
    }
  }
  return last;
}

absl::StatusOr<LocalGrid::Validation> LocalGrid::Validate(int64_t step) {
  ASSIGN_OR_RETURN(const auto results, Evaluate(step));
  Validation v;
  std::vector<absl::Span<const double>> shares;
  for (size_t r = 0; r < results.size(); ++r) {
    const worker::runtime::StageEvalResult& first = results[r][0];
    for (const worker::runtime::StageEvalResult& rank : results[r]) {
      if (rank.losses != first.losses || rank.matches != first.matches || rank.windows != first.windows) {
        return absl::InternalError(absl::StrCat("the tensor ranks of replica ", r, " disagree"));
      }
    }
    shares.push_back(first.losses);
    v.windows += first.windows;
    v.matches += first.matches;
    v.replica_windows.push_back(first.windows);
  }
  ASSIGN_OR_RETURN(v.loss, common::SumEvalShares(shares));
  return v;
}

absl::StatusOr<std::map<std::string, common::Tensor>> LocalGrid::ExportWeights() {
  std::map<std::string, common::Tensor> all;
  LocalPipeline& first = position(0, 0);
  for (int s = 0; s < first.stages(); ++s) {
    const std::vector<worker::nn::Parameter*> params = first.runtime(s).parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      ASSIGN_OR_RETURN(common::Tensor global, common::Tensor::Zeros(common::DType::kF32, params[i]->global_shape));
      for (int k = 0; k < (params[i]->slice.whole() ? 1 : tensor_ranks()); ++k) {
        worker::runtime::ShardRuntime& runtime = position(0, k).runtime(s);
        worker::nn::Parameter* p = runtime.parameters()[i];
        std::vector<float> local(p->count());
        RETURN_IF_ERROR(runtime.backend().CopyToHost(worker::DeviceSpan<const float>(p->v()), absl::MakeSpan(local)));
        worker::nn::PutSlice(local, p->global_shape, p->slice, global.values<float>());
      }
      all.emplace(params[i]->name, std::move(global));
    }
  }
  return all;
}

}  // namespace shardline::testing
