// The LinkProbe service and the prober over a real gRPC server on loopback:
// a probe measures a round trip and a rate, growing its transfers; the
// service stays bounded (bytes per call, calls at once) and keeps serving.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "shardline/v1/link_probe.grpc.pb.h"
#include "tests/testing/loopback_server.h"
#include "worker/transport/grpc_link_prober.h"
#include "worker/transport/link_probe_service.h"

namespace shardline::worker::transport {
namespace {

class LinkProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::shardline::testing::LoopbackServer started = ::shardline::testing::StartLoopbackServer({&service_});
    ASSERT_NE(started.server, nullptr);
    server_ = std::move(started.server);
    address_ = started.address();
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<shardline::v1::LinkProbe::Stub> Stub() {
    return shardline::v1::LinkProbe::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  LinkProbeService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::atomic<bool> not_cancelled_{false};
};

TEST_F(LinkProbeTest, MeasuresARoundTripAndARateWithItsSpread) {
  LinkProbeOptions options;
  options.first_transfer_bytes = 64 << 10;
  options.max_transfer_bytes = 4 << 20;
  options.min_transfer_seconds = 10;  // never reached: the transfers grow to the largest
  options.chunk_bytes = 256 << 10;
  auto result = ProbeLink(address_, nullptr, options, not_cancelled_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->transfer_bytes, 4 << 20) << "64 KiB × 4 × 4 × 4, then capped";
  EXPECT_GT(result->bytes_per_second, 1e6) << "loopback moves more than a MB/s";
  EXPECT_GT(result->rtt_seconds, 0);
  EXPECT_LT(result->rtt_seconds, 1.0);
  EXPECT_GE(result->spread, 0);
  EXPECT_EQ(service_.active_sinks(), 0);
}

TEST_F(LinkProbeTest, AnUnreachablePeerIsAnErrorNotAHang) {
  LinkProbeOptions options;
  options.deadline = absl::Seconds(2);
  server_->Shutdown();
  auto result = ProbeLink(address_, nullptr, options, not_cancelled_);
  EXPECT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsUnavailable(result.status()) || absl::IsDeadlineExceeded(result.status())) << result.status();
}

TEST_F(LinkProbeTest, ACancelledProbeStopsBetweenTransfers) {
  std::atomic<bool> cancelled{true};
  auto result = ProbeLink(address_, nullptr, LinkProbeOptions(), cancelled);
  EXPECT_TRUE(absl::IsCancelled(result.status())) << result.status();
}

TEST_F(LinkProbeTest, TheSinkRefusesMoreThanItsBytesAndKeepsServing) {
  auto stub = Stub();
  grpc::ClientContext context;
  shardline::v1::LinkProbeReceipt receipt;
  auto writer = stub->Sink(&context, &receipt);
  shardline::v1::LinkProbeChunk chunk;
  chunk.mutable_payload()->assign(2 << 20, 'x');
  for (int64_t sent = 0; sent <= LinkProbeService::kMaxProbeBytes; sent += 2 << 20) {
    if (!writer->Write(chunk)) break;
  }
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  LinkProbeOptions small;
  small.max_transfer_bytes = 1 << 20;
  small.min_transfer_seconds = 0;
  EXPECT_TRUE(ProbeLink(address_, nullptr, small, not_cancelled_).ok()) << "still serving";
}

TEST_F(LinkProbeTest, AThirdProbeAtOnceIsRefused) {
  auto stub = Stub();
  grpc::ClientContext first_context, second_context, third_context;
  shardline::v1::LinkProbeReceipt r1, r2, r3;
  shardline::v1::LinkProbeChunk chunk;
  chunk.set_payload("x");
  auto first = stub->Sink(&first_context, &r1);
  auto second = stub->Sink(&second_context, &r2);
  ASSERT_TRUE(first->Write(chunk));
  ASSERT_TRUE(second->Write(chunk));
  for (int i = 0; i < 500 && service_.active_sinks() < 2; ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(service_.active_sinks(), 2);
  auto third = stub->Sink(&third_context, &r3);
  third->WritesDone();
  EXPECT_EQ(third->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  first->WritesDone();
  second->WritesDone();
  EXPECT_TRUE(first->Finish().ok());
  EXPECT_TRUE(second->Finish().ok());
  EXPECT_EQ(r1.bytes(), 1);
  EXPECT_EQ(service_.active_sinks(), 0);
}

}  // namespace
}  // namespace shardline::worker::transport
