#include "server/grid_cost.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/cost_model.h"
#include "common/int8_blocks.h"
#include "common/status_macros.h"
#include "server/link_memo.h"

namespace shardline::server {
namespace {

double MBps(double bytes_per_second) { return bytes_per_second / 1e6; }

}  // namespace

double ReduceBytesPerStep(int64_t parameters, int d) {
  return d > 1 ? 2.0 * (d - 1) * static_cast<double>(parameters) * sizeof(float) / d : 0;
}

std::string HostOf(const WorkerRecord& w) {
  const std::string& a = w.capabilities.listen_address();
  return a.substr(0, a.rfind(':'));
}

LinkLookup LinksFrom(const LinkTable* table) {
  auto estimate = [table](const WorkerRecord& from, const WorkerRecord& to) {
    LinkEstimate e;
    if (from.name == to.name) {
      e.bytes_per_second = std::numeric_limits<double>::infinity();
      e.measured = true;
      return e;
    }
    if (table == nullptr) {
      e.bytes_per_second = HostOf(from) == HostOf(to) ? kAssumedHostBytesPerSecond : kAssumedNetworkBytesPerSecond;
      return e;
    }
    std::optional<LinkRecord> link = table->Get(from.name, to.name);
    // A slowdown a job observed counts until the next probe.
    const double observed = link.has_value() ? link->observed_bytes_per_second : 0;
    if (link.has_value() && observed > 0 && (link->bytes_per_second <= 0 || observed < link->bytes_per_second)) {
      e.bytes_per_second = observed;
      e.rtt_seconds = link->rtt_seconds;
      e.measured = true;
      return e;
    }
    if (link.has_value() && link->bytes_per_second > 0) {
      e.bytes_per_second = link->bytes_per_second;
      e.rtt_seconds = link->rtt_seconds;
      e.measured = true;
    } else {
      e.bytes_per_second = HostOf(from) == HostOf(to) ? kAssumedHostBytesPerSecond : kAssumedNetworkBytesPerSecond;
    }
    // An end whose own link a job's figures blame caps it (a wire: not
    // within one host), unless it was probed since.
    if (HostOf(from) == HostOf(to)) return e;
    for (const std::string* end : {&from.name, &to.name}) {
      const std::optional<LinkSuspicion> suspect = table->Suspected(*end);
      if (!suspect.has_value() || (link.has_value() && link->measured_at > suspect->since)) continue;
      if (suspect->bytes_per_second < e.bytes_per_second) {
        e.bytes_per_second = suspect->bytes_per_second;
        e.measured = true;
      }
    }
    return e;
  };
  // Read once a link (LinkMemo): a search looks up every pair of its grid
  // at each of its thousands of evaluations.
  auto memo = std::make_shared<LinkMemo>(std::move(estimate));
  return [memo](const WorkerRecord& from, const WorkerRecord& to) { return memo->Get(from, to); };
}

LinkGroups GroupsOf(const std::vector<WorkerRecord>& grid, const LinkLookup& links) {
  return LinkGroups(grid, [&](size_t a, size_t b) { return links(grid[a], grid[b]).bytes_per_second; });
}

absl::StatusOr<GridCost> EstimateGrid(const shardline::v1::JobSpec& spec, const std::vector<WorkerRecord>& grid,
                                      const LinkLookup& links, const std::vector<int>& prefer_cut, bool keep_cut,
                                      const LinkGroups* known_groups) {
  const int p = spec.parallel().pipeline_stages(), d = std::max(1, spec.parallel().data_parallel());
  const int t = std::max(1, spec.parallel().tensor_parallel());
  const int m = spec.train().micro_batches();
  if (static_cast<int>(grid.size()) != p * d * t) {
    return absl::InvalidArgumentError(absl::StrFormat("a grid of %d positions for %d × %d × %d", grid.size(), p, d, t));
  }
  auto at = [&](int s, int r, int k) -> const WorkerRecord& { return grid[static_cast<size_t>((r * p + s) * t + k)]; };
  auto link = [&](const WorkerRecord& a, const WorkerRecord& b) { return links(a, b); };
  auto index = [&](int s, int r, int k) { return static_cast<size_t>((r * p + s) * t + k); };
  // Transfers between two link groups share the wire between them (two
  // hops, two tensor groups' collectives, two all-reduces across one
  // uplink): each gets its part of it.
  std::optional<LinkGroups> built;
  if (known_groups == nullptr) built.emplace(GroupsOf(grid, links));
  const LinkGroups& groups = known_groups != nullptr ? *known_groups : *built;
  auto pair_of = [&](size_t a, size_t b) {
    const int x = groups.group(a), y = groups.group(b);
    return std::make_pair(std::min(x, y), std::max(x, y));
  };
  // The tensor groups (s, r) with ranks on either side of each pair of
  // link groups: their collectives run in the same slots.
  std::map<std::pair<int, int>, int> tensor_crossing;
  auto tensor_pairs = [&](int s, int r) {
    std::set<std::pair<int, int>> pairs;
    for (int k = 0; k < t; ++k) {
      for (int j = k + 1; j < t; ++j) {
        if (!groups.same(index(s, r, k), index(s, r, j))) pairs.insert(pair_of(index(s, r, k), index(s, r, j)));
      }
    }
    return pairs;
  };
  for (int s = 0; s < p; ++s) {
    for (int r = 0; r < d; ++r) {
      for (const auto& pair : tensor_pairs(s, r)) ++tensor_crossing[pair];
    }
  }

  // Each stage as the planner sees it: the slowest and smallest of its d·t
  // workers, its t ranks as one worker t times as fast and large, its
  // tensor collectives at its groups' slowest link.
  // A restart (a cut to keep) cuts on the probes: its workers hold the
  // state of that cut, and a rate its reports moved (noise on a busy
  // machine, or the layers it ran) must not move it; re-planning on a
  // slowdown is a decision of its own.
  auto cut_rate = [&](const WorkerRecord& w) {
    return prefer_cut.empty() || keep_cut ? PlanningFlops(w) : w.capabilities.gemm_flops();
  };
  std::vector<WorkerCapacity> capacities;
  for (int s = 0; s < p; ++s) {
    const WorkerRecord& first = at(s, 0, 0);
    WorkerCapacity c{first.name, cut_rate(first), first.capabilities.memory_bytes(),
                     first.capabilities.gemm_flops_spread()};
    c.recomputes_attention = true;  // where every worker of the stage does
    double slowest_group_link = std::numeric_limits<double>::infinity();
    int tensor_shared = 1;
    for (int r = 0; r < d; ++r) {
      for (const auto& pair : tensor_pairs(s, r)) tensor_shared = std::max(tensor_shared, tensor_crossing[pair]);
      for (int k = 0; k < t; ++k) {
        const auto& caps = at(s, r, k).capabilities;
        c.flops_per_second = std::min(c.flops_per_second, cut_rate(at(s, r, k)));
        c.memory_bytes = std::min(c.memory_bytes, caps.memory_bytes());
        c.flops_spread = std::max(c.flops_spread, caps.gemm_flops_spread());
        c.recomputes_attention =
            c.recomputes_attention && common::RecomputesAttentionWeights(caps.device(), spec.model().context());
        c.composes_attention = c.composes_attention || !common::HasAttentionKernel(caps.device());
        for (int j = 0; j < t; ++j) {
          if (j != k) slowest_group_link = std::min(slowest_group_link, link(at(s, r, k), at(s, r, j)).bytes_per_second);
        }
      }
    }
    c.flops_per_second *= t;
    c.memory_bytes *= t;
    c.tensor_seconds_per_byte = t > 1 ? tensor_shared / slowest_group_link : 0;
    capacities.push_back(c);
  }
  GridCost cost;
  ASSIGN_OR_RETURN(cost.plan, PlanPipeline(spec, capacities, prefer_cut,
                                           keep_cut ? std::numeric_limits<double>::infinity() : kKeepCutSlack));

  const double sequences = static_cast<double>(spec.train().global_batch()) / (static_cast<double>(m) * d);
  const double hop_values = sequences * spec.model().context() * spec.model().d_model();
  const std::string& wire = spec.parallel().wire_dtype();
  const double hop_bytes = hop_values * (wire == "bf16" || wire == "f16" ? 2 : 4);
  const double int8_hop_bytes = static_cast<double>(common::Int8BlocksBytes(static_cast<size_t>(hop_values)));
  auto compute_of = [&](int s, const WorkerRecord& w) {
    return cost.plan.stages[s].flops_per_micro_batch / t / PredictingFlops(w);
  };
  cost.positions.resize(grid.size());
  std::map<std::pair<int, int>, int> crossing;  // hops between two groups
  for (int s = 0; s + 1 < p; ++s) {
    for (int r = 0; r < d; ++r) {
      for (int k = 0; k < t; ++k) {
        if (!groups.same(index(s, r, k), index(s + 1, r, k))) ++crossing[pair_of(index(s, r, k), index(s + 1, r, k))];
      }
    }
  }
  double slot = 0;
  const int optimizer_shards = spec.parallel().shard_optimizer() ? d : 1;
  for (int s = 0; s < p; ++s) {
    const StagePlan& sp = cost.plan.stages[s];
    for (int r = 0; r < d; ++r) {
      for (int k = 0; k < t; ++k) {
        PositionCost& pc = cost.positions[static_cast<size_t>((r * p + s) * t + k)];
        const WorkerRecord& w = at(s, r, k);
        // The cut was planned on the planning rates; the prediction counts
        // what each worker achieves where its reports say.
        pc.compute_seconds = compute_of(s, w);
        pc.tensor_seconds = sp.tensor_seconds;
        pc.memory_bytes = sp.memory_bytes / t;
        if (w.planning_optimizer_rate > 0) {
          pc.optimizer_seconds = static_cast<double>(sp.parameters) / t / optimizer_shards / w.planning_optimizer_rate;
          cost.optimizer_seconds = std::max(cost.optimizer_seconds, pc.optimizer_seconds);
        }
        if (pc.compute_seconds + pc.tensor_seconds > slot) {
          slot = pc.compute_seconds + pc.tensor_seconds;
          cost.critical_path = absl::StrFormat("compute of stage %d on %s (%.3f ms per micro-batch%s)", s, w.name,
                                               1e3 * slot,
                                               sp.tensor_seconds > 0
                                                   ? absl::StrFormat(", %.3f ms of it tensor collectives",
                                                                     1e3 * sp.tensor_seconds)
                                                   : "");
        }
        if (s + 1 < p) {
          const LinkEstimate forward = link(at(s, r, k), at(s + 1, r, k));
          const LinkEstimate backward = link(at(s + 1, r, k), at(s, r, k));
          const size_t from = index(s, r, k), to = index(s + 1, r, k);
          const int shared = groups.same(from, to) ? 1 : crossing[pair_of(from, to)];
          const double slower = std::min(forward.bytes_per_second, backward.bytes_per_second) / shared;
          const double rtt = std::max(forward.rtt_seconds, backward.rtt_seconds);
          pc.hop_seconds = hop_bytes / slower + rtt;
          // 8-bit blocks: on every hop, or ("auto") where the f32 hop takes
          // a large share of the slower end's compute.
          const double compute = std::max(pc.compute_seconds, compute_of(s + 1, at(s + 1, r, k)));
          pc.int8_to_next = wire == "int8" || (wire == "auto" && pc.hop_seconds > kInt8HopShare * compute);
          if (pc.int8_to_next) pc.hop_seconds = int8_hop_bytes / slower + rtt;
          if (pc.hop_seconds > slot) {
            slot = pc.hop_seconds;
            cost.critical_path = absl::StrFormat(
                "hop from stage %d to %d of replica %d (%s ↔ %s, %.1f MB/s%s%s%s): %.3f ms per micro-batch", s,
                s + 1, r, at(s, r, k).name, at(s + 1, r, k).name, MBps(slower),
                shared > 1 ? absl::StrFormat(", its link's share with %d hops", shared) : "",
                forward.measured && backward.measured ? "" : ", not measured", pc.int8_to_next ? ", 8-bit" : "",
                1e3 * slot);
          }
        }
      }
    }
  }
  cost.slot_seconds = slot;
  // The fill and drain: one micro-batch's passes through every stage and
  // its activation and gradient over every hop (the slowest replica's),
  // before and after which the other m − 1 follow one slot apart. Under
  // the zero-bubble schedule a pass's weight part (a third of its compute:
  // forward, input and weight parts are each ~2·params FLOPs a token) runs
  // beside the drain instead of on it, as pipeline_schedule's simulation has it.
  const double on_fill = spec.parallel().schedule() == "zb" ? 2.0 / 3.0 : 1.0;
  for (int s = 0; s < p; ++s) {
    double stage = 0, hop = 0;
    for (int r = 0; r < d; ++r) {
      for (int k = 0; k < t; ++k) {
        const PositionCost& pc = cost.positions[static_cast<size_t>((r * p + s) * t + k)];
        stage = std::max(stage, pc.compute_seconds + pc.tensor_seconds);
        hop = std::max(hop, pc.hop_seconds);
      }
    }
    cost.fill_seconds += on_fill * stage + 2 * hop;
  }
  const double pipeline = (m - 1) * slot + cost.fill_seconds;
  // Each all-reduce a step: a stage's ranks (s, ·, k) exchange their
  // buffer's chunks pairwise, (d − 1)/d of it out and in per phase; alone,
  // the group's slowest link carries it; where groups (s, ·, k) cross
  // between two link groups, the wire between them carries every such
  // group's bytes that way.
  auto reduce_times = [&](const std::vector<bool>& int8) {
    std::vector<double> seconds(grid.size(), 0.0);
    if (d < 2) return seconds;
    auto buffer = [&](int s, int k) {
      return static_cast<double>(cost.plan.stages[s].parameters) / t * sizeof(float) *
             (int8[index(s, 0, k)] ? kInt8BytesPerF32Byte : 1.0);
    };
    std::map<std::pair<int, int>, double> across, wire_rate;  // (from group, to group): bytes a step, its link
    for (int s = 0; s < p; ++s) {
      for (int k = 0; k < t; ++k) {
        for (int q = 0; q < d; ++q) {
          for (int o = 0; o < d; ++o) {
            const size_t a = index(s, q, k), b = index(s, o, k);
            if (q == o || groups.same(a, b)) continue;
            const auto key = std::make_pair(groups.group(a), groups.group(b));
            across[key] += 2 * buffer(s, k) / d;
            const double rate = link(grid[a], grid[b]).bytes_per_second;
            wire_rate[key] = wire_rate.count(key) ? std::min(wire_rate[key], rate) : rate;
          }
        }
      }
    }
    for (int s = 0; s < p; ++s) {
      for (int k = 0; k < t; ++k) {
        double slowest = std::numeric_limits<double>::infinity(), rtt = 0, shared = 0;
        for (int q = 0; q < d; ++q) {
          const LinkEstimate e = link(at(s, q, k), at(s, (q + 1) % d, k));
          slowest = std::min(slowest, e.bytes_per_second);
          rtt = std::max(rtt, e.rtt_seconds);
          for (int o = 0; o < d; ++o) {
            const size_t a = index(s, q, k), b = index(s, o, k);
            if (q == o || groups.same(a, b)) continue;
            const auto key = std::make_pair(groups.group(a), groups.group(b));
            shared = std::max(shared, across[key] / wire_rate[key]);
          }
        }
        const double alone = 2.0 * (d - 1) / d * buffer(s, k) / slowest;
        for (int r = 0; r < d; ++r) seconds[index(s, r, k)] = std::max(alone, shared) + 2 * (d - 1) * rtt;
      }
    }
    return seconds;
  };
  // 8-bit all-reduces: on every stage with replicas, or ("auto") where the
  // f32 one takes a large share of the pipeline's time. A stage's ranks
  // (s, ·, k) share one group, so they decide alike.
  const std::vector<double> f32_reduce = reduce_times(std::vector<bool>(grid.size(), false));
  std::vector<bool> int8(grid.size(), false);
  for (size_t i = 0; i < grid.size(); ++i) {
    int8[i] = d > 1 && (wire == "int8" || (wire == "auto" && f32_reduce[i] > kInt8HopShare * pipeline));
  }
  const std::vector<double> reduce = reduce_times(int8);
  int reducing = -1;
  for (size_t i = 0; i < cost.positions.size(); ++i) {
    PositionCost& pc = cost.positions[i];
    pc.int8_reduce = int8[i];
    pc.reduce_seconds = reduce[i];
    if (pc.reduce_seconds > cost.reduce_seconds) {
      cost.reduce_seconds = pc.reduce_seconds;
      reducing = static_cast<int>(i);
    }
  }
  cost.step_seconds = pipeline + cost.reduce_seconds + cost.optimizer_seconds;
  if (reducing >= 0 && cost.reduce_seconds > pipeline) {
    cost.critical_path = absl::StrFormat("the data-parallel all-reduce of stage %d (%.3f ms a step, on %s's ring%s)",
                                         (reducing / t) % p, 1e3 * cost.reduce_seconds, grid[reducing].name,
                                         cost.positions[reducing].int8_reduce ? ", 8-bit" : "");
  }
  return cost;
}

}  // namespace shardline::server
