// The StageLink service facing peers that misbehave: a wrong job, stage or
// epoch, a second connection, another method, a hello without credit,
// frames beyond their credit, absurd grants, malformed frames. Each gets a
// clear status and the service keeps serving.
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shardline/v1/coordinator.grpc.pb.h"
#include "tests/worker/transport/stage_link_test_util.h"

namespace shardline::worker::transport {
namespace {

using shardline::v1::StageFrame;

TEST(StageLinkServiceTest, WrongPeersGetClearStatusesAndTheServiceKeepsServing) {
  auto server = StartServer();
  auto stream = server->service->Expect("job-1", 7, 0, Exchange(absl::Seconds(5)));

  RawPeer unknown_job(server->address);
  unknown_job.Write(Hello("job-2", 7, 1));
  EXPECT_EQ(unknown_job.Finish().error_code(), grpc::StatusCode::NOT_FOUND);

  RawPeer stale(server->address);
  stale.Write(Hello("job-1", 6, 1));
  const grpc::Status stale_status = stale.Finish();
  EXPECT_EQ(stale_status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(stale_status.error_message().find("epoch 6"), std::string::npos);
  EXPECT_EQ(server->service->hellos_refused(), 2);

  RawPeer no_hello(server->address);
  StageFrame data;
  data.set_kind(StageFrame::GRADIENT);
  no_hello.Write(data);
  EXPECT_EQ(no_hello.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // A real link with a stale epoch learns why it was refused.
  auto stale_link = GrpcStageLink::Create(Options(1, 2, server.get(), server.get(), /*epoch=*/5));
  ASSERT_TRUE(stale_link.ok());
  auto refused = (*stale_link)->ReceiveFromPrevious();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("epoch 5"), std::string::npos) << refused.status();
  stale_link->reset();

  // The right peer still connects, and a second one for the same stage is refused.
  auto good = GrpcStageLink::Create(Options(1, 2, server.get(), server.get()));
  ASSERT_TRUE(good.ok());
  StageMessage gradient;
  gradient.kind = StageMessage::Kind::kGradient;
  gradient.step = 1;
  gradient.values = {1.0f, 2.0f, 3.0f};
  ASSERT_TRUE((*good)->SendToPrevious(gradient).ok());
  auto received = stream->Receive();
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->values, gradient.values);
  RawPeer second(server->address);
  second.Write(Hello("job-1", 7, 1));
  EXPECT_EQ(second.Finish().error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(server->service->hellos_refused(), 4) << "unknown job, two stale epochs, a second stream";
  good->reset();
  server->server->Shutdown();
}

// After a re-plan a neighbour may start the new epoch before the stage here
// has stopped the old one: its hello is not refused as stale but retried
// until the stage here expects the new epoch.
TEST(StageLinkServiceTest, ALinkOfANewerEpochWaitsForTheStageHereToCatchUp) {
  auto server = StartServer();
  auto old_stream = server->service->Expect("job-1", 7, 0, Exchange(absl::Seconds(5)));
  RawPeer early(server->address);
  early.Write(Hello("job-1", 8, 1));
  const grpc::Status early_status = early.Finish();
  EXPECT_EQ(early_status.error_code(), grpc::StatusCode::NOT_FOUND) << early_status.error_message();
  EXPECT_NE(early_status.error_message().find("epoch 8 has not started here yet"), std::string::npos)
      << early_status.error_message();

  auto link = GrpcStageLink::Create(Options(1, 2, server.get(), server.get(), /*epoch=*/8));
  ASSERT_TRUE(link.ok());
  std::shared_ptr<ExchangeStream> new_stream;
  std::thread catch_up([&] {
    absl::SleepFor(absl::Milliseconds(300));
    old_stream.reset();
    new_stream = server->service->Expect("job-1", 8, 0, Exchange(absl::Seconds(5)));
  });
  StageMessage gradient;
  gradient.kind = StageMessage::Kind::kGradient;
  gradient.step = 1;
  gradient.values = {4.0f, 5.0f};
  const absl::Status sent = (*link)->SendToPrevious(gradient);
  catch_up.join();
  ASSERT_TRUE(sent.ok()) << sent;
  auto received = new_stream->Receive();
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->values, gradient.values);
  link->reset();
  server->server->Shutdown();
}

TEST(StageLinkServiceTest, OtherMethodsAreUnimplementedAndTheServiceKeepsServing) {
  auto server = StartServer();
  auto stub = shardline::v1::Coordinator::NewStub(
      grpc::CreateChannel(server->address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  shardline::v1::RegisterResponse response;
  EXPECT_EQ(stub->Register(&context, {}, &response).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  auto stream = server->service->Expect("job-1", 7, 0, Exchange(absl::Seconds(5)));
  RawPeer no_credit(server->address);
  StageFrame hello = Hello("job-1", 7, 1);
  hello.clear_credit();
  no_credit.Write(hello);
  EXPECT_EQ(no_credit.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "a hello must grant credit";
  server->server->Shutdown();
}

// Single-frame gradients from a raw peer that ignores the credit it was given.
TEST(StageLinkServiceTest, AFrameBeyondTheGrantedCreditEndsTheStream) {
  auto server = StartServer();
  ExchangeOptions options = Exchange(absl::Seconds(5));
  options.window_frames = 2;
  options.max_waiting = 1;  // the stage takes nothing: no credit comes back
  auto stream = server->service->Expect("job-1", 7, 0, options);
  RawPeer greedy(server->address);
  ASSERT_TRUE(greedy.Write(Hello("job-1", 7, 1)));
  StageFrame gradient;
  gradient.set_kind(StageFrame::GRADIENT);
  gradient.set_dtype(shardline::v1::DTYPE_F32);
  gradient.set_chunk_count(1);
  for (int i = 0; i < 3; ++i) greedy.Write(gradient);
  EXPECT_EQ(greedy.Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // What arrived under credit is still there; then the reason.
  EXPECT_TRUE(stream->Receive().ok());
  EXPECT_TRUE(stream->Receive().ok());
  EXPECT_EQ(stream->Receive().status().code(), absl::StatusCode::kResourceExhausted);

  // Granting absurd credit is a confused peer too.
  auto second = server->service->Expect("job-2", 7, 0, options);
  RawPeer generous(server->address);
  ASSERT_TRUE(generous.Write(Hello("job-2", 7, 1)));
  StageFrame grant;
  grant.set_credit(1u << 31);
  generous.Write(grant);
  EXPECT_EQ(generous.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  server->server->Shutdown();
}

// A sender much faster than its receiver: what either side holds stays
// bounded (the sender's Send waits, then times out), nothing is lost or
// reordered, and a message far larger than the credit window still flows.
TEST(StageLinkServiceTest, MalformedFramesEndTheStreamWithInvalidArgument) {
  auto server = StartServer();
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE(variant);
    const std::string job = absl::StrCat("bad-", variant);
    auto stream = server->service->Expect(job, 1, 0, Exchange(absl::Seconds(5)));
    RawPeer peer(server->address);
    ASSERT_TRUE(peer.Write(Hello(job, 1, 1)));
    StageFrame f;
    f.set_kind(StageFrame::GRADIENT);
    f.set_dtype(shardline::v1::DTYPE_F32);
    f.set_elements(4);
    f.set_chunk_count(2);
    f.set_payload(std::string(8, '\0'));
    if (variant == 0) f.set_dtype(shardline::v1::DTYPE_I32);        // not a wire dtype
    if (variant == 1) f.set_chunk_index(1);                          // chunk out of order
    if (variant == 2) f.set_payload(std::string(20, '\0'));          // more bytes than elements
    if (variant == 3) f.set_kind(static_cast<StageFrame::Kind>(42));  // unknown kind
    peer.Write(f);
    EXPECT_EQ(peer.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(stream->Receive().status().code(), absl::StatusCode::kInvalidArgument);
  }
  server->server->Shutdown();
}

// The hostile-client probe: job ids and epochs are sequential, so a stranger
// guessed the next job and bound a worker's downstream stage link (294
// tries, 1.9 s) and received its activations. A hello must carry the job's
// link token, which only the job's workers are told.
TEST(StageLinkServiceTest, AHelloWithoutTheJobsLinkTokenIsRefused) {
  auto server = StartServer();
  ExchangeOptions options = Exchange(absl::Seconds(5));
  options.link_token = "0123456789abcdef0123456789abcdef";
  auto stream = server->service->Expect("job-1", 7, 0, options);

  RawPeer stranger(server->address);
  stranger.Write(Hello("job-1", 7, 1));
  grpc::Status refused = stranger.Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED) << refused.error_message();
  RawPeer guesser(server->address);
  StageFrame guess = Hello("job-1", 7, 1);
  guess.mutable_hello()->set_link_token("0123456789abcdef0123456789abcdee");
  guesser.Write(guess);
  EXPECT_EQ(guesser.Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // The job's own neighbour, told the token, still connects.
  GrpcStageLinkOptions neighbour = Options(1, 2, server.get(), server.get());
  neighbour.exchange.link_token = options.link_token;
  auto link = GrpcStageLink::Create(neighbour);
  ASSERT_TRUE(link.ok()) << link.status();
  StageMessage gradient;
  gradient.kind = StageMessage::Kind::kGradient;
  gradient.step = 1;
  gradient.values = {1.0f, 2.0f};
  ASSERT_TRUE((*link)->SendToPrevious(gradient).ok());
  auto received = stream->Receive();
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->values, gradient.values);
  link->reset();
  server->server->Shutdown();
}

}  // namespace
}  // namespace shardline::worker::transport
