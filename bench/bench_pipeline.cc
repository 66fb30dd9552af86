// bench_pipeline: pipeline-parallel training throughput on loopback. p
// stages (threads of this process, each with its own backend and BLAS
// thread budget) talk over real gRPC stage links; m = 4p micro-batches.
// Reports tokens/s, pipeline efficiency (Σ stage busy time ÷ (p × step
// time)) next to the analytic bound 1 − (p−1)/(m+p−1), the exposed
// communication time (step time − the busiest stage's compute), peak
// activation slots, the peak tensor bytes held by one stage's links and
// the most staging slots it used (the credit window and the pools bound
// them, whatever the stages' speeds), the process's
// peak resident memory (all stages; it only grows, so each row includes the
// rows before it), and tokens/s relative to the single-process trainer on
// the same model and thread budget in the same run, with the largest
// relative gap between the two runs' losses (0 on the CPU: the pipeline is
// the reference arithmetic). --device=cuda:N puts every stage and the
// trainer on that GPU (each stage with its own streams; staging pinned).
// Each row also carries the raw timings (tokens, wall, busy and busiest-stage
// seconds of the timed steps, the trainer's tokens and seconds), so a reader
// can recompute every figure.
//
// --data_parallel=1,2 adds rows with d replicas of each pipeline (p × d
// positions, PipelineGrid) training the same global batch, the d replicas
// of a stage summing their gradients over gRPC (GrpcCollective) in buckets
// that overlap the backward pass: each such row gives the share of the
// reduction time hidden behind the backward pass (reduce_hidden = 1 −
// reduce_exposed_s ÷ reduce_s, over every position) and tokens/s next to
// d = 1 on the same total threads (vs_d1). --shard_optimizer runs those
// rows with ZeRO-1; optimizer_state_mib is the most one position holds.
//
// --schedule=1f1b,zb measures every row with each schedule (zero_bubble:
// 1 for zb's rows, whose analytic bound is the simulated schedule's share of
// busy time, pipeline_schedule.h).
//
// --tensor_parallel=2 adds rows with each stage split over t ranks (one
// replica; the embedding and head vocabulary-parallel where the spec's
// default says so: common::VocabParallel): the bytes the tensor groups'
// collectives move per step next to the count (4 all-reduces of a
// micro-batch's B·T·C floats per block per micro-batch, each rank
// receiving 2 (t − 1)/t of each; the embedding's and the head's all-reduce
// and the loss parts' all-gather; the gradient norm's doubles), the seconds
// they take (synchronous: all exposed) and tokens/s next to t = 1 (vs_t1).
//
//   bench_pipeline [--stages=2,4] [--schedule=1f1b,zb] [--data_parallel=1,2] [--tensor_parallel=1,2] [--bucket_mib=N]
//                  [--shard_optimizer] [--steps=N] [--threads=N] [--device=cpu|cuda:N] [--json=FILE]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_report.h"
#include "bench/pipeline_grid.h"
#include "common/cost_model.h"
#include "common/init.h"
#include "common/job_spec.h"
#include "common/median.h"
#include "worker/backend/backend_factory.h"
#include "worker/runtime/pipeline_stage.h"
#include "worker/trainer/trainer.h"

ABSL_FLAG(std::string, stages, "2,4", "pipeline depths to measure");
ABSL_FLAG(double, bucket_mib, 25, "gradient bucket size of the d > 1 rows (parallel.bucket_mib)");
ABSL_FLAG(bool, shard_optimizer, false, "ZeRO-1 in the d > 1 rows (parallel.shard_optimizer)");
ABSL_FLAG(std::string, data_parallel, "1", "replicas of each pipeline to measure (e.g. 1,2); d > 1 rows compare to d = 1");
ABSL_FLAG(std::string, tensor_parallel, "1",
          "tensor ranks per stage to measure (e.g. 1,2), with one replica; t > 1 rows compare to t = 1");
ABSL_FLAG(std::string, schedule, "1f1b",
          "pipeline schedules to measure (parallel.schedule: gpipe, 1f1b, zb), e.g. 1f1b,zb");
ABSL_FLAG(int, steps, 6, "timed steps per configuration (after one warm-up step)");
ABSL_FLAG(int, threads, 0, "total compute threads (0: all cores), divided among the stages");
ABSL_FLAG(std::string, json, "", "write the rows as JSON to this file");
ABSL_FLAG(std::string, device, "cpu", "where the stages and the trainer run: cpu or cuda:N");

