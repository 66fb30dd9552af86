// GrpcCoordinatorClient against fake coordinators: step reports that failed
// transiently are retried, refusals are not; shard uploads resume; state
// streams take as long as they flow and are cut when they stall; bulk
// transfers and heartbeats travel on separate connections.
#include "worker/grpc_coordinator_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/safetensors.h"
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

// Serves a stage's state (a safetensors file of `floats` floats) in chunks
// of `chunk` bytes, `pause` apart, stopping for good after `stall_after`
// chunks if that is set; remembers the peer (client address and port) of
// each FetchState and Heartbeat.
class StateCoordinator final : public shardline::v1::Coordinator::Service {
 public:
  explicit StateCoordinator(int64_t floats) {
    common::SafetensorsContents c;
    common::Tensor t = *common::Tensor::Zeros(common::DType::kF32, {floats});
    for (int64_t i = 0; i < floats; ++i) t.values<float>()[i] = static_cast<float>(i % 997);
    c.tensors.emplace("w", std::move(t));
    c.metadata["step"] = "7";
    bytes = *common::SerializeSafetensors(c);
  }
  grpc::Status FetchState(grpc::ServerContext* context, const shardline::v1::FetchStateRequest*,
                          grpc::ServerWriter<shardline::v1::ShardChunk>* writer) override {
    Remember(fetch_peers, context->peer());
    shardline::v1::ShardChunk chunk;
    chunk.mutable_header()->set_total_bytes(static_cast<int64_t>(bytes.size()));
    for (size_t at = 0, written = 0; at < bytes.size(); at += chunk_bytes, ++written) {
      if (stall_after >= 0 && written == static_cast<size_t>(stall_after)) {
        while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
        return grpc::Status::CANCELLED;
      }
      if (written > 0) absl::SleepFor(pause);
      chunk.set_data(bytes.substr(at, chunk_bytes));
      if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
      chunk.clear_header();
    }
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext* context, const shardline::v1::HeartbeatRequest*,
                         shardline::v1::HeartbeatResponse*) override {
    Remember(heartbeat_peers, context->peer());
    return grpc::Status::OK;
  }

  std::string bytes;
  size_t chunk_bytes = 64 << 10;
  absl::Duration pause = absl::ZeroDuration();
  int stall_after = -1;
  absl::Mutex mu;
  std::set<std::string> fetch_peers ABSL_GUARDED_BY(mu);
  std::set<std::string> heartbeat_peers ABSL_GUARDED_BY(mu);

 private:
  void Remember(std::set<std::string>& peers, const std::string& peer) {
    absl::MutexLock lock(&mu);
    peers.insert(peer);
  }
};

TEST(GrpcCoordinatorClientTest, AStateStreamTakesAsLongAsItKeepsFlowing) {
  StateCoordinator coordinator(1 << 18);  // 1 MiB in 16 chunks, 150 ms apart: 2.25 s
  coordinator.pause = absl::Milliseconds(150);
  Served<StateCoordinator> served(coordinator);
  GrpcCoordinatorClient client(absl::StrCat("127.0.0.1:", served.port), absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  absl::StatusOr<common::SafetensorsContents> state = client.FetchState(shardline::v1::FetchStateRequest());
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_GT(absl::Now() - start, 6 * absl::Milliseconds(300)) << "it should take more than six deadlines in all";
  EXPECT_EQ(state->metadata["step"], "7");
  ASSERT_EQ(state->tensors.count("w"), 1u);
  EXPECT_EQ(state->tensors.at("w").values<float>()[1000], 3.0f);  // 1000 % 997
}

TEST(GrpcCoordinatorClientTest, AStalledStateStreamIsCutAfterOneDeadline) {
  StateCoordinator coordinator(1 << 18);
  coordinator.stall_after = 3;
  Served<StateCoordinator> served(coordinator);
  GrpcCoordinatorClient client(absl::StrCat("127.0.0.1:", served.port), absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  absl::StatusOr<common::SafetensorsContents> state = client.FetchState(shardline::v1::FetchStateRequest());
  EXPECT_EQ(state.status().code(), absl::StatusCode::kDeadlineExceeded) << state.status();
  EXPECT_NE(state.status().message().find("196608 of"), std::string::npos) << state.status();  // 3 chunks came
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(GrpcCoordinatorClientTest, StateAndHeartbeatsTravelOnSeparateConnections) {
  StateCoordinator coordinator(1 << 16);
  Served<StateCoordinator> served(coordinator);
  GrpcCoordinatorClient client(absl::StrCat("127.0.0.1:", served.port), absl::Seconds(10));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(client.Heartbeat("w").ok());
    ASSERT_TRUE(client.FetchState(shardline::v1::FetchStateRequest()).ok());
  }
  absl::MutexLock lock(&coordinator.mu);
  // One connection each, kept across calls; never the same one.
  ASSERT_EQ(coordinator.heartbeat_peers.size(), 1u);
  ASSERT_EQ(coordinator.fetch_peers.size(), 1u);
  EXPECT_NE(*coordinator.heartbeat_peers.begin(), *coordinator.fetch_peers.begin());
}

}  // namespace
}  // namespace shardline::worker
