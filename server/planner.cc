#include "server/planner.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cost_model.h"
#include "common/job_spec.h"

namespace shardline::server {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Everything a range of units costs on one stage.
struct RangeCost {
  double flops_per_micro_batch = 0;
  int64_t memory_bytes = 0;
};

double GiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

}  // namespace

absl::StatusOr<PipelinePlan> PlanPipeline(const shardline::v1::JobSpec& spec,
                                          const std::vector<WorkerCapacity>& workers,
                                          const std::vector<int>& prefer) {
  const int p = spec.parallel().pipeline_stages();
  const int n = common::PipelineUnits(spec.model());
  if (p < 1 || p > n) {
    return absl::InvalidArgumentError(absl::StrCat("cannot cut ", n, " units into ", p, " stages"));
  }
  if (static_cast<int>(workers.size()) < p) {
    return absl::InvalidArgumentError(absl::StrCat("the plan needs ", p, " workers, ", workers.size(),
                                                   " are available"));
  }
  for (int s = 0; s < p; ++s) {
    if (!(workers[s].flops_per_second > 0) || workers[s].memory_bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", workers[s].name, " reported no GEMM rate or memory"));
    }
  }
  const int m = spec.train().micro_batches();
  const int d = std::max(1, spec.parallel().data_parallel());
  const int64_t t = spec.model().context();
  const double tokens = static_cast<double>(spec.train().global_batch() / (int64_t{m} * d)) * t;
  const std::vector<common::UnitCost> units = common::ModelUnitCosts(spec.model(), t);
  // Floats per parameter: weight and gradient, and the optimizer's m (and
  // v), of which a ZeRO-1 replica keeps 1/d.
  const double optimizer_copies = spec.train().optimizer().kind() == "adamw" ? 2.0 : 1.0;
  const double state_copies = 2.0 + optimizer_copies / (spec.parallel().shard_optimizer() ? d : 1);
  const bool one_f_one_b = spec.parallel().schedule() == "1f1b";

  // Prefix sums, so that a range's cost is O(1) in the O(p·n²) search.
  std::vector<double> flops(n + 1, 0.0), saved_bytes(n + 1, 0.0), parameters(n + 1, 0.0);
  for (int u = 0; u < n; ++u) {
    flops[u + 1] = flops[u] + units[u].flops_per_token * tokens;
    saved_bytes[u + 1] = saved_bytes[u] + units[u].saved_bytes_per_token * tokens;
    parameters[u + 1] = parameters[u] + static_cast<double>(units[u].parameters);
  }
  // Cost of units [a, b) as stage s.
  auto range = [&](int s, int a, int b) {
    RangeCost cost;
    cost.flops_per_micro_batch = flops[b] - flops[a];
    const double saved = saved_bytes[b] - saved_bytes[a];
    const double params = parameters[b] - parameters[a];
    const int in_flight = one_f_one_b ? std::min(p - s, m) : m;
    // Plus, for each micro-batch in flight, the stage's input, its output
    // and the gradient of its output (ShardRuntime keeps all three per slot).
    const double edges =
        (units[a].output_bytes_per_token + 2 * units[b - 1].output_bytes_per_token) * tokens;
    cost.memory_bytes = static_cast<int64_t>(params * 4.0 * state_copies + in_flight * (saved + edges));
    return cost;
  };

  // best[s][j]: the smallest possible slowest-stage time when stages 0..s
  // hold units [0, j); cut[s][j] the first unit of stage s in that plan.
  std::vector<std::vector<double>> best(p, std::vector<double>(n + 1, kInfinity));
  std::vector<std::vector<int>> cut(p, std::vector<int>(n + 1, -1));
  for (int s = 0; s < p; ++s) {
    for (int j = s + 1; j <= n - (p - 1 - s); ++j) {
      for (int a = s; a < j; ++a) {
        const double before = s == 0 ? (a == 0 ? 0.0 : kInfinity) : best[s - 1][a];
        if (before == kInfinity) continue;
        const RangeCost cost = range(s, a, j);
        if (cost.memory_bytes > workers[s].memory_bytes) continue;
        const double time = std::max(before, cost.flops_per_micro_batch / workers[s].flops_per_second);
        if (time < best[s][j]) {
          best[s][j] = time;
          cut[s][j] = a;
        }
      }
    }
  }
  if (best[p - 1][n] == kInfinity) {
    // Explain with the even cut: which stage does not fit, and by how much.
    std::string detail;
    for (int s = 0; s < p && detail.empty(); ++s) {
      const int a = s * n / p, b = (s + 1) * n / p;
      const RangeCost cost = range(s, a, b);
      if (cost.memory_bytes > workers[s].memory_bytes) {
        detail = absl::StrFormat("; e.g. units [%d, %d) on worker %s need %.2f GiB, it has %.2f GiB",
                                 a, b, workers[s].name, GiB(cost.memory_bytes),
                                 GiB(workers[s].memory_bytes));
      }
    }
    int64_t total = 0;
    for (int u = 0; u < n; ++u) total += range(0, u, u + 1).memory_bytes;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "no cut of the %d units into %d stages fits the workers' memory (the model needs about "
        "%.2f GiB in all)%s",
        n, p, GiB(total), detail));
  }
  std::vector<int> starts(p);
  for (int s = p - 1, j = n; s >= 0; --s) j = starts[s] = cut[s][j];
  double slowest = best[p - 1][n];
  // The preferred cut, if it is one, fits, and is nearly as fast.
  bool keep = static_cast<int>(prefer.size()) == p && prefer[0] == 0;
  double kept_slowest = 0;
  for (int s = 0; keep && s < p; ++s) {
    const int a = prefer[s], b = s + 1 < p ? prefer[s + 1] : n;
    keep = a < b && b <= n;
    if (!keep) break;
    const RangeCost cost = range(s, a, b);
    keep = cost.memory_bytes <= workers[s].memory_bytes;
    kept_slowest = std::max(kept_slowest, cost.flops_per_micro_batch / workers[s].flops_per_second);
  }
  if (keep && kept_slowest <= kKeepCutSlack * slowest) {
    starts = prefer;
    slowest = kept_slowest;
  }
  PipelinePlan plan;
  plan.stages.resize(p);
  for (int s = 0; s < p; ++s) {
    const int a = starts[s], j = s + 1 < p ? starts[s + 1] : n;
    const RangeCost cost = range(s, a, j);
    plan.stages[s] = StagePlan{a, j, workers[s].name,
                               cost.flops_per_micro_batch / workers[s].flops_per_second,
                               cost.memory_bytes, static_cast<int64_t>(parameters[j] - parameters[a])};
  }
  plan.predicted_step_seconds = (m + p - 1) * slowest;
  plan.bubble_fraction = static_cast<double>(p - 1) / (m + p - 1);
  return plan;
}

std::string DescribePlan(const PipelinePlan& plan) {
  std::string out;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& st = plan.stages[s];
    absl::StrAppendFormat(&out, "stage %d: units [%d, %d) on %s, %.3f ms per micro-batch, %.1f MiB\n",
                          s, st.unit_begin, st.unit_end, st.worker, st.seconds_per_micro_batch * 1e3,
                          static_cast<double>(st.memory_bytes) / (1 << 20));
  }
  absl::StrAppendFormat(&out, "predicted step: %.3f s (pipeline bubble %.0f%%)\n",
                        plan.predicted_step_seconds, 100 * plan.bubble_fraction);
  return out;
}

}  // namespace shardline::server