namespace shardline::bench {
namespace {

using worker::runtime::StageStepResult;

// The "default larger model" of the issues: d_model 512, 8 layers, context 128.
// m = 4p micro-batches of two sequences per step, split among the d
// replicas: the same global batch (and micro-batch size) for every d.
shardline::v1::JobSpec Spec(int stages, int replicas, int tensor, const std::string& schedule) {
  auto spec = common::ParseJobSpec(R"({"name": "bench",
    "model": {"kind": "gpt", "vocab_size": 256, "context": 128, "d_model": 512, "n_heads": 8, "n_layers": 8},
    "data": {"kind": "text_bytes", "path": "/usr/share/common-licenses/GPL-3"},
    "train": {"steps": 1000, "global_batch": 16, "micro_batches": 8, "seed": 1,
              "optimizer": {"kind": "adamw", "lr": 0.0003}}})");
  BENCH_CHECK_OK(spec.status());
  spec->mutable_parallel()->set_pipeline_stages(stages);
  spec->mutable_parallel()->set_schedule(schedule);
  spec->mutable_parallel()->set_data_parallel(replicas);
  spec->mutable_parallel()->set_tensor_parallel(tensor);
  spec->mutable_parallel()->set_bucket_mib(absl::GetFlag(FLAGS_bucket_mib));
  spec->mutable_parallel()->set_shard_optimizer(replicas > 1 && absl::GetFlag(FLAGS_shard_optimizer));
  spec->mutable_train()->set_micro_batches(4 * stages / replicas);
  spec->mutable_train()->set_global_batch(2 * 4 * stages);
  return *spec;
}

// Even cut of the units, the embedding with the first block and the head with the last.
std::vector<int> Cuts(int units, int stages) {
  std::vector<int> cuts = {0};
  for (int s = 1; s < stages; ++s) cuts.push_back(1 + (units - 2) * s / stages);
  cuts.push_back(units);
  return cuts;
}

// The process's peak resident memory so far (VmHWM), in MiB.
double PeakRssMiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0.0;
}

struct Reference {
  int64_t tokens = 0;          // trained in the timed steps
  double seconds = 0;          // the timed steps' wall time
  std::vector<double> losses;  // steps 2, 3, ...
};

