#include "tests/testing/in_process_cluster.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::testing {

absl::StatusOr<std::unique_ptr<InProcessCluster>> InProcessCluster::Start(
    int workers, absl::Duration lease, const std::function<void(worker::WorkerOptions&)>& configure) {
  static std::atomic<int> instance{0};
  std::unique_ptr<InProcessCluster> c(new InProcessCluster());
  const std::string dir = absl::StrCat(::testing::TempDir(), "/cluster-", getpid(), "-", instance++);
  std::filesystem::remove_all(dir);
  ASSIGN_OR_RETURN(c->weights_, server::WeightStore::Open(dir));
  c->registry_ = std::make_unique<server::WorkerRegistry>(lease);
  c->coordinator_ = std::make_unique<server::CoordinatorService>(*c->registry_);
  InProcessCluster* self = c.get();
  ASSIGN_OR_RETURN(c->store_, server::CoordinatorStore::Open(dir + "/coordinator.db"));
  c->jobs_ = std::make_unique<server::JobManager>(
      *c->registry_, *c->weights_, *c->store_, [self](const std::string& worker, shardline::v1::Assignment a) {
        self->coordinator_->Deliver(worker, std::move(a));
      });
  c->coordinator_->set_jobs(c->jobs_.get());
  c->admin_ = std::make_unique<server::AdminService>(*c->jobs_, *c->registry_, *c->weights_);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddChannelArgument("grpc.so_reuseport", 0);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(c->coordinator_.get());
  builder.RegisterService(c->admin_.get());
  c->server_ = builder.BuildAndStart();
  if (c->server_ == nullptr || port == 0) return absl::UnavailableError("cannot start the coordinator");
  c->address_ = absl::StrCat("127.0.0.1:", port);
  c->reaper_ = std::thread([self, lease] {
    while (!self->stop_) {
      absl::SleepFor(lease / 10);
      const auto lost = self->registry_->ExpireLeases();
      if (!lost.empty()) self->jobs_->WorkersLost(lost);
      self->jobs_->Tick();
    }
  });
  for (int i = 0; i < workers; ++i) {
    worker::WorkerOptions options;
    options.coordinator = c->address_;
    options.name = absl::StrCat("t", i);
    options.threads = 1;
    options.link.timeout = absl::Seconds(30);
    if (configure) configure(options);
    ASSIGN_OR_RETURN(auto w, worker::WorkerServer::Start(options));
    c->workers_.push_back(std::move(w));
  }
  return c;
}

InProcessCluster::~InProcessCluster() {
  workers_.clear();
  stop_ = true;
  if (reaper_.joinable()) reaper_.join();
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace shardline::testing
