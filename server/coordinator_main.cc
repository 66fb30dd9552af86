// shardline-coordinator --listen=HOST:PORT --state_dir=DIR [--lease_ms=N] [--port_file=FILE]
//
// Registers workers, plans and runs jobs, keeps the committed weights. Under
// systemd (Type=notify) it says READY=1 once serving, WATCHDOG=1 while its
// main loop turns and STOPPING=1 on SIGTERM or SIGINT; its health service
// then says NOT_SERVING and it stops within a few seconds, exit 0.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/file_util.h"
#include "common/init.h"
#include "common/metrics_http_server.h"
#include "common/service_notifier.h"
#include "common/revocation_gauge.h"
#include "common/transport_security.h"
#include "glog/logging.h"
#include "server/admin_service.h"
#include "server/coordinator_metrics.h"
#include "server/coordinator_service.h"
#include "server/coordinator_store.h"
#include "server/job_manager.h"
#include "server/link_table.h"
#include "server/weight_store.h"
#include "server/worker_registry.h"

ABSL_FLAG(std::string, admin_tokens, "",
          "file of bearer tokens for the Admin service, one `ROLE NAME TOKEN` a line (ROLE: admin or viewer); "
          "re-read when it changes. Required to listen beyond loopback, unless --insecure");
ABSL_FLAG(std::string, listen, "127.0.0.1:7400", "address to serve on (port 0: any free port)");
ABSL_FLAG(std::string, state_dir, "", "directory for the coordinator's state: jobs, ids and committed weights (required)");
ABSL_FLAG(int64_t, lease_ms, 3000, "a worker silent for this long is lost");
ABSL_FLAG(bool, replan_on_slowdown, true,
          "move a job whose steps slow down for long to a clearly faster layout, at a step boundary "
          "(docs/operations.md, Re-planning during a job); shardctl replan works either way");
ABSL_FLAG(bool, grow_back, true,
          "move a job re-planned onto fewer pipeline stages after a loss back onto its spec's stages, at a "
          "step boundary, once enough workers are idle (docs/operations.md, What survives what)");
ABSL_FLAG(int32_t, concurrent_probes, shardline::server::LinkTable::kDefaultConcurrentProbes,
          "at most this many link probes at once (1 to 1024; 1: one at a time). Probes never share a host, "
          "and only those inside a measured link group run beside another (docs/operations.md, Measured links)");
ABSL_FLAG(absl::Duration, delete_ended_jobs_after, absl::InfiniteDuration(),
          "delete a job this long after it ended (e.g. 168h): its record, checkpoint, trace and metrics, as "
          "shardctl delete does; inf: keep ended jobs until an operator deletes them");
ABSL_FLAG(bool, tls_worker_names, true,
          "under mutual TLS, a worker registers only under a name its client certificate holds (its common name or "
          "a subject alternative name), or such a name followed by -SUFFIX (HOST-0, HOST-1 under HOST's "
          "certificate); false where workers share one certificate (Compose, Kubernetes) and so may take each "
          "other's names (docs/operations.md, Worker names and certificates)");
ABSL_FLAG(std::string, port_file, "", "write the bound port here once serving (for launchers)");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any free port); empty: none");
ABSL_FLAG(std::string, metrics_port_file, "", "write the metrics port here once serving");

