#include "server/grid_placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/planner.h"

namespace shardline::server {
namespace {

// What each stage of a p × d grid can count on: its replicas share one cut,
// so the slowest and the smallest of a stage's d workers (positions r·p + s)
// decide, under replica 0's name.
std::vector<WorkerCapacity> GridCapacities(const std::vector<WorkerRecord>& workers, int p, int d) {
  std::vector<WorkerCapacity> out;
  for (int s = 0; s < p; ++s) {
    WorkerCapacity c{workers[s].name, workers[s].capabilities.gemm_flops(), workers[s].capabilities.memory_bytes()};
    for (int r = 1; r < d; ++r) {
      const auto& caps = workers[r * p + s].capabilities;
      c.flops_per_second = std::min(c.flops_per_second, caps.gemm_flops());
      c.memory_bytes = std::min(c.memory_bytes, caps.memory_bytes());
    }
    out.push_back(c);
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
  if (static_cast<int>(idle.size()) < p * d) {
    return absl::InvalidArgumentError(absl::StrCat("the plan needs ", p * d, " workers (", p, " stages × ", d,
                                                   " replicas), ", idle.size(), " are idle"));
  }
  ASSIGN_OR_RETURN(PipelinePlan plan, PlanPipeline(spec, GridCapacities(idle, p, d)));
  shardline::v1::PlanResponse out;
  for (int r = 0; r < d; ++r) {
    for (int s = 0; s < p; ++s) {
      const StagePlan& sp = plan.stages[s];
      auto* st = out.add_stages();
      st->set_stage(s);
      st->set_replica(r);
      st->set_worker(idle[r * p + s].name);
      st->set_unit_begin(sp.unit_begin);
      st->set_unit_end(sp.unit_end);
      st->set_seconds_per_micro_batch(sp.seconds_per_micro_batch);
      st->set_memory_bytes(sp.memory_bytes);
      st->set_reduce_bytes_per_step(ReduceBytesPerStep(sp.parameters, d));
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
  if (p < 1 || p > job_spec.parallel().pipeline_stages()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot plan ", p, " stages for a spec of ",
                                                   job_spec.parallel().pipeline_stages()));
  }
  if (static_cast<int>(idle.size()) < p * d) {
    return absl::FailedPreconditionError(absl::StrCat("placing ", p * d, " positions on ", idle.size(), " workers"));
  }
  shardline::v1::JobSpec spec = job_spec;
  spec.mutable_parallel()->set_pipeline_stages(p);
  const std::vector<WorkerRecord> grid = ChooseGrid(idle, p * d, previous);
  ASSIGN_OR_RETURN(PipelinePlan plan, PlanPipeline(spec, GridCapacities(grid, p, d), previous_cut));
  GridPlacement out;
  out.stages = p;
  out.replicas = d;
  for (int r = 0; r < d; ++r) {
    for (int s = 0; s < p; ++s) {
      const StagePlan& sp = plan.stages[s];
      const WorkerRecord& w = grid[r * p + s];
      out.workers.push_back(w.id);
      shardline::v1::StageStatus& status = out.stage_statuses.emplace_back();
      status.set_stage(s);
      status.set_replica(r);
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
      if (s > 0) a.set_upstream_address(grid[r * p + s - 1].capabilities.listen_address());
      a.set_first_step(first_step);
      a.set_replica(r);
      a.set_replicas(d);
      if (d > 1) {
        for (int q = 0; q < d; ++q) a.add_replica_addresses(grid[q * p + s].capabilities.listen_address());
      }
      for (int q = 0; q < d && first_step > 1; ++q) {
        if (q != r) a.add_state_peers(grid[q * p + s].capabilities.listen_address());
      }
    }
  }
  return out;
}

}  // namespace shardline::server
