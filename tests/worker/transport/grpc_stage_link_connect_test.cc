// Stage links over gRPC on loopback, one link at a time: a slow receiver
// holds a fast sender to bounded memory; a downstream stage may connect
// first, even before the upstream one listens; what a closing stage sent last
// arrives; a dead upstream worker fails the step promptly. (Whole pipelines
// over gRPC links: grpc_stage_link_test.cc; misbehaving peers:
// stage_link_service_test.cc.)
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/transport/stage_link_test_util.h"

namespace shardline::worker::transport {
namespace {

TEST(GrpcStageLinkTest, ASlowReceiverBoundsWhatAFastSenderMayQueue) {
  auto server = StartServer();
  ExchangeOptions options = Exchange(absl::Milliseconds(300));
  options.chunk_bytes = 4096;
  options.window_frames = 2;
  options.max_waiting = 3;
  auto receiver = server->service->Expect("job-1", 7, 0, options);
  GrpcStageLinkOptions sender_options = Options(1, 2, server.get(), server.get());
  sender_options.exchange = options;
  auto sender = GrpcStageLink::Create(sender_options);
  ASSERT_TRUE(sender.ok());

  auto gradient = [](int i, size_t floats) {
    StageMessage m;
    m.kind = StageMessage::Kind::kGradient;
    m.step = i;
    m.values = std::vector<float>(floats, static_cast<float>(i));
    return m;
  };
  int sent = 0;
  absl::Status status;
  while (sent < 100 && (status = (*sender)->SendToPrevious(gradient(sent, 1000))).ok()) ++sent;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  // The receiver holds at most max_waiting messages plus a window of frames;
  // the sender queues at most max_waiting more.
  EXPECT_GE(sent, 3);
  EXPECT_LE(sent, 2 * 3 + 2);
  EXPECT_LE(receiver->peak_waiting_received(), 3u + 2u);
  for (int i = 0; i < sent; ++i) {
    auto m = receiver->Receive();
    ASSERT_TRUE(m.ok()) << "message " << i << ": " << m.status();
    EXPECT_EQ(m->step, i);
    EXPECT_EQ(m->values, gradient(i, 1000).values);
  }
  // 400 KiB in 4 KiB frames through a window of 2: the grants keep it going.
  const StageMessage large = gradient(sent, 100'000);
  ASSERT_TRUE((*sender)->SendToPrevious(large).ok());
  auto m = receiver->Receive();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->values, large.values);
  sender->reset();
  server->server->Shutdown();
}

TEST(GrpcStageLinkTest, TheDownstreamStageMayConnectBeforeTheUpstreamOneIsReady) {
  auto upstream = StartServer();
  auto own = StartServer();
  // The downstream worker got its assignment first: its link starts connecting
  // while the upstream worker has not registered the job yet (NOT_FOUND).
  auto link = GrpcStageLink::Create(Options(1, 2, own.get(), upstream.get()));
  ASSERT_TRUE(link.ok());
  // Refused twice: the link retried after a NOT_FOUND.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (upstream->service->hellos_refused() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_GE(upstream->service->hellos_refused(), 2) << "the link gave up after a NOT_FOUND";
  auto expectation = upstream->service->Expect("job-1", 7, 0, Exchange(absl::Seconds(10)));
  StageMessage activation;
  activation.kind = StageMessage::Kind::kActivation;
  activation.values = {4.0f, 5.0f};
  ASSERT_TRUE(expectation->Send(std::make_shared<StageMessage>(activation)).ok());
  auto received = (*link)->ReceiveFromPrevious();
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->values, activation.values);
  EXPECT_EQ((*link)->BytesReceived(), 2 * sizeof(float)) << "payload bytes, for the step report";
  link->reset();
  upstream->server->Shutdown();
  own->server->Shutdown();
}

// The upstream worker does not even listen yet (it is starting, or
// restarting on its port): the link waits for it (gRPC's wait_for_ready,
// reconnecting with its own backoff) and connects once it does.
TEST(GrpcStageLinkTest, TheLinkConnectsOnceAnUpstreamThatDidNotListenDoes) {
  auto own = StartServer();
  std::string address;
  {
    auto placeholder = StartServer();  // a free port, freed again
    address = placeholder->address;
    placeholder->server->Shutdown();
  }
  Server absent;
  absent.address = address;
  auto link = GrpcStageLink::Create(Options(1, 2, own.get(), &absent));
  ASSERT_TRUE(link.ok());
  absl::SleepFor(absl::Milliseconds(400));  // connections refused meanwhile
  auto upstream = StartServer(address);
  ASSERT_EQ(upstream->address, address);
  auto expectation = upstream->service->Expect("job-1", 7, 0, Exchange(absl::Seconds(10)));
  StageMessage activation;
  activation.kind = StageMessage::Kind::kActivation;
  activation.values = {1.0f, 2.0f};
  ASSERT_TRUE(expectation->Send(std::make_shared<StageMessage>(activation)).ok());
  auto received = (*link)->ReceiveFromPrevious();
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->values, activation.values);
  link->reset();
  upstream->server->Shutdown();
  own->server->Shutdown();
}

