// StepTrace records what a stage's thread does during one step, for
// `shardctl trace`: Mark starts a span (and ends the one before), Take ends
// the last and hands the spans over. A few small allocations a span, some
// ten spans a micro-batch. Not thread-safe: the stage's thread uses it.
#ifndef SHARDLINE_WORKER_RUNTIME_STEP_TRACE_H_
#define SHARDLINE_WORKER_RUNTIME_STEP_TRACE_H_

#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "shardline/v1/coordinator.pb.h"

namespace shardline::worker::runtime {

class StepTrace {
 public:
  // From now on the thread does `name` (TraceEvent's names) for
  // `micro_batch` (-1: the whole step).
  void Mark(absl::string_view name, int micro_batch, absl::Time now = absl::Now());
  // The spans since the last Take (the open one ended `now`).
  std::vector<shardline::v1::TraceEvent> Take(absl::Time now = absl::Now());

 private:
  void Close(absl::Time now);

  std::vector<shardline::v1::TraceEvent> events_;
  bool open_ = false;
  absl::Time open_since_;
};

}  // namespace shardline::worker::runtime

#endif  // SHARDLINE_WORKER_RUNTIME_STEP_TRACE_H_
