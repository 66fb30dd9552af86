// GrpcCoordinatorClient against a fake coordinator whose ReportStep fails
// the first calls: transient failures are retried, refusals are not.
#include "worker/grpc_coordinator_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardline::worker {
namespace {

class FlakyCoordinator final : public shardline::v1::Coordinator::CallbackService {
 public:
  FlakyCoordinator(int failures, grpc::StatusCode code) : failures_(failures), code_(code) {}
  grpc::ServerUnaryReactor* ReportStep(grpc::CallbackServerContext* context, const shardline::v1::ReportStepRequest*,
                                       shardline::v1::ReportStepResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (calls_++ < failures_) {
      reactor->Finish(grpc::Status(code_, "not now"));
    } else {
      response->set_stop(true);
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }
  int calls() const { return calls_; }

 private:
  const int failures_;
  const grpc::StatusCode code_;
  std::atomic<int> calls_{0};
};

struct Served {
  explicit Served(FlakyCoordinator& service) {
    grpc::ServerBuilder builder;
    builder.AddChannelArgument("grpc.so_reuseport", 0);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Served() { server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1)); }
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

TEST(GrpcCoordinatorClientTest, AStepReportTheCoordinatorDidNotAnswerIsSentAgain) {
  FlakyCoordinator coordinator(3, grpc::StatusCode::UNAVAILABLE);
  Served served(coordinator);
  ASSERT_NE(served.port, 0);
  GrpcCoordinatorClient client(absl::StrCat("127.0.0.1:", served.port), absl::Seconds(10));
  absl::StatusOr<bool> stop = client.ReportStep(shardline::v1::ReportStepRequest());
  ASSERT_TRUE(stop.ok()) << stop.status();
  EXPECT_TRUE(*stop);  // the answer of the call that got through
  EXPECT_EQ(coordinator.calls(), 4);
}

TEST(GrpcCoordinatorClientTest, ARefusedStepReportIsNotRetried) {
  FlakyCoordinator coordinator(1, grpc::StatusCode::FAILED_PRECONDITION);
  Served served(coordinator);
  GrpcCoordinatorClient client(absl::StrCat("127.0.0.1:", served.port), absl::Seconds(10));
  absl::StatusOr<bool> stop = client.ReportStep(shardline::v1::ReportStepRequest());
  EXPECT_EQ(stop.status().code(), absl::StatusCode::kFailedPrecondition) << stop.status();
  EXPECT_EQ(coordinator.calls(), 1);
}

TEST(GrpcCoordinatorClientTest, RetriesStopAfterOneDeadline) {
  FlakyCoordinator coordinator(1 << 30, grpc::StatusCode::UNAVAILABLE);
  Served served(coordinator);
  GrpcCoordinatorClient client(absl::StrCat("127.0.0.1:", served.port), absl::Milliseconds(500));
  absl::StatusOr<bool> stop = client.ReportStep(shardline::v1::ReportStepRequest());
  EXPECT_EQ(stop.status().code(), absl::StatusCode::kUnavailable) << stop.status();
  EXPECT_NE(stop.status().message().find("attempts"), std::string::npos) << stop.status();
  EXPECT_GT(coordinator.calls(), 1);
}

}  // namespace
}  // namespace shardline::worker
