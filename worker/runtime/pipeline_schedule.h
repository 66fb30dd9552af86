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
// - Zero-bubble ("zb", after Qi et al., "Zero Bubble Pipeline Parallelism",
//   2023): 1F1B's order of forwards and backwards, each backward split in
//   two: its input-gradient part (B), whose result goes upstream at once,
//   and its weight-gradient part (W), which waits to fill the time the stage
//   would spend waiting for a neighbour. Weight gradients still accumulate
//   in micro-batch order, so the bits are 1F1B's. Stage s holds at most
//   min(p−s+1, m) micro-batches (one more than 1F1B: a slot is held until
//   its W). Where W goes comes from simulating every stage with equal
//   costs for F, B and W: on 2 stages and 8 micro-batches the step takes 25
//   units against 1F1B's 27, on 4 stages 29 against 33.
#ifndef SHARDLINE_WORKER_RUNTIME_PIPELINE_SCHEDULE_H_
#define SHARDLINE_WORKER_RUNTIME_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline::worker::runtime {

enum class ScheduleKind { kGPipe, kOneFOneB, kZeroBubble };

// "gpipe", "1f1b" or "zb"; INVALID_ARGUMENT otherwise.
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);

struct PipelineAction {
  // kBackward: the whole backward pass (GPipe, 1F1B); kBackwardInput and
  // kBackwardWeights: its two parts (zero-bubble), in that order.
  enum class Type { kForward, kBackward, kBackwardInput, kBackwardWeights };
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

// "F0 F1 B0 F2 B1 B2" (B: a whole backward pass or its input part, W: its
// weight part), for messages and tests.
std::string ScheduleString(const std::vector<PipelineAction>& actions);

// The most micro-batches whose activations `actions` hold at once (from the
// forward pass to the end of the backward pass, or of its weight part).
int PeakHeldSlots(const std::vector<PipelineAction>& actions);

// The units of time `kind` takes for a step when a forward pass, a backward
// pass's input part and its weight part each cost one unit (a whole backward
// two) and transfers none: the makespan of the simulated pipeline.
absl::StatusOr<int> SimulatedStepUnits(ScheduleKind kind, int stages, int micro_batches);

}  // namespace shardline::worker::runtime

#endif  // SHARDLINE_WORKER_RUNTIME_PIPELINE_SCHEDULE_H_
