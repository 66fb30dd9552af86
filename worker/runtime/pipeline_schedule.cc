#include "worker/runtime/pipeline_schedule.h"

#include <algorithm>
#include <deque>

#include "absl/strings/str_cat.h"
#include "common/input_limits.h"

namespace shardline::worker::runtime {
namespace {

using Type = PipelineAction::Type;

// 1F1B's order; `backward` is the type of its backward passes.
std::vector<PipelineAction> OneFOneB(int stages, int stage, int m, Type backward) {
  std::vector<PipelineAction> actions;
  const int warmup = std::min(stages - stage - 1, m);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) actions.push_back({Type::kForward, next_forward});
  while (next_forward < m) {
    actions.push_back({Type::kForward, next_forward++});
    actions.push_back({backward, next_backward++});
  }
  while (next_backward < m) actions.push_back({backward, next_backward++});
  return actions;
}

int Cost(Type type) { return type == Type::kBackward ? 2 : 1; }

// When each stage finished each micro-batch's forward pass and its backward
// pass's input part (-1: not yet), and so which actions may start at t.
class Timeline {
 public:
  Timeline(int stages, int m)
      : stages_(stages), forward_(stages, std::vector<int>(m, -1)), input_(stages, std::vector<int>(m, -1)) {}
  bool Ready(int stage, const PipelineAction& a, int t) const {
    const int k = a.micro_batch;
    switch (a.type) {
      case Type::kForward:
        return stage == 0 || Before(forward_[stage - 1][k], t);
      case Type::kBackward:
      case Type::kBackwardInput:
        return Before(stage == stages_ - 1 ? forward_[stage][k] : input_[stage + 1][k], t);
      case Type::kBackwardWeights:
        return Before(input_[stage][k], t);
    }
    return false;
  }
  void Done(int stage, const PipelineAction& a, int end) {
    if (a.type == Type::kForward) forward_[stage][a.micro_batch] = end;
    if (a.type == Type::kBackward || a.type == Type::kBackwardInput) input_[stage][a.micro_batch] = end;
  }

 private:
  static bool Before(int done, int t) { return done >= 0 && done <= t; }
  int stages_;
  std::vector<std::vector<int>> forward_, input_;
};

// The zero-bubble schedule of every stage: 1F1B's forwards and input parts
// in 1F1B's order, each taken when its input has arrived; a stage that
// cannot take the next one (its input is not there, or it would hold more
// than its limit of micro-batches) runs its oldest pending weight part
// instead, and the pending ones run at the end. Unit costs.
std::vector<std::vector<PipelineAction>> ZeroBubble(int stages, int m) {
  struct Stage {
    std::vector<PipelineAction> order;  // 1F1B's, with input parts
    size_t next = 0;
    std::deque<int> pending;  // micro-batches whose weight part is to run
    int held = 0, limit = 0;
    std::vector<PipelineAction> out;
  };
  std::vector<Stage> stage(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    stage[s].order = OneFOneB(stages, s, m, Type::kBackwardInput);
    stage[s].limit = std::min(stages - s + 1, m);
  }
  Timeline timeline(stages, m);
  for (int t = 0;; ++t) {
    std::vector<std::pair<int, PipelineAction>> started;
    bool left = false;
    for (int s = 0; s < stages; ++s) {
      Stage& st = stage[s];
      if (st.next == st.order.size() && st.pending.empty()) continue;
      left = true;
      PipelineAction action{Type::kBackwardWeights, -1};
      if (st.next < st.order.size()) {
        const PipelineAction& a = st.order[st.next];
        const bool full = a.type == Type::kForward && st.held >= st.limit;
        if (!full && timeline.Ready(s, a, t)) {
          action = a;
          ++st.next;
        }
      }
      if (action.micro_batch < 0 && !st.pending.empty()) {
        action.micro_batch = st.pending.front();
        st.pending.pop_front();
      }
      if (action.micro_batch < 0) continue;  // waits
      if (action.type == Type::kForward) ++st.held;
      if (action.type == Type::kBackwardInput) st.pending.push_back(action.micro_batch);
      if (action.type == Type::kBackwardWeights) --st.held;
      st.out.push_back(action);
      started.emplace_back(s, action);
    }
    if (!left) break;
    for (const auto& [s, a] : started) timeline.Done(s, a, t + 1);
  }
  std::vector<std::vector<PipelineAction>> out;
  for (Stage& st : stage) out.push_back(std::move(st.out));
  return out;
}

}  // namespace

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "zb") return ScheduleKind::kZeroBubble;
  return absl::InvalidArgumentError(absl::StrCat("unknown schedule '", name, "' (gpipe, 1f1b or zb)"));
}

