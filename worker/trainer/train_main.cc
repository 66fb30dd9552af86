// shardline-train SPEC [--device=cpu|cuda:N] [--threads=N] [--metrics_out=FILE] [--out=FILE]
//                     [--init_weights=FILE]
//
// Trains the job spec in one process (the reference run), from the seed's
// weights or those of --init_weights, shows progress, writes JSONL metrics,
// evaluates on held-out data and saves the final weights as safetensors.
// Exit codes: 0 done, 1 training failed, 3 invalid input (spec, data,
// flags).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/init.h"
#include "common/input_limits.h"
#include "common/job_spec.h"
#include "common/metrics_log.h"
#include "common/model_layout.h"
#include "common/safetensors.h"
#include "common/safetensors_file.h"
#include "common/status_macros.h"
#include "common/validation_best.h"
#include "glog/logging.h"
#include "worker/backend/backend_factory.h"
#include "worker/trainer/trainer.h"

ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(int, threads, 0, "CPU compute threads (0 = all cores)");
ABSL_FLAG(std::string, metrics_out, "", "write JSON Lines metrics to this file");
ABSL_FLAG(std::string, eval_weights, "",
          "skip training: load these safetensors weights, evaluate, and append the evaluation "
          "record to --metrics_out");
ABSL_FLAG(std::string, init_weights, "",
          "start from these safetensors weights (every parameter of the model, nothing else; e.g. `shardctl "
          "export JOB`, what a spec's init.from_job starts from) instead of train.seed's; the optimizer starts "
          "fresh");
ABSL_FLAG(std::string, out, "",
          "final weights (safetensors); default: <name>.safetensors next to --metrics_out, or in "
          "the current directory");

