#include "worker/runtime/step_trace.h"

#include <utility>

namespace shardline::worker::runtime {

void StepTrace::Mark(absl::string_view name, int micro_batch, absl::Time now) {
  Close(now);
  shardline::v1::TraceEvent& event = events_.emplace_back();
  event.set_name(std::string(name));
  event.set_micro_batch(micro_batch);
  event.set_start_us(absl::ToUnixMicros(now));
  open_ = true;
  open_since_ = now;
}

std::vector<shardline::v1::TraceEvent> StepTrace::Take(absl::Time now) {
  Close(now);
  return std::exchange(events_, {});
}

void StepTrace::Close(absl::Time now) {
  if (!open_) return;
  events_.back().set_duration_us(absl::ToInt64Microseconds(now - open_since_));
  open_ = false;
}

}  // namespace shardline::worker::runtime
