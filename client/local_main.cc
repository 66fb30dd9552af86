// shardline-local SPEC [--workers=N] [--metrics_out=FILE] [--out=FILE] [--device=cpu]
//
// Runs a whole cluster on this machine: a coordinator and N workers as
// separate processes on loopback (free ports, a temporary state directory;
// N defaults to the spec's pipeline_stages × data_parallel), submits SPEC
// as N / data_parallel pipeline stages, shows the job's progress, writes the
// same metrics JSONL as shardline-train, exports the weights, evaluates them
// (shardline-train --eval_weights), and tears everything down, also on
// Ctrl-C or when a daemon dies. Exit codes: 0 the job succeeded, 1 it did
// not, 2 the cluster could not start, 3 invalid input, 130 interrupted.
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/admin_client.h"
#include "client/child_process.h"
#include "client/local_cluster.h"
#include "client/job_progress.h"
#include "common/file_util.h"
#include "common/init.h"
#include "common/input_limits.h"
#include "common/job_spec.h"
#include "common/metrics_log.h"
#include "common/validation_best.h"

ABSL_FLAG(int, workers, 0,
          "worker processes (0: pipeline_stages × data_parallel × tensor_parallel of the spec); the "
          "spec runs as workers / (data_parallel × tensor_parallel) pipeline stages");
ABSL_FLAG(std::string, metrics_out, "", "write JSON Lines metrics to this file");
ABSL_FLAG(std::string, out, "", "final weights (default: <name>.safetensors next to --metrics_out, or here)");
ABSL_FLAG(std::string, device, "cpu", "device for every worker (cpu, cuda:N, auto)");
ABSL_FLAG(int, threads_per_worker, 0, "compute threads per worker (0: the cores divided among them)");
ABSL_FLAG(int64_t, lease_ms, 2000, "worker lease: a dead worker fails the job after this long");
ABSL_FLAG(bool, keep_logs, false, "keep the daemons' logs and state directory");

namespace shardline::client {
namespace {

namespace fs = std::filesystem;
volatile sig_atomic_t interrupted = 0;
void OnSignal(int) { interrupted = 1; }

constexpr int kOk = 0, kFailed = 1, kNoCluster = 2, kInvalid = 3, kInterrupted = 130;

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "Error: %s\n", message.c_str());
  return code;
}

// The latest validation pass of a job whose data is `kind`, as
// shardline-train records its own.
common::EvalMetrics ValidationOf(const shardline::v1::JobStatus& s, const std::string& kind) {
  common::EvalMetrics m{s.val_step(), s.has_val_matches(), 0.0, s.val_loss(),
                        std::numeric_limits<double>::quiet_NaN(), s.val_windows(), 0.0};
  if (m.exact_match && s.val_windows() > 0) {
    m.accuracy = static_cast<double>(s.val_matches()) / static_cast<double>(s.val_windows());
  }
  if (kind == "text_bytes") m.bits_per_byte = s.val_loss() / std::log(2.0);
  return m;
}

// Whether the job ends after its validation pass of `s` (early stopping:
// its patience ran out there), as shardline-train stops.
bool StopsAfterPass(const shardline::v1::JobSpec& spec, const shardline::v1::JobStatus& s) {
  return common::StopsEarly(spec) && common::PatienceRunOut(spec.train().early_stopping(), common::BestOf(s));
}

std::string WeightsPath(const shardline::v1::JobSpec& spec) {
  if (!absl::GetFlag(FLAGS_out).empty()) return absl::GetFlag(FLAGS_out);
  const std::string file = spec.name() + ".safetensors";
  const std::string metrics = absl::GetFlag(FLAGS_metrics_out);
  return metrics.empty() ? file : (fs::path(metrics).parent_path() / file).string();
}

// The spec's data files made absolute, and the workers' --data_root their
// common directory: this user's files, and no others (a worker refuses a
// path outside its root, whoever submits to the local coordinator).
absl::Status ConfineData(shardline::v1::JobSpec& spec, LocalCluster& cluster) {
  shardline::v1::DataSpec& data = *spec.mutable_data();
  std::optional<fs::path> root;
  for (std::string* path : {data.mutable_path(), data.mutable_val_path()}) {
    if (path->empty()) continue;
    std::error_code error;
    const fs::path absolute = fs::weakly_canonical(fs::absolute(*path), error);
    if (error) return absl::InvalidArgumentError(absl::StrCat("cannot resolve ", common::Quote(*path)));
    *path = absolute.string();
    const fs::path dir = absolute.parent_path();
    if (!root) {
      root = dir;
      continue;
    }
    fs::path common;
    for (auto a = root->begin(), b = dir.begin(); a != root->end() && b != dir.end() && *a == *b; ++a, ++b) {
      common /= *a;
    }
    root = common;
  }
  if (root) cluster.set_worker_flags({"--data_root=" + root->string()});
  return absl::OkStatus();
}

