// A worker daemon asked by its coordinator's heartbeat answer to measure
// its GEMM rate again (HeartbeatResponse.measure_compute) measures it on
// its backend and sends it with its next heartbeat, once, at once.
#include <grpcpp/grpcpp.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "worker/worker_server.h"

namespace shardline::worker {
namespace {

class FakeCoordinator final : public shardline::v1::Coordinator::CallbackService {
 public:
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context, const shardline::v1::RegisterRequest*,
                                     shardline::v1::RegisterResponse* response) override {
    response->set_worker_id("worker-1");
    response->set_worker_secret("secret");
    response->set_lease_ms(300);
    return Finish(context);
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const shardline::v1::HeartbeatRequest* request,
                                      shardline::v1::HeartbeatResponse* response) override {
    absl::MutexLock lock(&mu_);
    beats_.push_back(*request);
    response->set_lease_ms(300);
    response->set_measure_compute(beats_.size() == 2);  // the second heartbeat's answer asks
    return Finish(context);
  }
  std::vector<shardline::v1::HeartbeatRequest> beats() {
    absl::MutexLock lock(&mu_);
    return beats_;
  }

 private:
  static grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  absl::Mutex mu_;
  std::vector<shardline::v1::HeartbeatRequest> beats_ ABSL_GUARDED_BY(mu_);
};

TEST(WorkerComputeProbeTest, AnAskedWorkerSendsAFreshGemmRateWithItsNextHeartbeatOnce) {
  FakeCoordinator coordinator;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddChannelArgument("grpc.so_reuseport", 0);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&coordinator);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);

  WorkerOptions options;
  options.name = "w";
  options.coordinator = absl::StrCat("127.0.0.1:", port);
  options.threads = 1;
  auto worker = WorkerServer::Start(options);
  ASSERT_TRUE(worker.ok()) << worker.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (coordinator.beats().size() < 6 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  (*worker)->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));

  const std::vector<shardline::v1::HeartbeatRequest> beats = coordinator.beats();
  ASSERT_GE(beats.size(), 6u);
  int with_rate = 0;
  for (size_t i = 0; i < beats.size(); ++i) {
    if (!beats[i].has_compute()) continue;
    ++with_rate;
    EXPECT_EQ(i, 2u) << "the heartbeat after the asking answer";
    EXPECT_GT(beats[i].compute().gemm_flops(), 1e8) << "measured on its CPU backend";
    EXPECT_GE(beats[i].compute().gemm_flops_spread(), 0);
    EXPECT_LE(beats[i].compute().gemm_flops_spread(), 10);
  }
  EXPECT_EQ(with_rate, 1);
}

}  // namespace
}  // namespace shardline::worker
