#include "server/grid_placement.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/cost_model.h"
#include "common/status_macros.h"
#include "server/planner.h"

namespace shardline::server {
namespace {

// What each stage of a p × d grid can count on: its replicas share one cut,
// so the slowest and the smallest of a stage's d workers (positions r·p + s)
// decide, under replica 0's name.
std::vector<WorkerCapacity> GridCapacities(const std::vector<WorkerRecord>& workers, int p, int d, int t) {
  std::vector<WorkerCapacity> out;
  for (int s = 0; s < p; ++s) {
    const WorkerRecord& first = workers[static_cast<size_t>(s * t)];
    WorkerCapacity c{first.name, first.capabilities.gemm_flops(), first.capabilities.memory_bytes(),
                     first.capabilities.gemm_flops_spread()};
    for (int r = 0; r < d; ++r) {
      for (int k = 0; k < t; ++k) {
        const auto& caps = workers[static_cast<size_t>((r * p + s) * t + k)].capabilities;
        c.flops_per_second = std::min(c.flops_per_second, caps.gemm_flops());
        c.memory_bytes = std::min(c.memory_bytes, caps.memory_bytes());
        c.flops_spread = std::max(c.flops_spread, caps.gemm_flops_spread());
      }
    }
    c.flops_per_second *= t;
    c.memory_bytes *= t;
    out.push_back(c);
  }
  return out;
}

// Idle workers ordered so that consecutive runs of t share a host where
// they can: a host's workers together, hosts in the order their first idle
// worker registered.
// The host part of a worker's StageLink address.
std::string HostOf(const WorkerRecord& w) {
  const std::string& a = w.capabilities.listen_address();
  return a.substr(0, a.rfind(':'));
}

std::vector<WorkerRecord> ByHost(const std::vector<WorkerRecord>& idle, int t) {
  if (t <= 1) return idle;
  const auto host = HostOf;
  std::vector<std::string> hosts;
  for (const WorkerRecord& w : idle) {
    if (std::find(hosts.begin(), hosts.end(), host(w)) == hosts.end()) hosts.push_back(host(w));
  }
  std::vector<WorkerRecord> out;
  for (const std::string& h : hosts) {
    for (const WorkerRecord& w : idle) {
      if (host(w) == h) out.push_back(w);
    }
  }
  return out;
}

// Gradient bytes one worker of a stage sends per step in its group's
// all-reduce (reduce-scatter and all-gather, (d − 1)/d each).
int64_t ReduceBytesPerStep(int64_t parameters, int d) {
  return d > 1 ? 2 * (d - 1) * parameters * static_cast<int64_t>(sizeof(float)) / d : 0;
}

// `n` of `idle`: the worker named previous[i] at position i where it is
// idle (previous.size() == n), the others in order.
std::vector<WorkerRecord> ChooseGrid(const std::vector<WorkerRecord>& idle, int n,
                                     const std::vector<std::string>& previous) {
  std::vector<WorkerRecord> grid(n);
  std::vector<bool> placed(n, false), used(idle.size(), false);
  for (int i = 0; i < n && static_cast<int>(previous.size()) == n; ++i) {
    for (size_t w = 0; w < idle.size(); ++w) {
      if (!used[w] && idle[w].name == previous[i]) {
        grid[i] = idle[w];
        placed[i] = used[w] = true;
        break;
      }
    }
  }
  size_t next = 0;
  for (int i = 0; i < n; ++i) {
    if (placed[i]) continue;
    while (used[next]) ++next;
    grid[i] = idle[next];
    used[next] = true;
  }
  return grid;
}

}  // namespace

absl::StatusOr<shardline::v1::PlanResponse> PreviewGrid(const shardline::v1::JobSpec& spec,
                                                        const std::vector<WorkerRecord>& idle) {
  const int p = spec.parallel().pipeline_stages(), d = spec.parallel().data_parallel();
  const int t = std::max(1, spec.parallel().tensor_parallel());
  if (static_cast<int>(idle.size()) < p * d * t) {
    return absl::InvalidArgumentError(absl::StrCat("the plan needs ", p * d * t, " workers (", p, " stages × ", d,
                                                   " replicas × ", t, " tensor ranks), ", idle.size(), " are idle"));
  }
  const std::vector<WorkerRecord> grid = ByHost(idle, t);
  ASSIGN_OR_RETURN(PipelinePlan plan, PlanPipeline(spec, GridCapacities(grid, p, d, t)));
  shardline::v1::PlanResponse out;
  for (int r = 0; r < d; ++r) {
    for (int s = 0; s < p; ++s) {
      for (int k = 0; k < t; ++k) {
        const StagePlan& sp = plan.stages[s];
        auto* st = out.add_stages();
        st->set_stage(s);
        st->set_replica(r);
        st->set_tensor_rank(k);
        st->set_worker(grid[static_cast<size_t>((r * p + s) * t + k)].name);
        st->set_unit_begin(sp.unit_begin);
        st->set_unit_end(sp.unit_end);
        st->set_seconds_per_micro_batch(sp.seconds_per_micro_batch);
        st->set_memory_bytes(sp.memory_bytes / t);
        // A rank holds about 1/t of the stage's parameters (the blocks' split).
        st->set_reduce_bytes_per_step(ReduceBytesPerStep(sp.parameters / t, d));
        st->set_tensor_bytes_per_step(
            std::llround(common::TensorGroupBytesPerRank(spec, sp.unit_begin, sp.unit_end)));
      }
    }
  }
  out.set_predicted_step_seconds(plan.predicted_step_seconds);
  out.set_bubble_fraction(plan.bubble_fraction);
  return out;
}

absl::StatusOr<GridPlacement> PlaceGrid(const shardline::v1::JobSpec& job_spec, const std::string& job_id,
                                        int64_t first_step, int stages,
                                        const std::vector<WorkerRecord>& idle,
                                        const std::vector<std::string>& previous,
                                        const std::vector<int>& previous_cut) {
  const int p = stages, d = job_spec.parallel().data_parallel();
  const int t = std::max(1, job_spec.parallel().tensor_parallel());
  if (p < 1 || p > job_spec.parallel().pipeline_stages()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot plan ", p, " stages for a spec of ",
                                                   job_spec.parallel().pipeline_stages()));
  }
  const int n = p * d * t;
  if (static_cast<int>(idle.size()) < n) {
    return absl::FailedPreconditionError(absl::StrCat("placing ", n, " positions on ", idle.size(), " workers"));
  }
  shardline::v1::JobSpec spec = job_spec;
  spec.mutable_parallel()->set_pipeline_stages(p);
  const std::vector<WorkerRecord> grid = ChooseGrid(ByHost(idle, t), n, previous);
  ASSIGN_OR_RETURN(PipelinePlan plan, PlanPipeline(spec, GridCapacities(grid, p, d, t), previous_cut));
  auto at = [&](int s, int r, int k) -> const WorkerRecord& { return grid[static_cast<size_t>((r * p + s) * t + k)]; };
  // Whether the edge between stages s and s + 1 of replica r carries parts
  // of tensors (scatter/gather): across hosts it crosses a wire t times
  // less (docs/benchmarks.md, bench_stage_layout); within one, no layout
  // wins and the whole tensor saves the all-gather.
  const std::string& layout = spec.parallel().stage_link_layout();
  auto split_edge = [&](int s, int r) {
    if (t <= 1 || layout == "same_rank") return false;
    if (layout == "scatter_gather") return true;
    for (int k = 0; k < t; ++k) {
      if (HostOf(at(s, r, k)) != HostOf(at(s + 1, r, k))) return true;
    }
    return false;
  };
  GridPlacement out;
  out.stages = p;
  out.replicas = d;
  out.tensor_ranks = t;
  for (int r = 0; r < d; ++r) {
    for (int s = 0; s < p; ++s) {
      for (int k = 0; k < t; ++k) {
        const StagePlan& sp = plan.stages[s];
        const WorkerRecord& w = at(s, r, k);
        out.workers.push_back(w.id);
        shardline::v1::StageStatus& status = out.stage_statuses.emplace_back();
        status.set_stage(s);
        status.set_replica(r);
        status.set_tensor_rank(k);
        status.set_worker(w.name);
        status.set_unit_begin(sp.unit_begin);
        status.set_unit_end(sp.unit_end);
        shardline::v1::Assignment& a = out.assignments.emplace_back();
        a.set_job_id(job_id);
        *a.mutable_spec() = spec;
        a.set_stage(s);
        a.set_stages(p);
        a.set_unit_begin(sp.unit_begin);
        a.set_unit_end(sp.unit_end);
        // Each tensor rank exchanges activations with the same rank of its neighbours.
        if (s > 0) a.set_upstream_address(at(s - 1, r, k).capabilities.listen_address());
        a.set_first_step(first_step);
        a.set_replica(r);
        a.set_replicas(d);
        if (d > 1) {
          for (int q = 0; q < d; ++q) a.add_replica_addresses(at(s, q, k).capabilities.listen_address());
        }
        a.set_tensor_rank(k);
        a.set_tensor_size(t);
        if (t > 1) {
          for (int j = 0; j < t; ++j) a.add_tensor_addresses(at(s, r, j).capabilities.listen_address());
        }
        a.set_gather_from_previous(s > 0 && split_edge(s - 1, r));
        a.set_scatter_to_next(s + 1 < p && split_edge(s, r));
        // Every position of the stage holds the same (global) snapshot.
        for (int q = 0; q < d && first_step > 1; ++q) {
          for (int j = 0; j < t; ++j) {
            if (q != r || j != k) a.add_state_peers(at(s, q, j).capabilities.listen_address());
          }
        }
      }
    }
  }
  return out;
}

}  // namespace shardline::server
