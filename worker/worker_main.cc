// shardline-worker --coordinator=HOST:PORT --name=NAME [--listen=HOST:PORT]
//                  [--device=auto|cpu|cuda:N] [--threads=N] [--port_file=FILE]
//
// Joins the coordinator and runs the pipeline stages it assigns. Under
// systemd (Type=notify) it says READY=1 once registered, WATCHDOG=1 while its
// main loop turns and STOPPING=1 on SIGTERM or SIGINT, then leaves the
// coordinator (its job fails over at once), stops its stage and exits 0.
#include <sys/stat.h>

#include <grpcpp/ext/proto_server_reflection_plugin.h>

#include <csignal>
#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/init.h"
#include "common/metrics_http_server.h"
#include "common/revocation_gauge.h"
#include "common/service_notifier.h"
#include "common/transport_security.h"
#include "glog/logging.h"
#include "worker/backend/backend_factory.h"
#include "worker/worker_server.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7400", "the coordinator's address");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "address of this worker's StageLink service");
ABSL_FLAG(std::string, advertise_host, "", "host neighbours should dial (default: the listen host)");
ABSL_FLAG(std::string, device, "auto", "auto (cuda:0 when present, else cpu), cpu or cuda:N");
ABSL_FLAG(std::string, name, "", "unique worker name (required)");
ABSL_FLAG(int, threads, 0, "CPU compute threads (0 = all cores)");
ABSL_FLAG(std::string, data_root, ".",
          "jobs' data files (data.path) must lie under this directory; a relative data.path is taken from "
          "here (default: the directory the worker starts in)");
ABSL_FLAG(int64_t, link_timeout_ms, 60000, "a neighbour silent this long fails the step");
ABSL_FLAG(int64_t, link_chunk_kib, 1024, "payload KiB per stage-link frame (4 to 16384)");
ABSL_FLAG(int32_t, link_window_frames, 16, "frames a neighbour may send ahead of this stage (1 to 4096)");
ABSL_FLAG(int64_t, link_staging_mib, 512,
          "host memory for one stage's link staging slots (pinned on CUDA); 0: none");
ABSL_FLAG(std::string, port_file, "", "write the StageLink port here once registered");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any free port); empty: none");
ABSL_FLAG(std::string, metrics_port_file, "", "write the metrics port here once serving");
ABSL_FLAG(double, gemm_flops, 0,
          "f32 GEMM FLOP/s to report to the planner instead of measuring at start-up (0: measure); "
          "for alike machines whose measurements differ by noise");
ABSL_FLAG(bool, test_only_scramble_reports, false,
          "test hook: send each step report after the next one and again, each shard twice");

namespace {

volatile std::sig_atomic_t stop_requested = 0;
void OnSignal(int) { stop_requested = 1; }

}  // namespace

int main(int argc, char** argv) {
  shardline::common::InitProcess(argc, argv,
                                 "shardline-worker --coordinator=HOST:PORT --name=NAME [--device=...]");
  shardline::worker::WorkerOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.listen = absl::GetFlag(FLAGS_listen);
  options.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  options.device = absl::GetFlag(FLAGS_device);
  if (options.device == "auto") {
    options.device = shardline::worker::CudaDeviceCount() > 0 ? "cuda:0" : "cpu";
  }
  options.name = absl::GetFlag(FLAGS_name);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.data_root = absl::GetFlag(FLAGS_data_root);
  if (struct stat st; options.data_root.empty() || ::stat(options.data_root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::fprintf(stderr, "Error: --data_root '%s' is not a directory\n", options.data_root.c_str());
    return 3;
  }
  options.link.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_link_timeout_ms));
  const int64_t chunk_kib = absl::GetFlag(FLAGS_link_chunk_kib);
  const int32_t window = absl::GetFlag(FLAGS_link_window_frames);
  if (chunk_kib < 4 || chunk_kib > 16384 || window < 1 || window > 4096) {
    std::fprintf(stderr, "Error: --link_chunk_kib must be within [4, 16384] and --link_window_frames within [1, 4096]\n");
    return 3;
  }
  options.link.chunk_bytes = static_cast<size_t>(chunk_kib) << 10;
  options.link.window_frames = static_cast<uint32_t>(window);
  const int64_t staging_mib = absl::GetFlag(FLAGS_link_staging_mib);
  if (staging_mib < 0 || staging_mib > (int64_t{1} << 20)) {
    std::fprintf(stderr, "Error: --link_staging_mib must be within [0, 1048576]\n");
    return 3;
  }
  options.link_staging_bytes = static_cast<size_t>(staging_mib) << 20;
  options.scramble_reports = absl::GetFlag(FLAGS_test_only_scramble_reports);
  options.gemm_flops = absl::GetFlag(FLAGS_gemm_flops);
  if (options.gemm_flops < 0) {
    std::fprintf(stderr, "Error: --gemm_flops must be 0 (measure) or positive\n");
    return 3;
  }
  absl::StatusOr<std::shared_ptr<shardline::common::TransportSecurity>> security =
      shardline::common::TransportSecurity::FromFlags();
  if (security.ok()) {
    if (absl::Status s = (*security)->CheckListenAddress(options.listen); !s.ok()) security = s;
  }
  if (!security.ok()) {
    std::fprintf(stderr, "Error: %s\n", std::string(security.status().message()).c_str());
    return 3;
  }
  options.security = *security;
  // The metrics endpoint first: a bad --metrics_listen fails before the
  // worker registers.
  shardline::common::MetricsRegistry metrics;
  options.metrics = &metrics;
  shardline::common::AddRevocationGauge(metrics, *security);
  auto metrics_server = shardline::common::MetricsHttpServer::StartIfAsked(
      absl::GetFlag(FLAGS_metrics_listen), absl::GetFlag(FLAGS_metrics_port_file), metrics);
  if (!metrics_server.ok()) {
    std::fprintf(stderr, "Error: %s\n", std::string(metrics_server.status().message()).c_str());
    return absl::IsInvalidArgument(metrics_server.status()) ? 3 : 2;
  }
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto worker = shardline::worker::WorkerServer::Start(options);
  if (!worker.ok()) {
    std::fprintf(stderr, "Error: %s\n", std::string(worker.status().message()).c_str());
    return absl::IsInvalidArgument(worker.status()) ? 3 : 2;
  }
  LOG(INFO) << "channels: " << (*security)->Describe();
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    (void)shardline::common::WriteFileAtomically(absl::GetFlag(FLAGS_port_file),
                                                 absl::StrCat((*worker)->port(), "\n"));
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  shardline::common::ServiceNotifier notifier;
  notifier.Ready(absl::StrCat("worker ", options.name, " registered as ", (*worker)->worker_id(),
                              ", StageLink on port ", (*worker)->port()));
  std::thread waiter([&] { (*worker)->Wait(); stop_requested = 1; });
  while (!stop_requested) {
    notifier.MainLoopAlive();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  notifier.Stopping("leaving the coordinator and stopping its job");
  LOG(INFO) << "shutting down";
  (*worker)->Stop();
  waiter.join();
  // No scrape after this: they read the worker's link, and it goes first.
  metrics_server->reset();
  return 0;
}
