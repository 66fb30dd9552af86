#include "server/grid_placement.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cost_model.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "server/grid_search.h"
#include "server/planner.h"

namespace shardline::server {

absl::StatusOr<shardline::v1::PlanResponse> PreviewGrid(const shardline::v1::JobSpec& spec,
                                                        const std::vector<WorkerRecord>& idle,
                                                        const LinkLookup& links) {
  const int p = spec.parallel().pipeline_stages(), d = spec.parallel().data_parallel();
  const int t = std::max(1, spec.parallel().tensor_parallel());
  if (static_cast<int>(idle.size()) < p * d * t) {
    return absl::InvalidArgumentError(absl::StrCat("the plan needs ", p * d * t, " workers (", p, " stages × ", d,
                                                   " replicas × ", t, " tensor ranks), ", idle.size(), " are idle"));
  }
  ASSIGN_OR_RETURN(std::vector<WorkerRecord> grid, ChooseGrid(spec, idle, {}, links));
  ASSIGN_OR_RETURN(GridCost cost, EstimateGrid(spec, grid, links));
  shardline::v1::PlanResponse out;
  for (int r = 0; r < d; ++r) {
    for (int s = 0; s < p; ++s) {
      for (int k = 0; k < t; ++k) {
        const StagePlan& sp = cost.plan.stages[s];
        const size_t i = static_cast<size_t>((r * p + s) * t + k);
        const PositionCost& pc = cost.positions[i];
        auto* st = out.add_stages();
        st->set_stage(s);
        st->set_replica(r);
        st->set_tensor_rank(k);
        st->set_worker(grid[i].name);
        st->set_unit_begin(sp.unit_begin);
        st->set_unit_end(sp.unit_end);
        st->set_seconds_per_micro_batch(pc.compute_seconds + pc.tensor_seconds);
        st->set_memory_bytes(pc.memory_bytes);
        // A rank holds about 1/t of the stage's parameters (the blocks' split).
        st->set_reduce_bytes_per_step(std::llround(ReduceBytesPerStep(sp.parameters / t, d)));
        st->set_tensor_bytes_per_step(
            std::llround(common::TensorGroupBytesPerRank(spec, sp.unit_begin, sp.unit_end)));
        st->set_compute_seconds(pc.compute_seconds);
        st->set_tensor_seconds(pc.tensor_seconds);
        st->set_hop_seconds(pc.hop_seconds);
        st->set_reduce_seconds(pc.reduce_seconds);
        st->set_optimizer_seconds(pc.optimizer_seconds);
        if (s + 1 < p) st->set_wire_to_next(pc.int8_to_next ? "int8" : spec.parallel().wire_dtype() == "auto" ? "f32"
                                                                                                     : spec.parallel().wire_dtype());
        if (d > 1) st->set_wire_reduce(pc.int8_reduce ? "int8" : "f32");
      }
    }
  }
  out.set_predicted_step_seconds(cost.step_seconds);
  out.set_bubble_fraction(cost.plan.bubble_fraction);
  out.set_slot_seconds(cost.slot_seconds);
  out.set_fill_seconds(cost.fill_seconds);
  out.set_optimizer_seconds(cost.optimizer_seconds);
  out.set_critical_path(cost.critical_path);
  return out;
}

absl::StatusOr<GridPlacement> PlaceGrid(const shardline::v1::JobSpec& job_spec, const std::string& job_id,
                                        int64_t first_step, int stages,
                                        const std::vector<WorkerRecord>& idle,
                                        const std::vector<std::string>& previous,
                                        const std::vector<int>& previous_cut, const LinkLookup& links,
                                        int replicas) {
  const int asked = std::max(1, job_spec.parallel().data_parallel());
  if (replicas == 0) replicas = asked;
  if (replicas < 1 || replicas > asked || asked % replicas != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot plan ", replicas, " replicas for a spec of ", asked, ": they must divide it"));
  }
  const int groups = asked / replicas;
  const int p = stages, d = replicas;
  const int t = std::max(1, job_spec.parallel().tensor_parallel());
  if (p < 1 || p > job_spec.parallel().pipeline_stages()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot plan ", p, " stages for a spec of ",
                                                   job_spec.parallel().pipeline_stages()));
  }
  const int n = p * d * t;
  if (static_cast<int>(idle.size()) < n) {
    return absl::FailedPreconditionError(absl::StrCat("placing ", n, " positions on ", idle.size(), " workers"));
  }
  shardline::v1::JobSpec spec = common::FoldReplicas(job_spec, d);
  spec.mutable_parallel()->set_pipeline_stages(p);
  ASSIGN_OR_RETURN(const std::vector<WorkerRecord> grid, ChooseGrid(spec, idle, previous, links, previous_cut));
  ASSIGN_OR_RETURN(GridCost cost, EstimateGrid(spec, grid, links, previous_cut));
  const PipelinePlan& plan = cost.plan;
  auto at = [&](int s, int r, int k) -> const WorkerRecord& { return grid[static_cast<size_t>((r * p + s) * t + k)]; };
  // Each earlier group's gradients wait on the host for the sum
  // (runtime::GradientBuckets::Hold): a float a parameter each.
  for (size_t i = 0; i < grid.size() && groups > 1; ++i) {
    const StagePlan& sp = plan.stages[(i / static_cast<size_t>(t)) % static_cast<size_t>(p)];
    const int64_t need = cost.positions[i].memory_bytes + int64_t{groups - 1} * sp.parameters / t * 4;
    if (need > grid[i].capabilities.memory_bytes()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "units [%d, %d) on worker %s need %.2f GiB running %d replicas' micro-batch groups, it has %.2f GiB",
          sp.unit_begin, sp.unit_end, grid[i].name, need / 1073741824.0, groups,
          grid[i].capabilities.memory_bytes() / 1073741824.0));
    }
  }
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
  out.predicted_step_seconds = cost.step_seconds;
  out.critical_path = cost.critical_path;
  out.stages = p;
  out.replicas = d;
  out.tensor_ranks = t;
  for (int r = 0; r < d; ++r) {
    for (int s = 0; s < p; ++s) {
      for (int k = 0; k < t; ++k) {
        const StagePlan& sp = plan.stages[s];
        const WorkerRecord& w = at(s, r, k);
        out.workers.push_back(w.id);
        out.flops_per_step.push_back(sp.flops_per_micro_batch * spec.train().micro_batches() / t);
        out.optimizer_parameters.push_back(static_cast<double>(sp.parameters) / t /
                                           (spec.parallel().shard_optimizer() ? d : 1));
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
        if (groups > 1) a.set_replica_groups(groups);
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
        // Both ends of a hop agree: activations one way, gradients back.
        const auto position = [&](int stage) { return static_cast<size_t>((r * p + stage) * t + k); };
        a.set_int8_to_next(s + 1 < p && cost.positions[position(s)].int8_to_next);
        a.set_int8_to_previous(s > 0 && cost.positions[position(s - 1)].int8_to_next);
        a.set_int8_reduce(cost.positions[position(s)].int8_reduce);
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
