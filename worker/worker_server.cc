#include "worker/worker_server.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "common/heartbeat.h"
#include "common/init.h"
#include "common/revocation_call_check.h"
#include "worker/backend/backend_factory.h"
#include "worker/gemm_rate.h"

namespace shardline::worker {
namespace {

// "127.0.0.1:0" → "127.0.0.1"; "[::1]:0" → "[::1]".
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

// A host that means "every address of this machine": neighbours cannot dial it.
bool IsWildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::" || host == "*";
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(const WorkerOptions& options) {
  if (options.name.empty()) return absl::InvalidArgumentError("--name is required");
  if (options.advertise_host.empty() && IsWildcard(HostOf(options.listen))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", options.listen, " serves on every address of this machine, so its neighbours need "
        "to be told which one to dial: set --advertise_host to this machine's name or address as the "
        "other workers reach it (in Docker Compose: the service's name)"));
  }
  const std::shared_ptr<common::TransportSecurity> security =
      options.security != nullptr ? options.security : common::TransportSecurity::Plaintext();
  RETURN_IF_ERROR(security->CheckListenAddress(options.listen));
  WorkerOptions secured = options;
  secured.security = security;
  secured.link.channel_credentials = security->ChannelCredentials();
  std::unique_ptr<WorkerServer> w(new WorkerServer(secured));
  ASSIGN_OR_RETURN(w->backend_, CreateBackend(options.device, {options.threads}));
  GemmRate rate{options.gemm_flops, 0};  // a rate given is taken as exact
  if (!(rate.flops > 0)) {
    ASSIGN_OR_RETURN(rate, MeasureGemmRate(*w->backend_));
  }
  const double flops = rate.flops;
  ASSIGN_OR_RETURN(int64_t memory, w->backend_->MemoryAvailable());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddChannelArgument("grpc.so_reuseport", 0);
  builder.AddListeningPort(options.listen, security->ServerCredentials(), &w->port_);
  w->link_service_.RegisterWith(builder);
  builder.RegisterService(&w->state_service_);
  builder.RegisterService(&w->probe_service_);
  w->server_ = builder.BuildAndStart();
  if (w->server_ == nullptr || w->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  w->PublishHealth();  // NOT_SERVING until registered
  const std::string host = options.advertise_host.empty() ? HostOf(options.listen) : options.advertise_host;

  w->coordinator_ =
      std::make_unique<GrpcCoordinatorClient>(options.coordinator, options.rpc_deadline, security->ChannelCredentials());
  w->probes_ = std::make_unique<GrpcLinkProbes>(
      host, security->ChannelCredentials(),
      [self = w.get()](const shardline::v1::ReportLinksRequest& r) { return self->coordinator_->ReportLinks(r); });
  shardline::v1::RegisterRequest& request = w->registration_;
  request.set_name(options.name);
  auto* caps = request.mutable_capabilities();
  caps->set_device(w->backend_->name());
  caps->set_description(w->backend_->description());
  caps->set_memory_bytes(memory);
  caps->set_gemm_flops(flops);
  caps->set_gemm_flops_spread(rate.spread);
  caps->set_listen_address(absl::StrCat(host, ":", w->port_));
  caps->set_build_version(absl::StrCat("shardline ", common::Version()));
  ASSIGN_OR_RETURN(shardline::v1::RegisterResponse registered, w->coordinator_->Register(request));
  {
    absl::MutexLock lock(&w->id_mu_);
    w->worker_id_ = registered.worker_id();
  }
  w->registered_ = true;
  w->PublishHealth();
  w->metrics_
      ->GetGauge("shardline_build_info", "the build: its version in a label; the value is 1",
                {{"version", std::string(common::Version())}, {"daemon", "worker"}})
      .Set(1);
  w->metrics_
      ->GetGauge("shardline_worker_info", "this worker: its name and backend in labels; the value is 1",
                {{"name", options.name}, {"device", w->backend_->name()}})
      .Set(1);
  w->metrics_->AddRefresh([self = w.get()] { self->RefreshStagingMetrics(); });
  w->metrics_->GetGauge("shardline_worker_gemm_flops", "the f32 GEMM rate it reported to the planner").Set(flops);
  w->metrics_->GetGauge("shardline_worker_memory_bytes", "the memory it reported to the planner")
      .Set(static_cast<double>(memory));
  LOG(INFO) << "worker " << options.name << " registered as " << registered.worker_id() << " ("
            << w->backend_->description() << ", " << flops / 1e9 << " GFLOP/s ± "
            << 50 * rate.spread << "%, StageLink on port "
            << w->port_ << ")";
  const absl::Duration every = common::HeartbeatInterval(absl::Milliseconds(registered.lease_ms()));
  WorkerServer* self = w.get();
  w->heartbeat_ = std::thread([self, every] { self->HeartbeatLoop(every); });
  w->watch_ = std::thread([self] { self->WatchLoop(); });
  return w;
}

std::string WorkerServer::worker_id() const {
  absl::MutexLock lock(&id_mu_);
  return worker_id_;
}

WorkerServer::~WorkerServer() { Stop(); }

void WorkerServer::PublishHealth() {
  absl::MutexLock lock(&health_mu_);
  if (server_ == nullptr) return;
  const bool serving = registered_ && !drained_ && !stopping_;
  metrics_->GetGauge("shardline_worker_serving", "1 while the worker can take work (its health: SERVING)")
      .Set(serving ? 1 : 0);
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(serving);  // the server as a whole ("")
  health->SetServingStatus(transport::StageLinkService::kServiceName, serving);
  health->SetServingStatus(shardline::v1::WorkerState::service_full_name(), serving);
}

void WorkerServer::RefreshStagingMetrics() {
  transport::GrpcStageLink::StagingUse use;
  {
    absl::MutexLock lock(&mu_);
    if (link_ != nullptr) use = link_->Staging();
  }
  metrics_->GetGauge("shardline_worker_staging_slots", "the running stage's link staging slots, by state",
                     {{"state", "in_use"}})
      .Set(use.in_use);
  metrics_->GetGauge("shardline_worker_staging_slots", "the running stage's link staging slots, by state",
                     {{"state", "free"}})
      .Set(use.slots - use.in_use);
  metrics_->GetGauge("shardline_worker_staging_bytes",
                     "host memory of the running stage's link staging slots (page-locked on CUDA)")
      .Set(static_cast<double>(use.bytes));
}

void WorkerServer::Stop() {
  if (stopping_.exchange(true)) {
    stopped_.WaitForNotification();
    return;
  }
  PublishHealth();  // NOT_SERVING from now on
  // Told first, so that the job ends naming this worker at once (not a
  // lease later, nor as its neighbours' broken links).
  if (coordinator_ != nullptr) {
    const absl::Status left = coordinator_->Leave(worker_id(), "it is shutting down");
    if (!left.ok()) LOG(WARNING) << "could not tell the coordinator this worker leaves: " << left;
  }
  {
    absl::MutexLock lock(&mu_);
    job_cancelled_ = true;
    if (link_ != nullptr) link_->Close("the worker is shutting down");
    if (groups_ != nullptr) groups_->Close("the worker is shutting down");
  }
  JoinJob();
  if (probes_ != nullptr) probes_->Stop();
  if (coordinator_ != nullptr) coordinator_->CancelWatch();
  if (watch_.joinable()) watch_.join();
  JoinJob();  // none started since (OnAssignment checks stopping_): for certain
  if (heartbeat_.joinable()) heartbeat_.join();
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  stopped_.Notify();
}

void WorkerServer::HeartbeatLoop(absl::Duration every) {
  bool reachable = true;
  std::optional<shardline::v1::ComputeProbe> compute;  // measured as asked, not yet sent
  bool at_once = false;  // just measured: sent without the usual wait (once)
  while (!stopping_) {
    const absl::Time next = at_once ? absl::Now() : absl::Now() + every;
    at_once = false;
    while (!stopping_ && absl::Now() < next) absl::SleepFor(absl::Milliseconds(5));
    if (stopping_) return;
    absl::StatusOr<shardline::v1::HeartbeatResponse> answer =
        coordinator_->Heartbeat(worker_id(), activity_.Now(), compute);
    const absl::Status status = answer.status();
    if (status.ok() || absl::IsNotFound(status)) compute.reset();
    if (absl::IsNotFound(status)) {
      LOG(WARNING) << "the coordinator no longer knows this worker (it restarted, or the lease lapsed): "
                      "stopping its job and registering again";
      registered_ = false;
      PublishHealth();
      RegisterAgain();
      reachable = true;
      continue;
    }
    // Refused on a connection opened before this worker's certificate was
    // revoked: connect again with the files as they are now. A certificate
    // replaced meanwhile carries on (the same registration, if within the
    // lease); the revoked one is refused in the handshake, so heartbeats
    // fail until a new one is in place, the lease lapses and the job fails
    // over, and the worker registers again once it has one.
    if (absl::IsUnauthenticated(status) && absl::StrContains(status.message(), common::kRevokedCertificate)) {
      LOG(ERROR) << "the coordinator refuses this worker's certificate (" << status.message()
                 << "): connecting again with the files of --tls_cert as they are now; until they hold a "
                    "certificate not revoked, this worker takes no work";
      coordinator_->Reconnect();
      coordinator_->CancelWatch();  // the assignment stream too: watched again on the new connection
      reachable = false;
      at_once = true;
      continue;
    }
    if (answer.ok() && answer->probe_targets_size() > 0) {
      probes_->Start(worker_id(), {answer->probe_targets().begin(), answer->probe_targets().end()});
    }
    if (answer.ok() && answer->measure_compute()) {
      compute = MeasureIdleCompute();
      at_once = compute.has_value();
    }
    if (answer.ok() && answer->drained() != drained_) {
      drained_ = answer->drained();
      LOG(INFO) << (drained_ ? "drained by the coordinator: health NOT_SERVING"
                             : "undrained by the coordinator: health SERVING");
      PublishHealth();
    }
    if (!status.ok() && reachable) LOG(WARNING) << "heartbeat failed: " << status << "; retrying";
    if (status.ok() && !reachable) LOG(INFO) << "the coordinator answers heartbeats again";
    reachable = status.ok();
  }
}

std::optional<shardline::v1::ComputeProbe> WorkerServer::MeasureIdleCompute() {
  absl::MutexLock lock(&mu_);  // an assignment arriving now starts after it (~0.5 s)
  if (job_running_) return std::nullopt;  // asked while idle; the coordinator asks again
  GemmRate rate{options_.gemm_flops, 0};  // a rate given is taken as exact
  if (!(rate.flops > 0)) {
    absl::StatusOr<GemmRate> measured = MeasureGemmRate(*backend_);
    if (!measured.ok()) {
      LOG(WARNING) << "cannot measure the GEMM rate again: " << measured.status();
      return std::nullopt;
    }
    rate = *measured;
  }
  LOG(INFO) << "the coordinator asked for a fresh GEMM rate (its jobs ran slower than its probe): "
            << rate.flops / 1e9 << " GFLOP/s ± " << 50 * rate.spread << "%";
  shardline::v1::ComputeProbe probe;
  probe.set_gemm_flops(rate.flops);
  probe.set_gemm_flops_spread(rate.spread);
  return probe;
}

void WorkerServer::RegisterAgain() {
  {
    absl::MutexLock lock(&mu_);
    CancelJob("the coordinator no longer knows this worker");
  }
  absl::BitGen random;
  absl::Duration backoff = absl::Milliseconds(100);
  while (!stopping_) {
    absl::StatusOr<shardline::v1::RegisterResponse> registered = coordinator_->Register(registration_);
    if (registered.ok()) {
      {
        absl::MutexLock lock(&id_mu_);
        worker_id_ = registered->worker_id();
      }
      LOG(INFO) << "registered again as " << registered->worker_id();
      registered_ = true;
      drained_ = false;  // a new registration starts in service
      PublishHealth();
      coordinator_->CancelWatch();  // the assignment stream follows the new id
      return;
    }
    LOG(WARNING) << "registering again failed: " << registered.status();
    // Jittered exponential backoff: [½, 1] of 100 ms, 200 ms, … 5 s.
    const absl::Duration wait = backoff * absl::Uniform(random, 0.5, 1.0);
    backoff = std::min(2 * backoff, absl::Seconds(5));
    const absl::Time until = absl::Now() + wait;
    while (!stopping_ && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  }
}

void WorkerServer::WatchLoop() {
  absl::BitGen random;
  absl::Duration backoff = absl::Milliseconds(100);
  while (!stopping_) {
    const absl::Time started = absl::Now();
    const std::string id = worker_id();
    const absl::Status status =
        coordinator_->WatchAssignments(id, [this](const shardline::v1::Assignment& a) { OnAssignment(a); });
    if (stopping_) return;
    // A stream that lived a while starts the backoff over.
    if (absl::Now() - started > absl::Seconds(10)) backoff = absl::Milliseconds(100);
    LOG(WARNING) << "assignment stream of " << id << " ended: " << status << "; watching again";
    const absl::Duration wait = backoff * absl::Uniform(random, 0.5, 1.0);
    backoff = std::min(2 * backoff, absl::Seconds(5));
    const absl::Time until = absl::Now() + wait;
    while (!stopping_ && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace shardline::worker
