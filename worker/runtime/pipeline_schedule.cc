#include "worker/runtime/pipeline_schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardline::worker::runtime {

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  return absl::InvalidArgumentError(absl::StrCat("unknown schedule '", name, "' (gpipe or 1f1b)"));
}

absl::StatusOr<std::vector<PipelineAction>> BuildSchedule(ScheduleKind kind, int stages, int stage,
                                                          int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("schedule for stage ", stage, " of ", stages,
                                                   " with ", micro_batches, " micro-batches"));
  }
  using Type = PipelineAction::Type;
  std::vector<PipelineAction> actions;
  const int m = micro_batches;
  if (kind == ScheduleKind::kGPipe) {
    for (int k = 0; k < m; ++k) actions.push_back({Type::kForward, k});
    for (int k = 0; k < m; ++k) actions.push_back({Type::kBackward, k});
    return actions;
  }
  const int warmup = std::min(stages - stage - 1, m);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) actions.push_back({Type::kForward, next_forward});
  while (next_forward < m) {
    actions.push_back({Type::kForward, next_forward++});
    actions.push_back({Type::kBackward, next_backward++});
  }
  while (next_backward < m) actions.push_back({Type::kBackward, next_backward++});
  return actions;
}

std::string ScheduleString(const std::vector<PipelineAction>& actions) {
  std::string out;
  for (const PipelineAction& a : actions) {
    absl::StrAppend(&out, out.empty() ? "" : " ",
                    a.type == PipelineAction::Type::kForward ? "F" : "B", a.micro_batch);
  }
  return out;
}

}  // namespace shardline::worker::runtime
