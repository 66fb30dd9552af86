// The order in which one pipeline stage runs the forward and backward passes
// of a step's micro-batches. Both schedules are synchronous (a step ends with
// a flush) and run backward passes in micro-batch index order on every stage,
// so gradients accumulate in the same order as in the reference trainer.
//
// - GPipe: every forward, then every backward. Stage s holds m micro-batches
//   of activations at the peak.
// - 1F1B (PipeDream-Flush): min(p−s−1, m) warm-up forwards, then one forward
//   and one backward alternately, then the remaining backwards. Stage s holds
//   at most min(p−s, m) micro-batches.
#ifndef SHARDLINE_WORKER_RUNTIME_PIPELINE_SCHEDULE_H_
#define SHARDLINE_WORKER_RUNTIME_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline::worker::runtime {

enum class ScheduleKind { kGPipe, kOneFOneB };

// "gpipe" or "1f1b"; INVALID_ARGUMENT otherwise.
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);

struct PipelineAction {
  enum class Type { kForward, kBackward };
  Type type;
  int micro_batch;
  bool operator==(const PipelineAction& other) const {
    return type == other.type && micro_batch == other.micro_batch;
  }
};

// Actions of stage `stage` (0-based) of `stages` for `micro_batches`
// micro-batches. INVALID_ARGUMENT for counts out of range.
absl::StatusOr<std::vector<PipelineAction>> BuildSchedule(ScheduleKind kind, int stages, int stage,
                                                          int micro_batches);

// "F0 F1 B0 F2 B1 B2", for messages and tests.
std::string ScheduleString(const std::vector<PipelineAction>& actions);

}  // namespace shardline::worker::runtime

#endif  // SHARDLINE_WORKER_RUNTIME_PIPELINE_SCHEDULE_H_