int Run(const std::string& spec_path) {
  absl::StatusOr<shardline::v1::JobSpec> spec = common::LoadJobSpec(spec_path);
  if (!spec.ok()) return Fail(kInvalid, std::string(spec.status().message()));
  const int d = spec->parallel().data_parallel();
  const int t = spec->parallel().tensor_parallel();
  const int n = absl::GetFlag(FLAGS_workers) > 0 ? absl::GetFlag(FLAGS_workers)
                                                 : spec->parallel().pipeline_stages() * d * t;
  if (n % (d * t) != 0 || n / (d * t) < 1 || n / (d * t) > common::PipelineUnits(spec->model())) {
    return Fail(kInvalid, absl::StrCat("--workers must be a multiple of parallel.data_parallel × tensor_parallel (",
                                       d * t, ") with at most ", common::PipelineUnits(spec->model()),
                                       " pipeline stages per replica"));
  }
  const int stages = n / (d * t);
  if (spec->parallel().pipeline_stages() != stages) {
    std::printf("note: running %d pipeline stages%s (the spec says %d)\n", stages,
                d > 1 || t > 1 ? absl::StrCat(" in each of ", d, " replicas, each stage on ", t, " workers").c_str()
                               : ", one per worker",
                spec->parallel().pipeline_stages());
    spec->mutable_parallel()->set_pipeline_stages(stages);
  }
  auto log = common::MetricsLog::Open(absl::GetFlag(FLAGS_metrics_out));
  if (!log.ok()) return Fail(kInvalid, std::string(log.status().message()));
  int threads = absl::GetFlag(FLAGS_threads_per_worker);
  if (threads <= 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / n);

  ::signal(SIGINT, OnSignal);
  ::signal(SIGTERM, OnSignal);
  LocalCluster cluster;
  if (absl::GetFlag(FLAGS_keep_logs)) cluster.keep();
  if (absl::Status s = ConfineData(*spec, cluster); !s.ok()) return Fail(kInvalid, std::string(s.message()));
  std::printf("starting a coordinator and %d workers (%d threads each)...\n", n, threads);
  if (absl::Status s = cluster.Start(n, absl::GetFlag(FLAGS_device), threads, absl::GetFlag(FLAGS_lease_ms));
      !s.ok()) {
    cluster.keep();
    return Fail(kNoCluster, absl::StrCat(s.message(), "\n(logs in ", cluster.dir(), ")"));
  }
  AdminClient admin(cluster.address());
  absl::StatusOr<shardline::v1::JobStatus> submitted = admin.Submit(*spec);
  if (!submitted.ok()) return Fail(kInvalid, std::string(submitted.status().message()));
  const std::string job_id = submitted->job_id();
  std::printf("submitted %s ('%s'): %d steps on %d stages%s%s\n", job_id.c_str(), spec->name().c_str(),
              spec->train().steps(), stages,
              d > 1 ? absl::StrCat(" × ", d, " replicas",
                                   spec->parallel().shard_optimizer() ? " (optimizer state sharded: ZeRO-1)" : "")
                          .c_str()
                    : "",
              t > 1 ? absl::StrCat(" × ", t, " tensor ranks").c_str() : "");

  // Interrupts and dead daemons end the watch by ending the job.
  std::atomic<bool> watching{true};
  std::string problem;
  std::thread guard([&] {
    while (watching) {
      if (interrupted) {
        (void)admin.Cancel(job_id);
        return;
      }
      if (absl::Status s = cluster.CheckChildren(); !s.ok() && problem.empty()) {
        problem = std::string(s.message());
        if (absl::StrContains(problem, "coordinator")) return;  // the watch fails by itself
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  const bool tty = isatty(fileno(stdout));
  int64_t logged = 0, validated = 0, stopped_after = 0;
  shardline::v1::JobState shown = shardline::v1::JOB_STATE_UNSPECIFIED;
  absl::StatusOr<shardline::v1::JobStatus> last = admin.Watch(job_id, [&](const shardline::v1::JobStatus& s) {
    // Early stopping: the pass its patience ran out on is the run's last
    // (its step's record is logged; no later one is).
    if (stopped_after == 0 && StopsAfterPass(*spec, s)) stopped_after = s.val_step();
    if (stopped_after > 0 && s.step() > stopped_after) return;
    const bool due = s.step() > logged && (s.step() % spec->train().log_every() == 0 || s.step() == s.total_steps() ||
                                           s.step() == stopped_after);
    // On a terminal the line updates in place; in a log, one line per logged step.
    if (tty || due || s.state() != shown) {
      std::printf(tty ? "\r\033[K%s" : "%s\n", ProgressLine(s).c_str());
      std::fflush(stdout);
      shown = s.state();
    }
    // The cluster's validation passes during training, recorded as
    // shardline-train records its own, before the step's record (the last
    // step's is the final record, after the weights are written).
    if (s.val_step() > validated && s.val_step() < s.total_steps() && s.val_step() != stopped_after) {
      validated = s.val_step();
      const common::EvalMetrics eval = ValidationOf(s, spec->data().kind());
      (void)(*log)->Write(eval);
      const std::string line = absl::StrCat("step ", s.val_step(), ": ", common::EvalLine(eval));
      std::printf(tty ? "\r\033[K%s\n" : "%s\n", line.c_str());
    }
    if (due) {
      logged = s.step();
      (void)(*log)->Write(common::StepMetrics{s.step(), s.loss(), s.lr(), s.tokens_per_s(), s.grad_norm()});
    }
  });
  watching = false;
  guard.join();
  if (tty) std::printf("\n");
  if (interrupted) return Fail(kInterrupted, "interrupted; the job was cancelled");
  if (!last.ok()) {
    cluster.keep();
    return Fail(kFailed, absl::StrCat(last.status().message(), problem.empty() ? "" : "; " + problem,
                                      " (logs in ", cluster.dir(), ")"));
  }
  if (last->state() != shardline::v1::SUCCEEDED) {
    cluster.keep();
    return Fail(kFailed, absl::StrCat("job ", job_id, " ", JobState_Name(last->state()), ": ", last->message(),
                                      " (logs in ", cluster.dir(), ")"));
  }
  const std::string path = WeightsPath(*spec);
  absl::StatusOr<int64_t> weights = admin.ExportTo(job_id, path);
  if (!weights.ok()) return Fail(kFailed, std::string(weights.status().message()));
  std::printf("weights of %s written to %s\n", job_id.c_str(), path.c_str());
  if (last->val_step() == last->total_steps() || (stopped_after > 0 && last->val_step() == stopped_after)) {
    // The cluster validated the last step's weights where they trained
    // (train.eval_every): the same figures shardline-train --eval_weights
    // finds, without the whole model in one process.
    const common::EvalMetrics eval = ValidationOf(*last, spec->data().kind());
    if (absl::Status s = (*log)->Write(eval); !s.ok()) return Fail(kFailed, std::string(s.message()));
    std::printf("%s\n", common::EvalLine(eval).c_str());
    if (absl::GetFlag(FLAGS_keep_logs)) std::printf("logs kept in %s\n", cluster.dir().c_str());
    return kOk;
  }
  // Evaluate the exported weights with the reference code path.
  const std::string spec_file = cluster.dir() + "/spec.json";
  if (absl::Status s = common::WriteFileAtomically(spec_file, common::JobSpecToJson(*spec)); !s.ok()) {
    return Fail(kFailed, std::string(s.message()));
  }
  (*log).reset();  // flush before the evaluator appends
  const fs::path bin = fs::read_symlink("/proc/self/exe").parent_path();
  std::vector<std::string> eval = {(bin / "shardline-train").string(), spec_file, "--eval_weights=" + path,
                                   "--metrics_out=" + absl::GetFlag(FLAGS_metrics_out)};
  auto evaluator = ChildProcess::Start(eval, cluster.dir() + "/eval.log");
  if (!evaluator.ok()) return Fail(kFailed, std::string(evaluator.status().message()));
  std::string ended;
  while ((*evaluator)->Running(&ended) && !interrupted) absl::SleepFor(absl::Milliseconds(20));
  std::printf("%s", LogTail(cluster.dir() + "/eval.log").c_str());
  if (absl::GetFlag(FLAGS_keep_logs)) std::printf("logs kept in %s\n", cluster.dir().c_str());
  return ended == "exited with status 0" ? kOk : kFailed;
}

}  // namespace
}  // namespace shardline::client

int main(int argc, char** argv) {
  std::vector<std::string> args = shardline::common::InitProcess(
      argc, argv, "shardline-local SPEC --workers=N [--metrics_out=FILE] [--out=FILE]");
  if (args.size() != 2) {
    std::fprintf(stderr, "Error: expected exactly one job spec path (see --help)\n");
    return 3;
  }
  return shardline::client::Run(args[1]);
}
