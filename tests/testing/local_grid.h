// LocalGrid runs a p × d × t grid inside the test process: for each
// data-parallel replica r (spec.parallel().data_parallel() = d) and tensor
// rank k (spec.parallel().tensor_parallel() = t) a p-stage LocalPipeline;
// the d copies of each (stage, tensor rank) joined by an InProcessGroup (the
// data-parallel group), the t ranks of each (stage, replica) by another
// (the tensor-parallel group); every stage of every position on its own
// thread for each step. Tests use it to check data and tensor parallelism
// against the reference trainer without any networking.
#ifndef SHARDLINE_TESTS_TESTING_LOCAL_GRID_H_
#define SHARDLINE_TESTS_TESTING_LOCAL_GRID_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/testing/local_pipeline.h"
#include "worker/collective/in_process_collective.h"

namespace shardline::testing {

class LocalGrid {
 public:
  // One step of the whole grid.
  struct Step {
    std::vector<std::vector<worker::runtime::StageStepResult>> results;  // [replica][stage], tensor rank 0's
    // The step's loss: the replicas' last-stage losses added in rank order
    // (a replica's groups' one by one), as the coordinator adds them
    // (tensor rank 0's: every rank has it).
    double loss = 0.0;
  };

  // `cuts` as for LocalPipeline; every stage of every position gets a CPU
  // backend of its own. With `replicas` (a divisor of the spec's d; 0: d)
  // the grid has that many replicas, each running d / replicas of the
  // spec's (common::FoldReplicas), and the same bits.
  static absl::StatusOr<std::unique_ptr<LocalGrid>> Create(const shardline::v1::JobSpec& spec,
                                                           const std::vector<int>& cuts,
                                                           absl::Duration timeout = absl::Seconds(30),
                                                           int replicas = 0);

  // Runs one step on every stage of every position concurrently; the first
  // error (by replica, tensor rank, then stage) once all have returned.
  absl::StatusOr<Step> RunStep(int64_t step);
  // The validation pass after `step` on every position concurrently; each
  // position's last-stage result, [replica][tensor rank].
  absl::StatusOr<std::vector<std::vector<worker::runtime::StageEvalResult>>> Evaluate(int64_t step);
  // Evaluate put together as the coordinator does: the replicas' shares
  // added in batch order (common::SumEvalShares); INTERNAL where the tensor
  // ranks of a replica disagree.
  struct Validation {
    double loss = 0.0;
    int64_t windows = 0, matches = 0;
    std::vector<int64_t> replica_windows;  // each replica's share
  };
  absl::StatusOr<Validation> Validate(int64_t step);
  // The weights of replica 0 by global name, split tensors put together
  // from the tensor ranks' slices.
  absl::StatusOr<std::map<std::string, common::Tensor>> ExportWeights();

  int replicas() const { return static_cast<int>(positions_.size()); }
  int tensor_ranks() const { return static_cast<int>(positions_[0].size()); }
  LocalPipeline& replica(int r) { return *positions_[r][0]; }
  LocalPipeline& position(int r, int k) { return *positions_[r][k]; }

 private:
  LocalGrid() = default;
  // `run` on every position at once, each on a thread: [replica · t + rank].
  template <typename Result>
  std::vector<absl::StatusOr<Result>> OnEveryPosition(const std::function<absl::StatusOr<Result>(LocalPipeline&)>& run);
  std::vector<std::unique_ptr<worker::collective::InProcessGroup>> groups_;  // all of them
  std::vector<std::vector<std::unique_ptr<LocalPipeline>>> positions_;        // [replica][tensor rank]
};

}  // namespace shardline::testing

#endif  // SHARDLINE_TESTS_TESTING_LOCAL_GRID_H_
