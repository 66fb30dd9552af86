#include "server/planner.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checked_int.h"
#include "common/cost_model.h"
#include "common/input_limits.h"
#include "common/job_spec.h"

namespace shardline::server {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Everything a range of units costs on one stage.
struct RangeCost {
  double flops_per_micro_batch = 0;
  int64_t memory_bytes = 0;  // int64's largest when the spec's numbers overflow it
  int64_t shard_bytes = 0;   // of its checkpoint: weights and optimizer state
};

double GiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

// "12.50 GiB", or what an overflowed size is.
std::string Bytes(int64_t bytes) {
  if (bytes == std::numeric_limits<int64_t>::max()) return "more bytes than 64-bit arithmetic holds";
  return absl::StrFormat("%.2f GiB", GiB(bytes));
}

}  // namespace

std::vector<WorkerCapacity> EqualizeRates(std::vector<WorkerCapacity> workers) {
  std::vector<size_t> order(workers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return workers[a].flops_per_second < workers[b].flops_per_second;
  });
  for (size_t begin = 0; begin < order.size();) {
    const double slowest = workers[order[begin]].flops_per_second;
    double tolerance = std::max(kRateNoiseFloor, workers[order[begin]].flops_spread);
    size_t end = begin + 1;
    while (end < order.size()) {
      const WorkerCapacity& next = workers[order[end]];
      const double widened = std::max(tolerance, next.flops_spread);
      if (next.flops_per_second > slowest * (1 + widened)) break;
      tolerance = widened;
      ++end;
    }
    double sum = 0;
    for (size_t i = begin; i < end; ++i) sum += workers[order[i]].flops_per_second;
    for (size_t i = begin; i < end; ++i) workers[order[i]].flops_per_second = sum / static_cast<double>(end - begin);
    begin = end;
  }
  return workers;
}