Reference RunReference(const shardline::v1::JobSpec& spec, int threads, int steps) {
  auto backend = worker::CreateBackend(absl::GetFlag(FLAGS_device), {threads});
  BENCH_CHECK_OK(backend.status());
  auto trainer = worker::trainer::Trainer::Create(spec, **backend);
  BENCH_CHECK_OK(trainer.status());
  BENCH_CHECK_OK((*trainer)->TrainStep(1).status());
  Reference out;
  const auto start = std::chrono::steady_clock::now();
  for (int step = 2; step < 2 + steps; ++step) {
    auto r = (*trainer)->TrainStep(step);
    BENCH_CHECK_OK(r.status());
    out.tokens += r->tokens;
    out.losses.push_back(r->loss);
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

// The bytes a p × 1 × t grid's tensor groups receive per step, all ranks
// together, counted from the configuration (common::TensorGroupBytesPerRank).
double TensorBytesAnalytic(const shardline::v1::JobSpec& spec, const std::vector<int>& cuts, int t) {
  double bytes = 0;
  for (int s = 0; s < spec.parallel().pipeline_stages(); ++s) {
    bytes += t * common::TensorGroupBytesPerRank(spec, cuts[s], cuts[s + 1]);
  }
  return bytes;
}

// One row: p stages × d replicas × t tensor ranks sharing `total_threads`;
// `d1` is the tokens/s of the same p with d = t = 1 in this run (0 for that
// row itself).
double Measure(int p, int d, int t, const std::string& schedule, int total_threads, int steps, double d1,
               BenchReport& report) {
  const shardline::v1::JobSpec spec = Spec(p, d, t, schedule);
  const auto config = worker::nn::ModelConfig::FromSpec(spec.model());
  const int stage_threads = std::max(1, total_threads / (p * d * t));
  const std::vector<int> cuts = Cuts(config.units(), p);
  PipelineGrid grid(spec, cuts, absl::GetFlag(FLAGS_device), stage_threads);
  grid.RunStep(1);  // warm-up: allocations, connections
  const uint64_t tensor_bytes_before = grid.TensorBytesReceived();
  const double tensor_seconds_before = grid.TensorSeconds();
  double wall = 0, busy = 0, busiest = 0, exposed = 0, reduce = 0, reduce_exposed = 0;
  int64_t tokens = 0;
  size_t peak = 0, optimizer_state = 0;
  std::vector<double> losses, step_seconds;
  for (int step = 2; step < 2 + steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<StageStepResult> r = grid.RunStep(step);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    wall += seconds;
    step_seconds.push_back(seconds);
    double loss = 0;  // the replicas' parts, in rank order (tensor rank 0's)
    for (int q = 0; q < d; ++q) {
      tokens += r[static_cast<size_t>(q * p * t)].tokens;
      loss += r[static_cast<size_t>((q * p + p - 1) * t)].loss;
    }
    losses.push_back(loss);
    double most = 0;
    for (const auto& s : r) {
      busy += s.busy_seconds;
      most = std::max(most, s.busy_seconds);
      peak = std::max(peak, s.peak_slots);
      reduce += s.reduce_seconds;
      reduce_exposed += s.reduce_exposed_seconds;
      optimizer_state = std::max(optimizer_state, s.optimizer_state_bytes);
    }
    busiest += most;
    exposed += seconds - most;
  }
  const uint64_t link_peak = grid.LinkPeakBytes();
  const int staging_peak = grid.LinkPeakStagingSlots();
  const int m = spec.train().micro_batches();
  const double efficiency = busy / (p * d * t * wall);
  // The schedule's share of busy time with unit costs for F, B and W (for
  // 1F1B and GPipe 1 − (p−1)/(m+p−1)).
  const auto kind = worker::runtime::ParseScheduleKind(schedule);
  BENCH_CHECK_OK(kind.status());
  const auto units = worker::runtime::SimulatedStepUnits(*kind, p, m);
  BENCH_CHECK_OK(units.status());
  const double bound = 3.0 * m / *units;
  // The trainer with the same spec (it sums the replicas' gradients as they do).
  const Reference reference = RunReference(spec, total_threads, steps);
  double loss_gap = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    loss_gap = std::max(loss_gap, std::fabs(losses[i] - reference.losses[i]) / std::fabs(reference.losses[i]));
  }
  const double reference_tokens_per_s = reference.tokens / reference.seconds;
  BenchReport::Row row = {{"stages", static_cast<double>(p)},
                          {"data_parallel", static_cast<double>(d)},
                          {"tensor_parallel", static_cast<double>(t)},
                          {"vocab_parallel", common::VocabParallel(spec) ? 1.0 : 0.0},
                          {"micro_batches", static_cast<double>(m)},
                          {"zero_bubble", *kind == worker::runtime::ScheduleKind::kZeroBubble ? 1.0 : 0.0},
                          {"threads_per_stage", static_cast<double>(stage_threads)},
                          {"bucket_mib", spec.parallel().bucket_mib()},
                          {"shard_optimizer", spec.parallel().shard_optimizer() ? 1.0 : 0.0},
                          // The most one position holds (ZeRO-1: its share).
                          {"optimizer_state_mib", static_cast<double>(optimizer_state) / (1 << 20)},
                          {"tokens_per_s", tokens / wall},
                          {"efficiency", efficiency},
                          {"analytic_bound", bound},
                          {"efficiency_vs_bound", efficiency / bound},
                          {"exposed_comm_ms", exposed / steps * 1e3},
                          {"step_ms", wall / steps * 1e3},
                          {"median_step_ms", common::Median(step_seconds) * 1e3},
                          {"peak_slots", static_cast<double>(peak)},
                          {"link_peak_mib", static_cast<double>(link_peak) / (1 << 20)},
                          {"staging_slots_peak", static_cast<double>(staging_peak)},
                          {"peak_rss_mib", PeakRssMiB()},
                          {"reference_tokens_per_s", reference_tokens_per_s},
                          {"vs_reference", tokens / wall / reference_tokens_per_s}};
  if (d > 1) {
    // The share of the gradient reduction the backward pass hid, and the
    // throughput next to one pipeline on the same threads.
    row.push_back({"reduce_hidden", reduce > 0 ? 1.0 - reduce_exposed / reduce : 0.0});
    row.push_back({"vs_d1", d1 > 0 ? tokens / wall / d1 : 0.0});
  }
  if (t > 1) {
    // The tensor groups' all-reduces: bytes per step, all ranks together,
    // measured and counted; their seconds, all on the critical path, as a
    // share of the positions' wall time; throughput next to t = 1.
    const double tensor_seconds = grid.TensorSeconds() - tensor_seconds_before;
    row.push_back({"tensor_bytes_per_step", static_cast<double>(grid.TensorBytesReceived() - tensor_bytes_before) /
                                                steps});
    row.push_back({"tensor_bytes_analytic", TensorBytesAnalytic(spec, cuts, t)});
    row.push_back({"tensor_allreduce_s", tensor_seconds});
    row.push_back({"tensor_exposed", tensor_seconds / (p * d * t * wall)});
    row.push_back({"vs_t1", d1 > 0 ? tokens / wall / d1 : 0.0});
  }
  row.insert(row.end(), {{"max_loss_gap", loss_gap},
                         // The raw timings the figures above come from.
                         {"timed_steps", static_cast<double>(steps)},
                         {"tokens", static_cast<double>(tokens)},
                         {"wall_s", wall},
                         {"busy_s", busy},
                         {"busiest_s", busiest},
                         {"reference_tokens", static_cast<double>(reference.tokens)},
                         {"reference_wall_s", reference.seconds}});
  if (d > 1) {
    row.insert(row.end(), {{"reduce_s", reduce}, {"reduce_exposed_s", reduce_exposed}, {"d1_tokens_per_s", d1}});
  }
  report.Add(std::move(row));
  return tokens / wall;
}

int Main() {
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads)
                                                       : static_cast<int>(std::thread::hardware_concurrency());
  if (absl::StatusOr<std::unique_ptr<worker::Backend>> probe = worker::CreateBackend(absl::GetFlag(FLAGS_device));
      !probe.ok()) {
    std::fprintf(stderr, "Error: --device=%s: %s\n", absl::GetFlag(FLAGS_device).c_str(),
                 probe.status().ToString().c_str());
    return 3;
  }
  BenchReport report;
  std::vector<int> replicas;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_data_parallel), ',', absl::SkipEmpty())) {
    int d = 0;
    if (!absl::SimpleAtoi(s, &d) || d < 1 || d > 8) {
      std::fprintf(stderr, "Error: bad --data_parallel entry '%s' (1..8)\n", std::string(s).c_str());
      return 3;
    }
    replicas.push_back(d);
  }
  if (replicas.empty()) replicas.push_back(1);
  std::vector<int> tensor_ranks;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_tensor_parallel), ',', absl::SkipEmpty())) {
    int t = 0;
    if (!absl::SimpleAtoi(s, &t) || t < 1 || t > 8 || 8 % t != 0) {
      std::fprintf(stderr, "Error: bad --tensor_parallel entry '%s' (1, 2, 4 or 8: it must divide the 8 heads)\n",
                   std::string(s).c_str());
      return 3;
    }
    tensor_ranks.push_back(t);
  }
  std::vector<std::string> schedules;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_schedule), ',', absl::SkipEmpty())) {
    if (!worker::runtime::ParseScheduleKind(s).ok()) {
      std::fprintf(stderr, "Error: bad --schedule entry '%s' (gpipe, 1f1b or zb)\n", std::string(s).c_str());
      return 3;
    }
    schedules.emplace_back(s);
  }
  if (schedules.empty()) schedules.push_back("1f1b");
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_stages), ',', absl::SkipEmpty())) {
    int p = 0;
    if (!absl::SimpleAtoi(s, &p) || p < 2 || p > 10) {
      std::fprintf(stderr, "Error: bad --stages entry '%s' (2..10)\n", std::string(s).c_str());
      return 3;
    }
    for (int d : replicas) {
      if (4 * p % d != 0) {
        std::fprintf(stderr, "Error: %d replicas do not divide %d stages' %d micro-batches\n", d, p, 4 * p);
        return 3;
      }
    }
    for (const std::string& schedule : schedules) {
      // d = t = 1 first, for the ratios (measured even when not asked for a row of its own).
      const int steps = std::max(1, absl::GetFlag(FLAGS_steps));
      BenchReport single;
      const double d1 = Measure(p, 1, 1, schedule, threads, steps, 0, single);
      for (int d : replicas) {
        if (d == 1) {
          report.Add(single.rows()[0]);
        } else {
          Measure(p, d, 1, schedule, threads, steps, d1, report);
        }
      }
      for (int t : tensor_ranks) {
        if (t > 1) Measure(p, 1, t, schedule, threads, steps, d1, report);
      }
    }
  }
  BENCH_CHECK_OK(report.Publish(absl::GetFlag(FLAGS_json)));
  return 0;
}

}  // namespace
}  // namespace shardline::bench

int main(int argc, char** argv) {
  shardline::common::InitProcess(argc, argv, "pipeline-parallel training throughput on loopback");
  return shardline::bench::Main();
}