namespace {

volatile std::sig_atomic_t stop_requested = 0;
void OnSignal(int) { stop_requested = 1; }

int Run() {
  using namespace shardline::server;
  if (absl::GetFlag(FLAGS_state_dir).empty()) {
    std::fprintf(stderr, "Error: --state_dir is required\n");
    return 3;
  }
  if (absl::GetFlag(FLAGS_delete_ended_jobs_after) < absl::ZeroDuration()) {
    std::fprintf(stderr, "Error: --delete_ended_jobs_after must not be negative\n");
    return 3;
  }
  if (const int32_t n = absl::GetFlag(FLAGS_concurrent_probes);
      n < 1 || n > shardline::server::LinkTable::kMaxConcurrentProbes) {
    std::fprintf(stderr, "Error: --concurrent_probes must be from 1 to %d, not %d\n",
                 shardline::server::LinkTable::kMaxConcurrentProbes, n);
    return 3;
  }
  if (absl::GetFlag(FLAGS_lease_ms) < 100) {
    std::fprintf(stderr, "Error: --lease_ms must be at least 100\n");
    return 3;
  }
  absl::StatusOr<std::shared_ptr<shardline::common::TransportSecurity>> security =
      shardline::common::TransportSecurity::FromFlags();
  if (security.ok()) {
    if (absl::Status s = (*security)->CheckListenAddress(absl::GetFlag(FLAGS_listen)); !s.ok()) security = s;
  }
  if (!security.ok()) {
    std::fprintf(stderr, "Error: %s\n", std::string(security.status().message()).c_str());
    return 3;
  }
  LOG(INFO) << "channels: " << (*security)->Describe();
  std::unique_ptr<AdminTokens> tokens;
  if (!absl::GetFlag(FLAGS_admin_tokens).empty()) {
    absl::StatusOr<std::unique_ptr<AdminTokens>> loaded = AdminTokens::Load(absl::GetFlag(FLAGS_admin_tokens));
    if (!loaded.ok()) {
      std::fprintf(stderr, "Error: %s\n", std::string(loaded.status().message()).c_str());
      return 3;
    }
    tokens = *std::move(loaded);
  } else if (!(*security)->insecure() &&
             !shardline::common::TransportSecurity::IsLoopback(absl::GetFlag(FLAGS_listen))) {
    std::fprintf(stderr,
                 "Error: refusing to serve the Admin service beyond loopback without --admin_tokens "
                 "(or --insecure for a network you trust)\n");
    return 3;
  }
  LOG(INFO) << "admin service: "
            << (tokens != nullptr ? "bearer tokens of " + absl::GetFlag(FLAGS_admin_tokens) : "open (no --admin_tokens)");
  const std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  auto weights = WeightStore::Open(state_dir);
  if (!weights.ok()) {
    std::fprintf(stderr, "Error: %s\n", std::string(weights.status().message()).c_str());
    return 3;
  }
  auto store = CoordinatorStore::Open(state_dir + "/coordinator.db");
  if (!store.ok()) {
    std::fprintf(stderr, "Error: %s\n", std::string(store.status().message()).c_str());
    return 3;
  }
  const absl::Duration lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  // Worker ids carry this incarnation and a random part.
  const std::string tag = absl::StrFormat("i%d-%06x", (*store)->incarnation(), absl::Uniform<uint32_t>(absl::BitGen(), 0, 1 << 24));
  WorkerRegistry registry(lease, [] { return absl::Now(); }, tag);
  CoordinatorService coordinator(registry);
  const bool bind_names = (*security)->tls() && absl::GetFlag(FLAGS_tls_worker_names);
  coordinator.set_bind_worker_names(bind_names);
  if ((*security)->tls()) {
    LOG(INFO) << "worker names: "
              << (bind_names ? "bound to their certificates (--tls_worker_names)"
                             : "any certificate of the CA may register any name (--tls_worker_names=false)");
  }
  JobManager jobs(registry, **weights, **store, [&](const std::string& worker, shardline::v1::Assignment a) {
    coordinator.Deliver(worker, std::move(a));
  });
  coordinator.set_jobs(&jobs);
  jobs.SetAutoReplan(absl::GetFlag(FLAGS_replan_on_slowdown));
  jobs.SetGrowBack(absl::GetFlag(FLAGS_grow_back));
  jobs.links().SetConcurrentProbes(absl::GetFlag(FLAGS_concurrent_probes));
  jobs.SetEndedJobLifetime(absl::GetFlag(FLAGS_delete_ended_jobs_after));
  if (absl::Status s = jobs.Recover(); !s.ok()) {
    std::fprintf(stderr, "Error: %s\n", std::string(s.message()).c_str());
    return 3;
  }
  AdminService admin(jobs, registry, **weights, tokens.get());
  shardline::common::MetricsRegistry metrics_registry;
  CoordinatorMetrics metrics(metrics_registry, registry, jobs);
  shardline::common::AddRevocationGauge(metrics_registry, *security);
  auto metrics_server = shardline::common::MetricsHttpServer::StartIfAsked(
      absl::GetFlag(FLAGS_metrics_listen), absl::GetFlag(FLAGS_metrics_port_file), metrics_registry);
  if (!metrics_server.ok()) {
    std::fprintf(stderr, "Error: %s\n", std::string(metrics_server.status().message()).c_str());
    return absl::IsInvalidArgument(metrics_server.status()) ? 3 : 2;
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddChannelArgument("grpc.so_reuseport", 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), (*security)->ServerCredentials(), &port);
  builder.RegisterService(&coordinator);
  builder.RegisterService(&admin);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "Error: cannot listen on %s\n", absl::GetFlag(FLAGS_listen).c_str());
    return 2;
  }
  // Each service by name too (the server as a whole, "", is SERVING already).
  server->GetHealthCheckService()->SetServingStatus(shardline::v1::Coordinator::service_full_name(), true);
  server->GetHealthCheckService()->SetServingStatus(shardline::v1::Admin::service_full_name(), true);
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    const absl::Status s = shardline::common::WriteFileAtomically(absl::GetFlag(FLAGS_port_file),
                                                                  absl::StrCat(port, "\n"));
    if (!s.ok()) LOG(ERROR) << s;
  }
  LOG(INFO) << "coordinator serving on port " << port << ", state in "
            << absl::GetFlag(FLAGS_state_dir);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  shardline::common::ServiceNotifier notifier;
  notifier.Ready(absl::StrCat("serving on port ", port));
  while (!stop_requested) {
    notifier.MainLoopAlive();
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(lease / 10));
    std::vector<WorkerRecord> lost = registry.ExpireLeases();
    for (const WorkerRecord& w : lost) LOG(WARNING) << "worker " << w.name << " lost its lease";
    if (!lost.empty()) jobs.WorkersLost(lost);
    jobs.Tick();
  }
  LOG(INFO) << "shutting down";
  notifier.Stopping("shutting down");
  server->GetHealthCheckService()->SetServingStatus(false);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  shardline::common::InitProcess(
      argc, argv, "shardline-coordinator --listen=HOST:PORT --state_dir=DIR [--lease_ms=N]");
  return Run();
}
