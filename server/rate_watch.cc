#include "server/rate_watch.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace shardline::server {

void RateWatch::Start(int64_t first_step) {
  settle_step_ = first_step + kSettleSteps;
  seen_.clear();
}

std::string RateWatch::Rose(int64_t step, const std::vector<WorkerRecord>& workers) {
  if (step < settle_step_) return "";
  std::string rose;
  for (const WorkerRecord& w : workers) {
    const double now = PlanningFlops(w);
    auto [seen, fresh] = seen_.try_emplace(w.id, Seen{now, now});
    if (fresh) continue;
    if (rose.empty() && now > kRise * seen->second.low && now > kRecheck * seen->second.weighed) {
      rose = absl::StrFormat("%s got faster (%.1f → %.1f GFLOP/s)", w.name, seen->second.low / 1e9, now / 1e9);
    }
    seen->second.low = std::min(seen->second.low, now);
  }
  return rose;
}

void RateWatch::Weighed(const std::vector<WorkerRecord>& workers) {
  for (const WorkerRecord& w : workers) {
    auto [seen, fresh] = seen_.try_emplace(w.id, Seen{PlanningFlops(w), PlanningFlops(w)});
    seen->second.weighed = PlanningFlops(w);
  }
}

}  // namespace shardline::server
