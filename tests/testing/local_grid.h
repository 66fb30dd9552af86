// LocalGrid runs a p × d grid inside the test process: d replicas of a
// p-stage LocalPipeline (spec.parallel().data_parallel() = d), the d copies
// of each stage joined by an InProcessGroup, every stage of every replica on
// its own thread for each step. Tests use it to check data parallelism
// against the reference trainer without any networking.
#ifndef SHARDLINE_TESTS_TESTING_LOCAL_GRID_H_
#define SHARDLINE_TESTS_TESTING_LOCAL_GRID_H_

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
    std::vector<std::vector<worker::runtime::StageStepResult>> results;  // [replica][stage]
    // The step's loss: the replicas' last-stage losses added in rank order,
    // as the coordinator adds them.
    double loss = 0.0;
  };

  // `cuts` as for LocalPipeline; every stage of every replica gets a CPU
  // backend of its own.
  static absl::StatusOr<std::unique_ptr<LocalGrid>> Create(const shardline::v1::JobSpec& spec,
                                                           const std::vector<int>& cuts,
                                                           absl::Duration timeout = absl::Seconds(30));

  // Runs one step on every stage of every replica concurrently; the first
  // error (by replica, then stage) once all have returned.
  absl::StatusOr<Step> RunStep(int64_t step);

  int replicas() const { return static_cast<int>(replicas_.size()); }
  LocalPipeline& replica(int r) { return *replicas_[r]; }

 private:
  LocalGrid() = default;
  std::vector<std::unique_ptr<worker::collective::InProcessGroup>> groups_;  // by stage
  std::vector<std::unique_ptr<LocalPipeline>> replicas_;
};

}  // namespace shardline::testing

#endif  // SHARDLINE_TESTS_TESTING_LOCAL_GRID_H_