absl::StatusOr<std::vector<PipelineAction>> BuildSchedule(ScheduleKind kind, int stages, int stage,
                                                          int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("schedule for stage ", stage, " of ", stages,
                                                   " with ", micro_batches, " micro-batches"));
  }
  const int m = micro_batches;
  if (kind == ScheduleKind::kZeroBubble) {
    if (int64_t{stages} * m > common::kMaxZeroBubbleStageMicroBatches) {
      return absl::InvalidArgumentError(absl::StrCat("the zb schedule takes stages × micro-batches up to ",
                                                     common::kMaxZeroBubbleStageMicroBatches, ", not ", stages, " × ", m));
    }
    return std::move(ZeroBubble(stages, m)[stage]);
  }
  if (kind == ScheduleKind::kOneFOneB) return OneFOneB(stages, stage, m, Type::kBackward);
  std::vector<PipelineAction> actions;
  for (int k = 0; k < m; ++k) actions.push_back({Type::kForward, k});
  for (int k = 0; k < m; ++k) actions.push_back({Type::kBackward, k});
  return actions;
}

std::string ScheduleString(const std::vector<PipelineAction>& actions) {
  std::string out;
  for (const PipelineAction& a : actions) {
    const char* letter = a.type == Type::kForward ? "F" : a.type == Type::kBackwardWeights ? "W" : "B";
    absl::StrAppend(&out, out.empty() ? "" : " ", letter, a.micro_batch);
  }
  return out;
}

int PeakHeldSlots(const std::vector<PipelineAction>& actions) {
  const bool split = std::any_of(actions.begin(), actions.end(),
                                 [](const PipelineAction& a) { return a.type == Type::kBackwardWeights; });
  int held = 0, peak = 0;
  for (const PipelineAction& a : actions) {
    if (a.type == Type::kForward) peak = std::max(peak, ++held);
    if (a.type == (split ? Type::kBackwardWeights : Type::kBackward)) --held;
  }
  return peak;
}

absl::StatusOr<int> SimulatedStepUnits(ScheduleKind kind, int stages, int micro_batches) {
  std::vector<std::vector<PipelineAction>> order;
  int total = 0;
  for (int s = 0; s < stages; ++s) {
    auto actions = BuildSchedule(kind, stages, s, micro_batches);
    if (!actions.ok()) return actions.status();
    for (const PipelineAction& a : *actions) total += Cost(a.type);
    order.push_back(*std::move(actions));
  }
  Timeline timeline(stages, micro_batches);
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<int> free_at(static_cast<size_t>(stages), 0);
  for (int t = 0; t <= total; ++t) {
    std::vector<std::pair<int, PipelineAction>> started;
    for (int s = 0; s < stages; ++s) {
      if (free_at[s] > t || next[s] == order[s].size() || !timeline.Ready(s, order[s][next[s]], t)) continue;
      const PipelineAction& a = order[s][next[s]++];
      free_at[s] = t + Cost(a.type);
      started.emplace_back(s, a);
    }
    for (const auto& [s, a] : started) timeline.Done(s, a, t + Cost(a.type));
    bool done = true;
    for (int s = 0; s < stages; ++s) done = done && next[s] == order[s].size();
    if (done) return *std::max_element(free_at.begin(), free_at.end());
  }
  return absl::InternalError(absl::StrCat("the simulated schedule deadlocks on ", stages, " stages"));
}

}  // namespace shardline::worker::runtime