absl::StatusOr<PipelinePlan> PlanPipeline(const shardline::v1::JobSpec& spec,
                                          const std::vector<WorkerCapacity>& measured,
                                          const std::vector<int>& prefer, double keep_slack) {
  const int p = spec.parallel().pipeline_stages();
  const int n = common::PipelineUnits(spec.model());
  if (p < 1 || p > n) {
    return absl::InvalidArgumentError(absl::StrCat("cannot cut ", n, " units into ", p, " stages"));
  }
  if (static_cast<int>(measured.size()) < p) {
    return absl::InvalidArgumentError(absl::StrCat("the plan needs ", p, " workers, ", measured.size(),
                                                   " are available"));
  }
  for (int s = 0; s < p; ++s) {
    if (!(measured[s].flops_per_second > 0) || measured[s].memory_bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", measured[s].name, " reported no GEMM rate or memory"));
    }
  }
  const std::vector<WorkerCapacity> workers =
      EqualizeRates(std::vector<WorkerCapacity>(measured.begin(), measured.begin() + p));
  const int m = spec.train().micro_batches();
  const int d = std::max(1, spec.parallel().data_parallel());
  const int64_t t = spec.model().context();
  const int64_t sequences = spec.train().global_batch() / (int64_t{m} * d);
  const double tokens = static_cast<double>(sequences) * t;
  const std::vector<common::UnitCost> units = common::ModelUnitCosts(spec.model(), t);
  // Floats per parameter: weight and gradient, and the optimizer's m (and
  // v), of which a ZeRO-1 replica keeps 1/d.
  const int64_t optimizer_copies = spec.train().optimizer().kind() == "adamw" ? 2 : 1;
  const int64_t optimizer_shards = spec.parallel().shard_optimizer() ? d : 1;
  const std::string& schedule = spec.parallel().schedule();
  // The zero-bubble schedule holds one micro-batch more than 1F1B, and each
  // block keeps its linear layers' output gradients from a backward pass's
  // input part to its weight part (BlockLayer): 2·C + 7·C/t floats a token.
  const int64_t tp = std::max(1, spec.parallel().tensor_parallel());
  const int64_t deferred_per_token =
      schedule == "zb" ? (2 * spec.model().d_model() + 7 * spec.model().d_model() / tp) * 4 : 0;

  const auto attention_kept_per_token =
      static_cast<int64_t>(common::AttentionSavedBytesPerToken(spec.model(), t, false));
  const auto attention_recomputed_per_token =
      static_cast<int64_t>(common::AttentionSavedBytesPerToken(spec.model(), t, true));
  const auto block_scratch_per_token = n > 2 ? static_cast<int64_t>(units[1].scratch_bytes_per_token) : 0;
  const auto head_scratch_per_token = static_cast<int64_t>(units[n - 1].scratch_bytes_per_token);

  // Prefix sums, so that a range's cost is O(1) in the O(p·n²) search.
  // Bytes in checked int64 (the spec's numbers are bounded one by one, not
  // their products): a range whose memory overflows does not fit anywhere.
  std::vector<double> flops(n + 1, 0.0);
  std::vector<common::CheckedInt64> saved_per_token(n + 1), parameters(n + 1);
  for (int u = 0; u < n; ++u) {
    flops[u + 1] = flops[u] + units[u].flops_per_token * tokens;
    saved_per_token[u + 1] = saved_per_token[u] + static_cast<int64_t>(units[u].saved_bytes_per_token);
    parameters[u + 1] = parameters[u] + units[u].parameters;
  }
  const common::CheckedInt64 token_count = common::CheckedInt64(sequences) * t;
  // Cost of units [a, b) as stage s.
  auto range = [&](int s, int a, int b) {
    RangeCost cost;
    cost.flops_per_micro_batch = flops[b] - flops[a];
    const common::CheckedInt64 params = parameters[b] - parameters[a];
    const common::CheckedInt64 state = params * 4 * 2 + (params * 4 * optimizer_copies).DividedBy(optimizer_shards);
    const int in_flight = schedule == "1f1b" ? std::min(p - s, m) : schedule == "zb" ? std::min(p - s + 1, m) : m;
    const int blocks = std::max(0, std::min(b, n - 1) - std::max(a, 1));  // units 1 … n−2 are blocks
    // Plus, for each micro-batch in flight, the stage's input, its output
    // and the gradient of its output (ShardRuntime keeps all three per slot).
    const common::CheckedInt64 edges =
        static_cast<int64_t>(units[a].output_bytes_per_token + 2 * units[b - 1].output_bytes_per_token);
    // Blocks that recompute their attention weights keep a float a head instead.
    const int64_t attention_dropped =
        workers[s].recomputes_attention ? blocks * (attention_kept_per_token - attention_recomputed_per_token) : 0;
    const common::CheckedInt64 saved =
        saved_per_token[b] - saved_per_token[a] + edges + deferred_per_token * blocks - attention_dropped;
    // One pass's temporaries, once whatever is in flight: the blocks' shared
    // set (with the composed attention's backward scratch) and the head's.
    int64_t scratch = b == n ? head_scratch_per_token : 0;
    if (blocks > 0) {
      // The composed attention's backward scratch is the weights' size.
      scratch += block_scratch_per_token + (workers[s].composes_attention ? attention_kept_per_token : 0);
    }
    const common::CheckedInt64 memory =
        state + saved * token_count * in_flight + common::CheckedInt64(scratch) * token_count;
    cost.memory_bytes = memory.value();  // int64's largest when it overflowed: fits nowhere
    cost.shard_bytes = (params * 4 * (1 + optimizer_copies)).value();
    return cost;
  };
  // Seconds per micro-batch of units [a, b) on stage s: compute, which the
  // cut balances, and its tensor group's collectives (their bytes per step
  // spread over m), reported beside it. Collectives grow with a stage's
  // blocks as its compute does, so they would move a cut little; counted
  // in the cut, link measurements of a tiny model's microseconds would
  // move a restart's cut off the state its workers hold. Which workers
  // form a group (on which links) is the placement search's business.
  auto compute_seconds = [&](int s, const RangeCost& cost) { return cost.flops_per_micro_batch / workers[s].flops_per_second; };
  // What the cut balances: each stage's compute on its own rate, or, placed
  // "in_order", on one rate for all (the slowest's: the cut a planner that
  // does not look at rates makes).
  double common_rate = kInfinity;
  for (const WorkerCapacity& w : workers) common_rate = std::min(common_rate, w.flops_per_second);
  const bool even = spec.parallel().placement() == "in_order";
  auto cut_seconds = [&](int s, double flops_per_micro_batch) {
    return flops_per_micro_batch / (even ? common_rate : workers[s].flops_per_second);
  };
  auto tensor_seconds = [&](int s, int a, int b) {
    return workers[s].tensor_seconds_per_byte > 0
               ? common::TensorGroupBytesPerRank(spec, a, b) / m * workers[s].tensor_seconds_per_byte
               : 0.0;
  };
  // A stage's checkpoint must fit in one shard.
  for (int u = 0; u < n; ++u) {
    const int64_t shard = range(0, u, u + 1).shard_bytes;
    if (shard > common::kMaxShardBytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "unit %d of the model alone makes a checkpoint shard of %s, more than the %.0f GiB a shard may be",
          u, Bytes(shard), GiB(common::kMaxShardBytes)));
    }
  }

  // best[s][j]: the smallest possible slowest-stage time when stages 0..s
  // hold units [0, j); cut[s][j] the first unit of stage s in that plan
  // (the lowest of equals). Stage s's first unit a is tried from j − 1
  // down: its compute only grows as a falls, so once it alone is slower
  // than the best found no lower a can do better (the search runs at each
  // of a placement search's thousands of estimates).
  std::vector<std::vector<double>> best(p, std::vector<double>(n + 1, kInfinity));
  std::vector<std::vector<int>> cut(p, std::vector<int>(n + 1, -1));
  for (int s = 0; s < p; ++s) {
    for (int j = s + 1; j <= n - (p - 1 - s); ++j) {
      for (int a = j - 1; a >= s; --a) {
        const double seconds = cut_seconds(s, flops[j] - flops[a]);
        if (seconds > best[s][j]) break;
        const double before = s == 0 ? (a == 0 ? 0.0 : kInfinity) : best[s - 1][a];
        if (before == kInfinity) continue;
        const double time = std::max(before, seconds);
        if (time > best[s][j]) continue;
        const RangeCost cost = range(s, a, j);
        if (cost.memory_bytes > workers[s].memory_bytes || cost.shard_bytes > common::kMaxShardBytes) continue;
        best[s][j] = time;
        cut[s][j] = a;
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
        detail = absl::StrFormat("; e.g. stage %d (units [%d, %d)) on worker %s needs %s, it has %.2f GiB",
                                 s, a, b, workers[s].name, Bytes(cost.memory_bytes),
                                 GiB(workers[s].memory_bytes));
      } else if (cost.shard_bytes > common::kMaxShardBytes) {
        detail = absl::StrFormat("; e.g. stage %d (units [%d, %d)) makes a checkpoint shard of %s, at most %.0f GiB",
                                 s, a, b, Bytes(cost.shard_bytes), GiB(common::kMaxShardBytes));
      }
    }
    common::CheckedInt64 total = 0;
    for (int u = 0; u < n; ++u) total += range(0, u, u + 1).memory_bytes;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "no cut of the %d units into %d stages fits the workers' memory (the model needs about "
        "%s in all)%s",
        n, p, Bytes(total.value()), detail));
  }
  std::vector<int> starts(p);
  for (int s = p - 1, j = n; s >= 0; --s) j = starts[s] = cut[s][j];
  const double slowest = best[p - 1][n];
  // The preferred cut, if it is one, fits, and is nearly as fast.
  bool keep = static_cast<int>(prefer.size()) == p && prefer[0] == 0;
  double kept_slowest = 0;
  for (int s = 0; keep && s < p; ++s) {
    const int a = prefer[s], b = s + 1 < p ? prefer[s + 1] : n;
    keep = a < b && b <= n;
    if (!keep) break;
    const RangeCost cost = range(s, a, b);
    keep = cost.memory_bytes <= workers[s].memory_bytes && cost.shard_bytes <= common::kMaxShardBytes;
    kept_slowest = std::max(kept_slowest, cut_seconds(s, cost.flops_per_micro_batch));
  }
  if (keep && kept_slowest <= keep_slack * slowest) starts = prefer;
  PipelinePlan plan;
  plan.stages.resize(p);
  for (int s = 0; s < p; ++s) {
    const int a = starts[s], j = s + 1 < p ? starts[s + 1] : n;
    const RangeCost cost = range(s, a, j);
    StagePlan& stage = plan.stages[s];
    stage.unit_begin = a;
    stage.unit_end = j;
    stage.worker = workers[s].name;
    stage.compute_seconds = compute_seconds(s, cost);
    stage.tensor_seconds = tensor_seconds(s, a, j);
    stage.seconds_per_micro_batch = stage.compute_seconds + stage.tensor_seconds;
    stage.memory_bytes = cost.memory_bytes;
    stage.parameters = (parameters[j] - parameters[a]).value();
    stage.flops_per_micro_batch = cost.flops_per_micro_batch;
  }
  double slot = 0;  // on the stages' own rates, whatever the cut balanced
  for (const StagePlan& stage : plan.stages) slot = std::max(slot, stage.seconds_per_micro_batch);
  // m − 1 micro-batches one slot apart after one through every stage; the
  // zero-bubble schedule keeps a third of that one's passes (their weight
  // parts) off the fill and drain (grid_cost.cc).
  const double slots = m - 1 + p * (schedule == "zb" ? 2.0 / 3.0 : 1.0);
  plan.predicted_step_seconds = slots * slot;
  plan.bubble_fraction = (slots - m) / slots;
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
