// GrpcCoordinatorClient against a fake coordinator whose ReportStep fails
// the first calls: transient failures are retried, refusals are not.
#include "worker/grpc_coordinator_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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

template <typename Service>
struct Served {
  explicit Served(Service& service) {
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
  Served<FlakyCoordinator> served(coordinator);
  ASSERT_NE(served.port, 0);
  GrpcCoordinatorClient client(absl::StrCat("127.0.0.1:", served.port), absl::Seconds(10));
  absl::StatusOr<bool> stop = client.ReportStep(shardline::v1::ReportStepRequest());
  ASSERT_TRUE(stop.ok()) << stop.status();
  EXPECT_TRUE(*stop);  // the answer of the call that got through
  EXPECT_EQ(coordinator.calls(), 4);
}

TEST(GrpcCoordinatorClientTest, ARefusedStepReportIsNotRetried) {
  FlakyCoordinator coordinator(1, grpc::StatusCode::FAILED_PRECONDITION);
  Served<FlakyCoordinator> served(coordinator);
  GrpcCoordinatorClient client(absl::StrCat("127.0.0.1:", served.port), absl::Seconds(10));
  absl::StatusOr<bool> stop = client.ReportStep(shardline::v1::ReportStepRequest());
  EXPECT_EQ(stop.status().code(), absl::StatusCode::kFailedPrecondition) << stop.status();
  EXPECT_EQ(coordinator.calls(), 1);
}

TEST(GrpcCoordinatorClientTest, RetriesStopAfterOneDeadline) {
  FlakyCoordinator coordinator(1 << 30, grpc::StatusCode::UNAVAILABLE);
  Served<FlakyCoordinator> served(coordinator);
  GrpcCoordinatorClient client(absl::StrCat("127.0.0.1:", served.port), absl::Milliseconds(500));
  absl::StatusOr<bool> stop = client.ReportStep(shardline::v1::ReportStepRequest());
  EXPECT_EQ(stop.status().code(), absl::StatusCode::kUnavailable) << stop.status();
  EXPECT_NE(stop.status().message().find("attempts"), std::string::npos) << stop.status();
  EXPECT_GT(coordinator.calls(), 1);
}

// Takes shard uploads the way a troubled coordinator would: the first
// stream is dropped after `break_after` bytes, or is never read past its
// first chunk (`stall_first`); later streams resume where its copy ends.
class UploadCoordinator final : public shardline::v1::Coordinator::CallbackService {
 public:
  grpc::ServerReadReactor<shardline::v1::ShardChunk>* ReportShard(
      grpc::CallbackServerContext*, shardline::v1::ReportShardResponse* response) override {
    return new Reader(*this, response, streams_++);
  }

  int64_t break_after = -1;
  bool stall_first = false;
  std::atomic<int> streams_{0};
  absl::Mutex mu;
  std::string bytes ABSL_GUARDED_BY(mu);
  int64_t received ABSL_GUARDED_BY(mu) = 0;  // over every stream

