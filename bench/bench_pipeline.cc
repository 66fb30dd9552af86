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
//   bench_pipeline [--stages=2,4] [--steps=N] [--threads=N] [--device=cpu|cuda:N] [--json=FILE]
#include <grpcpp/grpcpp.h>

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
#include "common/init.h"
#include "common/job_spec.h"
#include "worker/backend/backend_factory.h"
#include "worker/runtime/pipeline_stage.h"
#include "worker/runtime/stage_sender.h"
#include "worker/trainer/trainer.h"
#include "worker/transport/grpc_stage_link.h"
#include "worker/transport/stage_link_service.h"
#include "worker/transport/staging_pool.h"

ABSL_FLAG(std::string, stages, "2,4", "pipeline depths to measure");
ABSL_FLAG(int, steps, 6, "timed steps per configuration (after one warm-up step)");
ABSL_FLAG(int, threads, 0, "total compute threads (0: all cores), divided among the stages");
ABSL_FLAG(std::string, json, "", "write the rows as JSON to this file");
ABSL_FLAG(std::string, device, "cpu", "where the stages and the trainer run: cpu or cuda:N");

namespace shardline::bench {
namespace {

using worker::runtime::StageStepResult;

// The "default larger model" of the issues: d_model 512, 8 layers, context 128.
shardline::v1::JobSpec Spec(int stages) {
  auto spec = common::ParseJobSpec(R"({"name": "bench",
    "model": {"kind": "gpt", "vocab_size": 256, "context": 128, "d_model": 512, "n_heads": 8, "n_layers": 8},
    "data": {"kind": "text_bytes", "path": "/usr/share/common-licenses/GPL-3"},
    "train": {"steps": 1000, "global_batch": 16, "micro_batches": 8, "seed": 1,
              "optimizer": {"kind": "adamw", "lr": 0.0003}}})");
  BENCH_CHECK_OK(spec.status());
  spec->mutable_parallel()->set_pipeline_stages(stages);
  spec->mutable_train()->set_micro_batches(4 * stages);
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

void Measure(int p, int total_threads, int steps, BenchReport& report) {
  const shardline::v1::JobSpec spec = Spec(p);
  const auto config = worker::nn::ModelConfig::FromSpec(spec.model());
  const auto optimizer = worker::nn::OptimizerConfig::FromSpec(spec.train());
  auto data = worker::data::CreateDataSource(spec);
  BENCH_CHECK_OK(data.status());
  const std::vector<int> cuts = Cuts(config.units(), p);
  // OpenBLAS' thread count is process-wide: the stages share one budget.
  std::vector<std::unique_ptr<worker::transport::StageLinkService>> services;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  std::vector<std::string> addresses;
  for (int s = 0; s < p; ++s) {
    services.push_back(std::make_unique<worker::transport::StageLinkService>());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddChannelArgument("grpc.so_reuseport", 0);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    services.back()->RegisterWith(builder);
    servers.push_back(builder.BuildAndStart());
    addresses.push_back(absl::StrCat("127.0.0.1:", port));
  }
  const int stage_threads = std::max(1, total_threads / p);
  std::vector<std::unique_ptr<worker::Backend>> backends;
  std::vector<std::unique_ptr<worker::runtime::ShardRuntime>> runtimes;
  std::vector<std::unique_ptr<worker::transport::GrpcStageLink>> links;
  std::vector<std::unique_ptr<worker::runtime::PipelineStage>> stages;
  for (int s = 0; s < p; ++s) {
    auto backend = worker::CreateBackend(absl::GetFlag(FLAGS_device), {stage_threads});
    BENCH_CHECK_OK(backend.status());
    backends.push_back(std::move(*backend));
    auto runtime = worker::runtime::ShardRuntime::Create(*backends[s], config, cuts[s], cuts[s + 1],
                                                         spec.train().seed(), optimizer);
    BENCH_CHECK_OK(runtime.status());
    runtimes.push_back(std::move(*runtime));
    worker::transport::GrpcStageLinkOptions options;
    options.job_id = "bench";
    options.plan_epoch = 1;
    options.stage = s;
    options.stages = p;
    options.service = services[s].get();
    if (s > 0) options.upstream_address = addresses[s - 1];
    options.staging_slot_bytes = worker::runtime::LargestLinkTensorBytes(spec);
    options.staging_memory = worker::transport::HostStagingMemory(*backends[s]);  // as a worker's
    if (backends[s]->host_staging_pinned()) {
      options.extra_send_slots = worker::runtime::StageSender::kDefaultMaxQueued;
    }
    auto link = worker::transport::GrpcStageLink::Create(options);
    BENCH_CHECK_OK(link.status());
    links.push_back(std::move(*link));
    auto stage = worker::runtime::PipelineStage::Create(
        *runtimes[s], data->get(), *links[s],
        {worker::runtime::ScheduleKind::kOneFOneB, p, s, spec.train().micro_batches(), spec.train().global_batch()});
    BENCH_CHECK_OK(stage.status());
    stages.push_back(std::move(*stage));
  }
  auto run_step = [&](int64_t step) {
    std::vector<absl::StatusOr<StageStepResult>> results(p, absl::UnknownError(""));
    std::vector<std::thread> threads;
    for (int s = 0; s < p; ++s) threads.emplace_back([&, s] { results[s] = stages[s]->RunStep(step); });
    for (auto& t : threads) t.join();
    std::vector<StageStepResult> out;
    for (auto& r : results) {
      BENCH_CHECK_OK(r.status());
      out.push_back(*r);
    }
    return out;
  };
  run_step(1);  // warm-up: allocations, connections
  double wall = 0, busy = 0, busiest = 0, exposed = 0;
  int64_t tokens = 0;
  size_t peak = 0;
  std::vector<double> losses;
  for (int step = 2; step < 2 + steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<StageStepResult> r = run_step(step);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    wall += seconds;
    tokens += r[0].tokens;
    losses.push_back(r.back().loss);
    double most = 0;
    for (const auto& s : r) {
      busy += s.busy_seconds;
      most = std::max(most, s.busy_seconds);
      peak = std::max(peak, s.peak_slots);
    }
    busiest += most;
    exposed += seconds - most;
  }
  uint64_t link_peak = 0;
  int staging_peak = 0;
  for (const auto& link : links) {
    link_peak = std::max(link_peak, link->PeakHeldBytes());
    staging_peak = std::max(staging_peak, link->PeakStagingSlots());
  }
  links.clear();
  for (auto& server : servers) server->Shutdown();
  const int m = spec.train().micro_batches();
  const double efficiency = busy / (p * wall);
  const double bound = 1.0 - static_cast<double>(p - 1) / (m + p - 1);
  const Reference reference = RunReference(spec, total_threads, steps);
  double loss_gap = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    loss_gap = std::max(loss_gap, std::fabs(losses[i] - reference.losses[i]) / std::fabs(reference.losses[i]));
  }
  const double reference_tokens_per_s = reference.tokens / reference.seconds;
  report.Add({{"stages", static_cast<double>(p)},
              {"micro_batches", static_cast<double>(m)},
              {"threads_per_stage", static_cast<double>(stage_threads)},
              {"tokens_per_s", tokens / wall},
              {"efficiency", efficiency},
              {"analytic_bound", bound},
              {"efficiency_vs_bound", efficiency / bound},
              {"exposed_comm_ms", exposed / steps * 1e3},
              {"step_ms", wall / steps * 1e3},
              {"peak_slots", static_cast<double>(peak)},
              {"link_peak_mib", static_cast<double>(link_peak) / (1 << 20)},
              {"staging_slots_peak", static_cast<double>(staging_peak)},
              {"peak_rss_mib", PeakRssMiB()},
              {"reference_tokens_per_s", reference_tokens_per_s},
              {"vs_reference", tokens / wall / reference_tokens_per_s},
              {"max_loss_gap", loss_gap},
              // The raw timings the figures above come from.
              {"timed_steps", static_cast<double>(steps)},
              {"tokens", static_cast<double>(tokens)},
              {"wall_s", wall},
              {"busy_s", busy},
              {"busiest_s", busiest},
              {"reference_tokens", static_cast<double>(reference.tokens)},
              {"reference_wall_s", reference.seconds}});
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
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_stages), ',', absl::SkipEmpty())) {
    int p = 0;
    if (!absl::SimpleAtoi(s, &p) || p < 2 || p > 10) {
      std::fprintf(stderr, "Error: bad --stages entry '%s' (2..10)\n", std::string(s).c_str());
      return 3;
    }
    Measure(p, threads, std::max(1, absl::GetFlag(FLAGS_steps)), report);
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