namespace shardline::worker::trainer {
namespace {

constexpr int kExitFailed = 1;
constexpr int kExitInvalid = 3;

int Fail(int code, const absl::Status& status) {
  std::fprintf(stderr, "Error: %s\n", std::string(status.message()).c_str());
  return code;
}

std::string WeightsPath(const shardline::v1::JobSpec& spec) {
  if (!absl::GetFlag(FLAGS_out).empty()) return absl::GetFlag(FLAGS_out);
  const std::string file = absl::StrCat(spec.name(), ".safetensors");
  const std::string metrics = absl::GetFlag(FLAGS_metrics_out);
  if (metrics.empty()) return file;
  return (std::filesystem::path(metrics).parent_path() / file).string();
}

int EvaluateOnly(const shardline::v1::JobSpec& spec, const std::string& path, Trainer& trainer,
                 common::MetricsLog& log) {
  absl::StatusOr<common::SafetensorsContents> weights = common::ReadSafetensors(path);
  if (!weights.ok()) return Fail(kExitInvalid, weights.status());
  if (absl::Status s = trainer.runtime().ImportWeights(weights->tensors); !s.ok()) {
    return Fail(kExitInvalid, s);
  }
  absl::StatusOr<EvalResult> eval = trainer.Evaluate();
  if (!eval.ok()) return Fail(kExitFailed, eval.status());
  common::EvalMetrics em{spec.train().steps(), eval->exact_match, eval->accuracy, eval->val_loss,
                         eval->bits_per_byte, eval->examples, 0.0};
  if (absl::Status s = log.Write(em); !s.ok()) return Fail(kExitFailed, s);
  std::printf("%s\n", common::EvalLine(em).c_str());
  return 0;
}

// --init_weights into the trainer's model: every parameter with its shape
// and no tensor the model does not have, as the coordinator checks weights
// sent with a job.
absl::Status ImportInitWeights(const std::string& path, const shardline::v1::ModelSpec& model, Trainer& trainer) {
  {
    ASSIGN_OR_RETURN(std::unique_ptr<common::SafetensorsFile> file, common::SafetensorsFile::Open(path));
    RETURN_IF_ERROR(common::CheckWeightsFitModel(file->index(), model,
                                                 absl::StrCat("--init_weights: the weights in ", common::Quote(path))));
  }
  ASSIGN_OR_RETURN(common::SafetensorsContents weights, common::ReadSafetensors(path));
  if (absl::Status s = trainer.runtime().ImportWeights(weights.tensors); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--init_weights: ", common::Quote(path), ": ", s.message()));
  }
  const auto step = weights.metadata.find("step");
  std::printf("starting from the weights in %s%s\n", path.c_str(),
              step == weights.metadata.end() ? "" : absl::StrCat(" (step ", step->second, ")").c_str());
  return absl::OkStatus();
}

int Run(const std::string& spec_path) {
  absl::StatusOr<shardline::v1::JobSpec> spec = common::LoadJobSpec(spec_path);
  if (!spec.ok()) return Fail(kExitInvalid, spec.status());
  auto backend = CreateBackend(absl::GetFlag(FLAGS_device), {absl::GetFlag(FLAGS_threads)});
  if (!backend.ok()) return Fail(kExitInvalid, backend.status());
  auto trainer = Trainer::Create(*spec, **backend);
  if (!trainer.ok()) return Fail(kExitInvalid, trainer.status());
  const std::string eval_weights = absl::GetFlag(FLAGS_eval_weights);
  auto log = common::MetricsLog::Open(absl::GetFlag(FLAGS_metrics_out), !eval_weights.empty());
  if (!log.ok()) return Fail(kExitInvalid, log.status());
  if (!eval_weights.empty()) return EvaluateOnly(*spec, eval_weights, **trainer, **log);
  const std::string init_weights = absl::GetFlag(FLAGS_init_weights);
  if (init_weights.empty() && !spec->init().from_job().empty()) {
    return Fail(kExitInvalid, absl::InvalidArgumentError(absl::StrCat(
                                  "the spec starts from the weights of job ", spec->init().from_job(),
                                  " (init.from_job): give them with --init_weights=FILE (shardctl export ",
                                  spec->init().from_job(), " -o FILE)")));
  }
  if (!init_weights.empty()) {
    absl::Status imported = ImportInitWeights(init_weights, spec->model(), **trainer);
    if (!imported.ok()) return Fail(kExitInvalid, imported);
  }

  const auto& train = spec->train();
  const int replicas = spec->parallel().data_parallel();
  const std::string grouping =
      replicas > 1 ? absl::StrCat(replicas, " data-parallel replicas of ", train.micro_batches(), " micro-batches")
                   : absl::StrCat(train.micro_batches(), " micro-batches");
  std::printf("training '%s' on %s: %d layers, d_model %d, %d steps of %d sequences (%s)\n",
              spec->name().c_str(), (*backend)->description().c_str(), spec->model().n_layers(),
              spec->model().d_model(), train.steps(), train.global_batch(), grouping.c_str());
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto window_start = start;
  int64_t window_tokens = 0;
  // Early stopping (train.early_stopping): the best pass so far and its
  // weights, which the run ends with.
  const bool stops_early = common::StopsEarly(*spec);
  common::ValidationBest best;
  runtime::ShardRuntime::HostTensors best_weights;
  auto note_pass = [&](int64_t step, const EvalResult& pass) -> absl::Status {
    common::ValidationPass measured{pass.val_loss, std::nullopt};
    if (pass.exact_match) measured.accuracy = pass.accuracy;
    if (!stops_early || !common::NoteValidationPass(train.early_stopping(), step, measured, best)) {
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(best_weights, (*trainer)->runtime().ExportWeights());
    return absl::OkStatus();
  };
  int64_t last_step = train.steps();
  std::optional<EvalResult> eval;  // after last_step
  for (int64_t step = 1; step <= train.steps() && !eval.has_value(); ++step) {
    absl::StatusOr<StepResult> result = (*trainer)->TrainStep(step);
    if (!result.ok()) return Fail(kExitFailed, result.status());
    window_tokens += result->tokens;
    // Validation during training (train.eval_every), as a cluster's
    // positions evaluate; its time is not the window's.
    if (common::EvaluatesAfter(*spec, step) && step < train.steps()) {
      const auto eval_start = Clock::now();
      absl::StatusOr<EvalResult> pass = (*trainer)->Evaluate();
      if (!pass.ok()) return Fail(kExitFailed, pass.status());
      if (absl::Status s = note_pass(step, *pass); !s.ok()) return Fail(kExitFailed, s);
      if (common::PatienceRunOut(train.early_stopping(), best)) {
        last_step = step;
        eval = *std::move(pass);  // the run's last pass, recorded as such below
      } else {
        common::EvalMetrics em{step, pass->exact_match, pass->accuracy, pass->val_loss, pass->bits_per_byte,
                               pass->examples, 0.0};
        if (absl::Status s = (*log)->Write(em); !s.ok()) return Fail(kExitFailed, s);
        std::printf("step %lld: %s\n", static_cast<long long>(step), common::EvalLine(em).c_str());
      }
      window_start += Clock::now() - eval_start;
    }
    if (step % train.log_every() != 0 && step != last_step) continue;
    const auto now = Clock::now();
    const double window = std::chrono::duration<double>(now - window_start).count();
    const double elapsed = std::chrono::duration<double>(now - start).count();
    common::StepMetrics m{step, result->loss, result->lr,
                          window > 0 ? window_tokens / window : 0.0, result->grad_norm};
    const double eta = elapsed / static_cast<double>(step) * static_cast<double>(last_step - step);
    std::printf("%s\n", common::ProgressLine(m, last_step, eta).c_str());
    std::fflush(stdout);
    if (absl::Status s = (*log)->Write(m); !s.ok()) return Fail(kExitFailed, s);
    window_start = now;
    window_tokens = 0;
  }
  const double train_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (last_step < train.steps()) {
    std::printf("%s\n", common::EarlyStopMessage(train.early_stopping(), last_step, best).c_str());
  }

  if (!eval.has_value()) {
    absl::StatusOr<EvalResult> pass = (*trainer)->Evaluate();
    if (!pass.ok()) return Fail(kExitFailed, pass.status());
    eval = *std::move(pass);
    if (common::EvaluatesAfter(*spec, last_step)) {
      if (absl::Status s = note_pass(last_step, *eval); !s.ok()) return Fail(kExitFailed, s);
    }
  }
  common::EvalMetrics em{last_step, eval->exact_match, eval->accuracy, eval->val_loss,
                         eval->bits_per_byte, eval->examples, train_seconds};
  if (absl::Status s = (*log)->Write(em); !s.ok()) return Fail(kExitFailed, s);
  std::printf("%s\n", common::EvalLine(em).c_str());

  // The weights the run ends with: its best pass's with early stopping.
  const bool ends_at_best = stops_early && best.step != last_step;
  absl::StatusOr<runtime::ShardRuntime::HostTensors> weights =
      ends_at_best ? std::move(best_weights) : (*trainer)->runtime().ExportWeights();
  if (!weights.ok()) return Fail(kExitFailed, weights.status());
  common::SafetensorsContents contents;
  contents.tensors = std::move(*weights);
  contents.metadata = {{"format", "pt"},
                       {"producer", "shardline-train"},
                       {"spec", common::JobSpecToJson(*spec)},
                       {"step", std::to_string(ends_at_best ? best.step : last_step)}};
  if (ends_at_best && last_step == train.steps()) {  // (a stop says so itself)
    std::printf("the weights are step %lld's, the best validation pass (%s)\n", static_cast<long long>(best.step),
                common::PassMeasures(best.pass).c_str());
  }
  const std::string path = WeightsPath(*spec);
  if (absl::Status s = common::WriteSafetensors(path, contents); !s.ok()) return Fail(kExitFailed, s);
  std::printf("trained in %.1f s; weights written to %s\n", train_seconds, path.c_str());
  return 0;
}

}  // namespace
}  // namespace shardline::worker::trainer

int main(int argc, char** argv) {
  std::vector<std::string> args = shardline::common::InitProcess(
      argc, argv,
      "shardline-train SPEC [--device=cpu|cuda:N] [--threads=N] [--metrics_out=FILE] [--out=FILE] "
      "[--init_weights=FILE]");
  if (args.size() != 2) {
    std::fprintf(stderr, "Error: expected exactly one job spec path (see --help)\n");
    return 3;
  }
  return shardline::worker::trainer::Run(args[1]);
}