// A stage done with its last step sends its last message (the norm total)
// and closes its link at once: the upstream stage, slower to read, must still
// get every message before it sees the link closed.
TEST(GrpcStageLinkTest, WhatAStageSentBeforeClosingItsLinkStillArrives) {
  for (int round = 0; round < 5; ++round) {
    auto server = StartServer();
    ExchangeOptions options = Exchange(absl::Seconds(10));
    options.window_frames = 4096;
    auto receiver = server->service->Expect("job-1", 7, 0, options);
    GrpcStageLinkOptions sender_options = Options(1, 2, server.get(), server.get());
    sender_options.exchange = options;
    auto sender = GrpcStageLink::Create(sender_options);
    ASSERT_TRUE(sender.ok());
    constexpr int kMessages = 6;
    for (int i = 0; i < kMessages; ++i) {
      StageMessage m;
      m.kind = i + 1 == kMessages ? StageMessage::Kind::kNormTotal : StageMessage::Kind::kGradient;
      m.step = i;
      m.values = std::vector<float>(20'000, static_cast<float>(i));
      ASSERT_TRUE((*sender)->SendToPrevious(std::move(m)).ok());
    }
    sender->reset();  // the stage is done: its link closes
    for (int i = 0; i < kMessages; ++i) {
      auto m = receiver->Receive();
      ASSERT_TRUE(m.ok()) << "round " << round << ", message " << i << ": " << m.status();
      EXPECT_EQ(m->step, i);
      ASSERT_EQ(m->values.size(), 20'000u);
      EXPECT_EQ(m->values[19'999], static_cast<float>(i));
    }
    auto after = receiver->Receive();
    EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable) << after.status();
    server->server->Shutdown();
  }
}

TEST(GrpcStageLinkTest, ALostUpstreamWorkerFailsTheReceiverPromptly) {
  auto upstream = StartServer();
  auto own = StartServer();
  auto expectation = upstream->service->Expect("job-1", 7, 0, Exchange(absl::Seconds(30)));
  auto link = GrpcStageLink::Create(Options(1, 2, own.get(), upstream.get()));
  ASSERT_TRUE(link.ok());
  StageMessage hello_traffic;
  hello_traffic.kind = StageMessage::Kind::kGradient;
  ASSERT_TRUE((*link)->SendToPrevious(hello_traffic).ok());
  ASSERT_TRUE(expectation->Receive().ok());
  const auto start = std::chrono::steady_clock::now();
  std::thread kill([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    upstream->server->Shutdown(std::chrono::system_clock::now());  // the worker dies
  });
  auto received = (*link)->ReceiveFromPrevious();
  kill.join();
  EXPECT_FALSE(received.ok());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  link->reset();
  own->server->Shutdown();
}

}  // namespace
}  // namespace shardline::worker::transport
