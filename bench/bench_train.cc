// bench_train: training throughput (tokens/s) of the reference trainer, the
// code path shardline-train runs, on the default addition spec and on a
// larger model (d_model 512, 8 layers, context 128, byte-level text); and
// a validation pass of each (Trainer::Evaluate, forward only, the pass a
// cluster runs with train.eval_every): its windows per second against
// training's sequences per second, in the same run.
//
//   bench_train [--device=cpu] [--threads=N] [--steps=N] [--only=addition|large] [--json=FILE]
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_report.h"
#include "common/init.h"
#include "common/job_spec.h"
#include "worker/backend/backend_factory.h"
#include "worker/trainer/trainer.h"

ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(int, threads, 0, "CPU compute threads (0 = all cores)");
ABSL_FLAG(int, steps, 0, "timed steps per model (0 = a default per model)");
ABSL_FLAG(std::string, only, "", "run one model: addition or large");
ABSL_FLAG(std::string, json, "", "write the rows as JSON to this file");
ABSL_FLAG(std::string, text, "/usr/share/common-licenses/GPL-3", "text file for the large model");

namespace shardline::bench {
namespace {

struct Case {
  std::string name;
  std::string spec;
  int steps;
};

std::vector<Case> Cases() {
  return {
      {"addition",
       R"({"name": "addition",
           "model": {"kind": "gpt", "vocab_size": 16, "context": 16, "d_model": 128, "n_heads": 4, "n_layers": 4},
           "data": {"kind": "addition", "digits": 2},
           "train": {"steps": 1000, "global_batch": 64, "micro_batches": 8, "seed": 1, "eval_examples": 1000,
                     "optimizer": {"kind": "adamw", "lr": 0.001, "warmup_steps": 100}}})",
       60},
      {"large",
       absl::StrCat(R"({"name": "large",
           "model": {"kind": "gpt", "vocab_size": 256, "context": 128, "d_model": 512, "n_heads": 8, "n_layers": 8},
           "data": {"kind": "text_bytes", "path": ")",
                    absl::GetFlag(FLAGS_text), R"("},
           "train": {"steps": 1000, "global_batch": 16, "micro_batches": 4, "seed": 1, "eval_examples": 64,
                     "optimizer": {"kind": "adamw", "lr": 0.0003, "warmup_steps": 10}}})"),
       4},
  };
}

int Main() {
  auto backend = worker::CreateBackend(absl::GetFlag(FLAGS_device), {absl::GetFlag(FLAGS_threads)});
  if (!backend.ok()) {
    std::fprintf(stderr, "Error: %s\n", backend.status().ToString().c_str());
    return 2;
  }
  std::printf("# %s\n", (*backend)->description().c_str());
  BenchReport report;
  for (const Case& c : Cases()) {
    if (!absl::GetFlag(FLAGS_only).empty() && absl::GetFlag(FLAGS_only) != c.name) continue;
    auto spec = common::ParseJobSpec(c.spec);
    BENCH_CHECK_OK(spec.status());
    auto trainer = worker::trainer::Trainer::Create(*spec, **backend);
    BENCH_CHECK_OK(trainer.status());
    BENCH_CHECK_OK((*trainer)->TrainStep(1).status());  // warm-up: allocations, caches
    const int steps = absl::GetFlag(FLAGS_steps) > 0 ? absl::GetFlag(FLAGS_steps) : c.steps;
    int64_t tokens = 0;
    double loss = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int step = 2; step < 2 + steps; ++step) {
      auto result = (*trainer)->TrainStep(step);
      BENCH_CHECK_OK(result.status());
      tokens += result->tokens;
      loss = result->loss;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    BENCH_CHECK_OK((*trainer)->Evaluate().status());  // warm-up: the held-out set, its batch shapes
    const auto eval_start = std::chrono::steady_clock::now();
    auto eval = (*trainer)->Evaluate();
    BENCH_CHECK_OK(eval.status());
    const double eval_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - eval_start).count();
    const double sequences_per_s = static_cast<double>(spec->train().global_batch()) * steps / seconds;
    int64_t params = 0;
    for (auto* p : (*trainer)->runtime().parameters()) params += static_cast<int64_t>(p->count());
    report.Add({{"model", c.name},
                {"device", (*backend)->name()},
                {"params", static_cast<double>(params)},
                {"steps", static_cast<double>(steps)},
                {"tokens_per_step", static_cast<double>(tokens / steps)},
                {"step_ms", seconds / steps * 1e3},
                {"tokens_per_s", tokens / seconds},
                // 6 FLOPs per parameter per token (forward + backward), attention excluded.
                {"model_gflops", 6.0 * params * tokens / seconds / 1e9},
                {"last_loss", loss},
                {"eval_windows", static_cast<double>(eval->examples)},
                {"eval_ms", eval_seconds * 1e3},
                {"eval_windows_per_s", eval->examples / eval_seconds},
                // A window forward only against a sequence forward and backward
                // (and the optimizer step's share): about 3 where compute-bound.
                {"eval_vs_train", eval->examples / eval_seconds / sequences_per_s}});
  }
  BENCH_CHECK_OK(report.Publish(absl::GetFlag(FLAGS_json)));
  return 0;
}

}  // namespace
}  // namespace shardline::bench

int main(int argc, char** argv) {
  shardline::common::InitProcess(argc, argv, "training throughput of the reference trainer");
  return shardline::bench::Main();
}