 private:
  class Reader final : public grpc::ServerReadReactor<shardline::v1::ShardChunk> {
   public:
    Reader(UploadCoordinator& owner, shardline::v1::ReportShardResponse* response, int index)
        : owner_(owner), response_(response), index_(index) {
      StartRead(&chunk_);
    }
    void OnReadDone(bool ok) override {
      absl::MutexLock lock(&owner_.mu);
      if (!ok) {
        response_->set_stored(static_cast<int64_t>(owner_.bytes.size()) == total_);
        return Done(grpc::Status::OK);
      }
      if (chunk_.has_header()) {
        total_ = chunk_.header().total_bytes();
        if (chunk_.header().offset() != static_cast<int64_t>(owner_.bytes.size())) {
          response_->set_resume_offset(static_cast<int64_t>(owner_.bytes.size()));
          return Done(grpc::Status::OK);
        }
        if (owner_.stall_first && index_ == 0) return;  // never reads again
      }
      owner_.bytes += chunk_.data();
      owner_.received += static_cast<int64_t>(chunk_.data().size());
      if (index_ == 0 && owner_.break_after >= 0 && static_cast<int64_t>(owner_.bytes.size()) >= owner_.break_after) {
        return Done(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection dropped"));
      }
      StartRead(&chunk_);
    }
    void OnCancel() override {
      absl::MutexLock lock(&owner_.mu);
      Done(grpc::Status::CANCELLED);
    }
    void OnDone() override { delete this; }

   private:
    void Done(const grpc::Status& status) {
      if (finished_) return;
      finished_ = true;
      Finish(status);
    }
    UploadCoordinator& owner_;
    shardline::v1::ReportShardResponse* const response_;
    const int index_;
    shardline::v1::ShardChunk chunk_;
    int64_t total_ = -1;
    bool finished_ = false;
  };
};

std::unique_ptr<ShardSnapshot> BigShard(int64_t floats) {
  common::SafetensorsContents c;
  common::Tensor t = *common::Tensor::Zeros(common::DType::kF32, {floats});
  for (int64_t i = 0; i < floats; ++i) t.values<float>()[i] = static_cast<float>(i % 1009);
  c.tensors.emplace("w", std::move(t));
  auto shard = *ShardSnapshot::Create(shardline::v1::ShardHeader(), std::move(c));
  shard->ComputeDigest();
  return shard;
}

TEST(GrpcCoordinatorClientTest, ABrokenShardUploadResumesWhereTheCoordinatorsCopyEnds) {
  UploadCoordinator coordinator;
  std::unique_ptr<ShardSnapshot> shard = BigShard(4 << 20);  // 16 MiB
  coordinator.break_after = shard->size() * 3 / 4;
  Served<UploadCoordinator> served(coordinator);
  GrpcCoordinatorClient client(absl::StrCat("127.0.0.1:", served.port), absl::Seconds(10));
  std::atomic<bool> cancelled{false};
  const absl::Status uploaded = client.ReportShard(*shard, cancelled);
  ASSERT_TRUE(uploaded.ok()) << uploaded;
  absl::MutexLock lock(&coordinator.mu);
  EXPECT_TRUE(coordinator.bytes == shard->Bytes()) << "the coordinator's copy differs";
  EXPECT_LT(coordinator.received, shard->size() * 5 / 4) << "the upload started over instead of resuming";
  EXPECT_GE(coordinator.streams_, 2);
}

TEST(GrpcCoordinatorClientTest, AStalledShardStreamIsCutAfterOneChunkDeadlineAndResumed) {
  UploadCoordinator coordinator;
  coordinator.stall_first = true;
  std::unique_ptr<ShardSnapshot> shard = BigShard(8 << 20);  // 32 MiB: more than HTTP/2's windows
  Served<UploadCoordinator> served(coordinator);
  GrpcCoordinatorClient client(absl::StrCat("127.0.0.1:", served.port), absl::Milliseconds(500));
  std::atomic<bool> cancelled{false};
  const absl::Status uploaded = client.ReportShard(*shard, cancelled);
  ASSERT_TRUE(uploaded.ok()) << uploaded;
  absl::MutexLock lock(&coordinator.mu);
  EXPECT_TRUE(coordinator.bytes == shard->Bytes());
  EXPECT_GE(coordinator.streams_, 2);
}

TEST(GrpcCoordinatorClientTest, AnAbandonedShardUploadStopsAtOnce) {
  UploadCoordinator coordinator;
  coordinator.stall_first = true;
  std::unique_ptr<ShardSnapshot> shard = BigShard(8 << 20);
  Served<UploadCoordinator> served(coordinator);
  GrpcCoordinatorClient client(absl::StrCat("127.0.0.1:", served.port), absl::Seconds(60));
  std::atomic<bool> cancelled{false};
  std::thread abandon([&] {
    absl::SleepFor(absl::Milliseconds(200));
    cancelled = true;
  });
  const absl::Time start = absl::Now();
  const absl::Status uploaded = client.ReportShard(*shard, cancelled);
  abandon.join();
  EXPECT_EQ(uploaded.code(), absl::StatusCode::kCancelled) << uploaded;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "it waited for the chunk deadline";
}

}  // namespace
}  // namespace shardline::worker
