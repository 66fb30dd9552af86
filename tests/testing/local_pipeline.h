// LocalPipeline runs a p-stage pipeline inside the test process: one
// backend (CPU unless told), ShardRuntime and PipelineStage per stage,
// LocalStageLinks between them, one thread per stage for each step; or one
// replica of a data-parallel grid (LocalGrid). Tests use it to check the
// pipeline against the reference trainer without any networking.
#ifndef SHARDLINE_TESTS_TESTING_LOCAL_PIPELINE_H_
#define SHARDLINE_TESTS_TESTING_LOCAL_PIPELINE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tensor.h"
#include "shardline/v1/job.pb.h"
#include "worker/backend/backend.h"
#include "worker/collective/in_process_collective.h"
#include "worker/data/data_source.h"
#include "worker/runtime/pipeline_stage.h"
#include "worker/runtime/shard_runtime.h"
#include "worker/transport/local_stage_link.h"

namespace shardline::testing {

class LocalPipeline {
 public:
  using BackendMaker = std::function<absl::StatusOr<std::unique_ptr<worker::Backend>>()>;

  // `cuts` are the first unit of stages 1..p−1 (p = cuts.size() + 1). Every
  // stage gets a backend of its own on `device` ("cpu", "cuda:N").
  static absl::StatusOr<std::unique_ptr<LocalPipeline>> Create(
      const shardline::v1::JobSpec& spec, const std::vector<int>& cuts,
      absl::Duration link_timeout = absl::Seconds(30), const std::string& device = "cpu");
  // The same with each stage's backend made by `make_backend`.
  static absl::StatusOr<std::unique_ptr<LocalPipeline>> Create(
      const shardline::v1::JobSpec& spec, const std::vector<int>& cuts, absl::Duration link_timeout,
      const BackendMaker& make_backend);
  // Replica `replica` of spec.parallel().data_parallel() (LocalGrid): stage
  // s joins `groups[s]`, its data-parallel group, as rank `replica`; with
  // spec.parallel().tensor_parallel() = t > 1, this is the pipeline of
  // tensor rank `tensor_rank`, stage s split over `tensor_groups[s]`. With
  // `micro_batch_groups` > 1 the replica stands for that many of a larger
  // grid's (spec is common::FoldReplicas' spec; PipelineStageOptions::groups),
  // and joins its group even as its only rank.
  static absl::StatusOr<std::unique_ptr<LocalPipeline>> Create(
      const shardline::v1::JobSpec& spec, const std::vector<int>& cuts, absl::Duration link_timeout,
      const BackendMaker& make_backend, int replica,
      const std::vector<worker::collective::InProcessGroup*>& groups, int tensor_rank = 0,
      const std::vector<worker::collective::InProcessGroup*>& tensor_groups = {}, int micro_batch_groups = 1);

  // Runs one step on every stage concurrently; the results by stage, or the
  // first error (with its stage) once every stage has returned.
  absl::StatusOr<std::vector<worker::runtime::StageStepResult>> RunStep(int64_t step);
  // The validation pass after `step` on every stage concurrently, the same way.
  absl::StatusOr<std::vector<worker::runtime::StageEvalResult>> Evaluate(int64_t step);
  // Every stage's weights, by global name.
  absl::StatusOr<std::map<std::string, common::Tensor>> ExportWeights();

  int stages() const { return static_cast<int>(runtimes_.size()); }
  worker::transport::LocalPipelineLinks& links() { return links_; }
  worker::runtime::ShardRuntime& runtime(int stage) { return *runtimes_[stage]; }
  worker::runtime::PipelineStage& stage(int stage) { return *stages_[stage]; }

 private:
  LocalPipeline() = default;
  template <typename Result>
  absl::StatusOr<std::vector<Result>> OnEveryStage(
      const std::function<absl::StatusOr<Result>(worker::runtime::PipelineStage&)>& run);

  std::unique_ptr<worker::data::DataSource> data_;
  std::vector<std::unique_ptr<worker::Backend>> backends_;
  std::vector<std::unique_ptr<worker::collective::Collective>> replica_groups_;  // by stage
  std::vector<std::unique_ptr<worker::collective::Collective>> tensor_groups_;   // by stage
  std::vector<std::unique_ptr<worker::runtime::ShardRuntime>> runtimes_;
  worker::transport::LocalPipelineLinks links_;
  std::vector<std::unique_ptr<worker::runtime::PipelineStage>> stages_;
};

}  // namespace shardline::testing

#endif  // SHARDLINE_TESTS_TESTING_LOCAL_PIPELINE_H_
