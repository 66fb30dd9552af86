#include "tests/testing/local_pipeline.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "worker/backend/backend_factory.h"
#include "worker/nn/model_config.h"

namespace shardline::testing {

using worker::runtime::PipelineStage;
using worker::runtime::PipelineStageOptions;
using worker::runtime::ShardRuntime;
using worker::runtime::StageStepResult;

absl::StatusOr<std::unique_ptr<LocalPipeline>> LocalPipeline::Create(
    const shardline::v1::JobSpec& spec, const std::vector<int>& cuts, absl::Duration link_timeout,
    const std::string& device) {
  return Create(spec, cuts, link_timeout, [&device] { return worker::CreateBackend(device, {1}); });
}

absl::StatusOr<std::unique_ptr<LocalPipeline>> LocalPipeline::Create(
    const shardline::v1::JobSpec& spec, const std::vector<int>& cuts, absl::Duration link_timeout,
    const BackendMaker& make_backend) {
  return Create(spec, cuts, link_timeout, make_backend, 0, {});
}

absl::StatusOr<std::unique_ptr<LocalPipeline>> LocalPipeline::Create(
    const shardline::v1::JobSpec& spec, const std::vector<int>& cuts, absl::Duration link_timeout,
    const BackendMaker& make_backend, int replica,
    const std::vector<worker::collective::InProcessGroup*>& groups, int tensor_rank,
    const std::vector<worker::collective::InProcessGroup*>& tensor_groups, int micro_batch_groups) {
  const int replicas = spec.parallel().data_parallel();
  const bool summed = replicas > 1 || micro_batch_groups > 1;
  const int tensor_size = std::max(1, spec.parallel().tensor_parallel());
  if (summed && groups.size() != cuts.size() + 1) {
    return absl::InvalidArgumentError("a data-parallel replica needs one group per stage");
  }
  if (tensor_size > 1 && tensor_groups.size() != cuts.size() + 1) {
    return absl::InvalidArgumentError("a tensor-parallel rank needs one group per stage");
  }
  std::unique_ptr<LocalPipeline> pipeline(new LocalPipeline());
  ASSIGN_OR_RETURN(pipeline->data_, worker::data::CreateDataSource(spec));
  const auto config = worker::nn::ModelConfig::FromSpec(spec.model());
  const auto optimizer = worker::nn::OptimizerConfig::FromSpec(spec.train());
  ASSIGN_OR_RETURN(auto schedule, worker::runtime::ParseScheduleKind(spec.parallel().schedule()));
  const int stages = static_cast<int>(cuts.size()) + 1;
  ASSIGN_OR_RETURN(common::DType wire, common::ParseDType(spec.parallel().wire_dtype()));
  pipeline->links_ = worker::transport::CreateLocalStageLinks(
      stages, static_cast<size_t>(spec.train().micro_batches()) + 2, link_timeout);
  for (int s = 0; s < stages; ++s) {
    const int begin = s == 0 ? 0 : cuts[s - 1];
    const int end = s + 1 == stages ? config.units() : cuts[s];
    ASSIGN_OR_RETURN(std::unique_ptr<worker::Backend> backend, make_backend());
    worker::nn::TensorParallel tp;
    if (tensor_size > 1) {
      pipeline->tensor_groups_.push_back(tensor_groups[s]->Rank(tensor_rank, *backend));
      tp = {tensor_rank, tensor_size, pipeline->tensor_groups_.back().get(), common::VocabParallel(spec)};
    }
    ASSIGN_OR_RETURN(auto runtime, ShardRuntime::Create(*backend, config, begin, end,
                                                        spec.train().seed(), optimizer, tp));
    PipelineStageOptions options{schedule, stages, s, spec.train().micro_batches(),
                                 spec.train().global_batch(), wire, replica, replicas,
                                 static_cast<size_t>(spec.parallel().bucket_mib() * (1 << 20)),
                                 spec.parallel().shard_optimizer(), tensor_rank, tensor_size};
    // One host: scatter/gather only when the spec asks for it.
    const bool split = tensor_size > 1 && spec.parallel().stage_link_layout() == "scatter_gather";
    options.split_previous = split && s > 0;
    options.split_next = split && s + 1 < stages;
    options.groups = micro_batch_groups;
    options.eval_examples = spec.train().eval_examples();
    options.eval_exact_match = common::EvaluatesExactMatch(spec);
    worker::collective::Collective* group = nullptr;
    if (summed) {
      pipeline->replica_groups_.push_back(groups[s]->Rank(replica, *backend));
      group = pipeline->replica_groups_.back().get();
    }
    ASSIGN_OR_RETURN(auto stage, PipelineStage::Create(*runtime, pipeline->data_.get(),
                                                       *pipeline->links_.links[s], options, group, tp.group));
    pipeline->backends_.push_back(std::move(backend));
    pipeline->runtimes_.push_back(std::move(runtime));
    pipeline->stages_.push_back(std::move(stage));
  }
  return pipeline;
}

template <typename Result>
absl::StatusOr<std::vector<Result>> LocalPipeline::OnEveryStage(
    const std::function<absl::StatusOr<Result>(worker::runtime::PipelineStage&)>& run) {
  std::vector<absl::StatusOr<Result>> results(stages_.size(), absl::UnknownError("not run"));
  std::atomic<int> first_failure{-1};
  std::vector<std::thread> threads;
  for (size_t s = 0; s < stages_.size(); ++s) {
    threads.emplace_back([&, s] {
      results[s] = run(*stages_[s]);
      if (results[s].ok()) return;
      int none = -1;
      first_failure.compare_exchange_strong(none, static_cast<int>(s));
      // A failed stage drops its links, as a dead process's connections close.
      links_.CloseAll(absl::StrCat("stage ", s, " failed: ", results[s].status().message()));
    });
  }
  for (std::thread& t : threads) t.join();
  if (first_failure >= 0) return results[first_failure].status();
  std::vector<Result> out;
  for (auto& r : results) out.push_back(*std::move(r));
  return out;
}

absl::StatusOr<std::vector<StageStepResult>> LocalPipeline::RunStep(int64_t step) {
  return OnEveryStage<StageStepResult>([step](worker::runtime::PipelineStage& stage) { return stage.RunStep(step); });
}

absl::StatusOr<std::vector<worker::runtime::StageEvalResult>> LocalPipeline::Evaluate(int64_t step) {
  return OnEveryStage<worker::runtime::StageEvalResult>(
      [step](worker::runtime::PipelineStage& stage) { return stage.Evaluate(step); });
}

absl::StatusOr<std::map<std::string, common::Tensor>> LocalPipeline::ExportWeights() {
  std::map<std::string, common::Tensor> all;
  for (auto& runtime : runtimes_) {
    ASSIGN_OR_RETURN(auto weights, runtime->ExportWeights());
    for (auto& [name, tensor] : weights) all.emplace(name, std::move(tensor));
  }
  return all;
}

}  // namespace shardline::testing
