// GrpcCollective facing peers that misbehave on the wire: hellos for another
// group, rank or epoch; frames that are stale, out of order, of the wrong
// chunk, size or dtype, or not collective frames at all; and a peer that
// vanishes in the middle of a reduction. Each gets a clear status within the
// deadline: no hang, no crash. And a rank that leaves right after its last
// call still delivers that call's frames.
#include "worker/collective/grpc_collective.h"

#include <atomic>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/thread_state.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/collective/collective_test_util.h"
#include "tests/worker/nn/nn_test_util.h"

namespace shardline::worker::collective {
namespace {

using shardline::v1::StageFrame;
using transport::RawPeer;

StageFrame CollectiveHello(const std::string& group, int rank, int to_rank, uint64_t epoch = 7) {
  StageFrame f;
  f.mutable_hello()->set_job_id("job-1");
  f.mutable_hello()->set_plan_epoch(epoch);
  f.mutable_hello()->set_group(group);
  f.mutable_hello()->set_rank(rank);
  f.mutable_hello()->set_to_rank(to_rank);
  f.set_credit(8);
  return f;
}

StageFrame Chunk(uint64_t sequence, int chunk, const std::vector<float>& values) {
  StageFrame f;
  f.set_kind(StageFrame::COLLECTIVE);
  f.set_sequence(sequence);
  f.set_micro_batch(chunk);
  f.set_dtype(shardline::v1::DTYPE_F32);
  f.set_elements(static_cast<int64_t>(values.size()));
  f.set_chunk_count(1);
  f.set_payload(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  return f;
}

// Rank 0 of a group of two on its own server; rank 1 is played by the test.
// Its all-reduces of a few floats go in one round, or two (rounds = 2).
struct LoneRank {
  std::unique_ptr<transport::Server> server = transport::StartServer();
  std::unique_ptr<Backend> backend = worker::testing::CpuBackend();
  std::unique_ptr<GrpcCollective> rank0;
  explicit LoneRank(int rounds = 1, absl::Duration timeout = absl::Seconds(10)) {
    GrpcCollectiveOptions o;
    o.job_id = "job-1";
    o.plan_epoch = 7;
    o.group = "stage-2";
    o.rank = 0;
    o.peer_addresses = {server->address, "127.0.0.1:1"};  // rank 1 calls us; we never call it
    o.service = server->service.get();
    o.exchange = transport::Exchange(timeout);
    if (rounds == 2) o.one_round_bytes = 0;
    auto c = GrpcCollective::Create(*backend, o);
    EXPECT_TRUE(c.ok()) << c.status();
    rank0 = std::move(*c);
  }
  ~LoneRank() {
    rank0.reset();
    server->server->Shutdown();
  }
};

TEST(GrpcCollectiveTest, HellosForAnotherGroupRankOrEpochAreRefused) {
  LoneRank lone;
  RawPeer wrong_group(lone.server->address);
  wrong_group.Write(CollectiveHello("stage-3", 1, 0));
  const grpc::Status group = wrong_group.Finish();
  EXPECT_EQ(group.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(group.error_message().find("group 'stage-3'"), std::string::npos) << group.error_message();
  RawPeer wrong_rank(lone.server->address);
  wrong_rank.Write(CollectiveHello("stage-2", 2, 0));
  EXPECT_EQ(wrong_rank.Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  RawPeer stale(lone.server->address);
  stale.Write(CollectiveHello("stage-2", 1, 0, /*epoch=*/6));
  const grpc::Status epoch = stale.Finish();
  EXPECT_EQ(epoch.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(epoch.error_message().find("epoch 6"), std::string::npos) << epoch.error_message();
}

// Rank 0 all-reduces {1, 2, 3, 4} while the test, as rank 1, answers with
// `bad` after `good` correct calls. In one round a correct call is rank 1's
// whole buffer (chunk -2) {10, 20, 30, 40}; in two, chunk 0's part {10, 20}
// for the reduce-scatter, then chunk 1's sum {30, 40} for the all-gather.
absl::Status ReduceAgainst(int rounds, int good, const StageFrame& bad) {
  LoneRank lone(rounds);
  RawPeer peer(lone.server->address);
  EXPECT_TRUE(peer.Write(CollectiveHello("stage-2", 1, 0)));
  absl::Status last;
  std::thread rank0([&] {
    DeviceBuffer buffer = worker::testing::Upload(*lone.backend, std::vector<float>{1, 2, 3, 4});
    for (int call = 0; call <= good && last.ok(); ++call) last = lone.rank0->AllReduceSum(buffer.span<float>());
  });
  for (int call = 0; call < good; ++call) {
    if (rounds == 1) {
      peer.Write(Chunk(2 * call, -2, {10, 20, 30, 40}));
    } else {
      peer.Write(Chunk(2 * call, 0, {10, 20}));
      peer.Write(Chunk(2 * call + 1, 1, {30, 40}));
    }
  }
  peer.Write(bad);
  rank0.join();
  return last;
}

TEST(GrpcCollectiveTest, StaleOutOfOrderAndMismatchedFramesFailTheCall) {
  struct Case {
    const char* what;
    int good;
    StageFrame frame;
    const char* message;
  };
  for (int rounds : {1, 2}) {
    // What rank 0 expects first: the whole buffer, or chunk 0's part.
    const int chunk = rounds == 1 ? -2 : 0;
    const std::vector<float> part = rounds == 1 ? std::vector<float>{1, 2, 3, 4} : std::vector<float>{1, 2};
    std::vector<float> longer = part;
    longer.push_back(5);
    StageFrame bf16 = Chunk(0, chunk, part);
    bf16.set_dtype(shardline::v1::DTYPE_BF16);
    bf16.set_elements(static_cast<int64_t>(2 * part.size()));
    StageFrame gradient = Chunk(0, chunk, part);
    gradient.set_kind(StageFrame::GRADIENT);
    const std::string floats = absl::StrCat(longer.size(), " floats");
    const std::vector<Case> cases = {
        {"out of order", 0, Chunk(5, chunk, part), "(out of order)"},
        {"stale", 1, Chunk(0, chunk, part), "(stale)"},
        {"wrong chunk", 0, Chunk(0, 1, part), "got chunk 1"},
        {"wrong size", 0, Chunk(0, chunk, longer), floats.c_str()},
        {"wrong dtype", 0, bf16, "in bf16"},
        {"not a collective frame", 0, gradient, "a stage-link message"},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(c.what, ", ", rounds, " round(s)"));
      const absl::Status status = ReduceAgainst(rounds, c.good, c.frame);
      EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
      EXPECT_TRUE(absl::StrContains(status.message(), c.message)) << status;
      EXPECT_TRUE(absl::StrContains(status.message(), "from rank 1")) << status;
    }
  }
}

TEST(GrpcCollectiveTest, ACorrectPeerCompletesTheCalls) {
  // The frames above, when right, give the sums (the control for the test
  // above). A pair's small all-reduce is one round by default: rank 1's
  // whole buffer, and nothing more, completes it.
  for (int rounds : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(rounds, " round(s)"));
    LoneRank lone(rounds);
    RawPeer peer(lone.server->address);
    ASSERT_TRUE(peer.Write(CollectiveHello("stage-2", 1, 0)));
    DeviceBuffer buffer = worker::testing::Upload(*lone.backend, std::vector<float>{1, 2, 3, 4});
    std::thread rank0([&] { EXPECT_TRUE(lone.rank0->AllReduceSum(buffer.span<float>()).ok()); });
    if (rounds == 1) {
      peer.Write(Chunk(0, -2, {10, 20, 30, 40}));
    } else {
      peer.Write(Chunk(0, 0, {10, 20}));
      peer.Write(Chunk(1, 1, {30, 40}));
    }
    rank0.join();
    // One round: every element summed here; two: chunk 1 is rank 1's sum.
    EXPECT_EQ(worker::testing::Download(*lone.backend, buffer),
              rounds == 1 ? (std::vector<float>{11, 22, 33, 44}) : (std::vector<float>{11, 22, 30, 40}));
  }
}

// Values whose sums depend on the order they are added in.
std::vector<float> OrderSensitive(int rank, size_t n) {
  std::vector<float> v = worker::testing::RandomVector(n, 7 + rank, -1.0f, 1.0f);
  for (size_t i = 0; i < n; i += 3) v[i] *= rank % 2 ? -3e7f : 3e7f;
  return v;
}

// Larger groups: rank 0's payload bytes tell one round ((d − 1) whole
// buffers in) from two (the others' parts of its chunk, then their chunks),
// and both give every rank the same bits. A buffer past the extra bytes one
// round may cost goes in two whatever the option says.
TEST(GrpcCollectiveTest, SmallAllReducesGoInOneRoundWithTheBitsOfTwo) {
  for (int d : {3, 4}) {
    for (size_t n : {size_t{1000}, size_t{100000}}) {
      SCOPED_TRACE(absl::StrCat(d, " ranks, ", n, " floats"));
      std::map<std::string, std::vector<std::vector<float>>> sums;
      std::map<std::string, uint64_t> received;
      for (const std::string kind : {"grpc", "grpc_two_rounds"}) {
        auto ranks = testing::MakeRanks(kind, "cpu", d, absl::Seconds(30));
        ASSERT_NE(ranks, nullptr);
        sums[kind].resize(d);
        testing::RunRanks(*ranks, [&](int r, Collective& c, Backend& backend) {
          DeviceBuffer buffer = worker::testing::Upload(backend, OrderSensitive(r, n));
          ASSERT_TRUE(c.AllReduceSum(buffer.span<float>()).ok());
          sums[kind][r] = worker::testing::Download(backend, buffer);
        });
        received[kind] = ranks->handles[0]->BytesReceived();
      }
      for (int r = 0; r < d; ++r) {
        EXPECT_EQ(sums["grpc"][r], sums["grpc_two_rounds"][r]) << "rank " << r;
        EXPECT_EQ(sums["grpc"][r], sums["grpc"][0]) << "rank " << r;
      }
      const size_t own = ChunkOf(n, d, 0).size();
      const uint64_t two_rounds = ((d - 1) * own + (n - own)) * sizeof(float);
      EXPECT_EQ(received["grpc_two_rounds"], two_rounds);
      const bool one_round = (d - 1) * (d - 2) * n * sizeof(float) <= d * common::kOneRoundExtraBytes;
      EXPECT_EQ(one_round, n == 1000) << "the sizes this test picks";
      EXPECT_EQ(received["grpc"], one_round ? (d - 1) * n * sizeof(float) : two_rounds);
    }
  }
}

TEST(GrpcCollectiveTest, APeerThatVanishesMidReductionFailsTheCallPromptly) {
  auto ranks = testing::MakeRanks("grpc", "cpu", 3, absl::Seconds(60));
  ASSERT_NE(ranks, nullptr);
  // One call that every rank makes: all streams are connected. (A peer that
  // goes before it ever connected is noticed at the timeout only.)
  testing::RunRanks(*ranks, [](int, Collective& c, Backend& backend) {
    DeviceBuffer buffer = worker::testing::Upload(backend, std::vector<float>(10, 1.0f));
    EXPECT_TRUE(c.AllReduceSum(buffer.span<float>()).ok());
  });
  std::atomic<pid_t> waiter{0};
  std::atomic<bool> done{false};
  absl::Status status;
  absl::Duration took;
  std::thread rank0([&] {
    waiter = shardline::testing::CurrentThreadId();
    DeviceBuffer buffer = worker::testing::Upload(*ranks->backends[0], std::vector<float>(1000, 1.0f));
    const absl::Time start = absl::Now();
    status = ranks->handles[0]->AllReduceSum(buffer.span<float>());
    took = absl::Now() - start;
    done = true;
  });
  std::thread rank2([&] {
    DeviceBuffer buffer = worker::testing::Upload(*ranks->backends[2], std::vector<float>(1000, 1.0f));
    EXPECT_FALSE(ranks->handles[2]->AllReduceSum(buffer.span<float>()).ok());
  });
  // Rank 0 waits for rank 1, which never calls: its worker goes away.
  ASSERT_TRUE(shardline::testing::AwaitThreadBlockedOrDone(waiter, done, absl::Seconds(10)));
  ranks->handles[1].reset();
  ranks->servers[1]->server->Shutdown(std::chrono::system_clock::now());
  rank0.join();
  rank2.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "from rank 1")) << status;
  EXPECT_LT(took, absl::Seconds(30)) << "waited out the timeout instead of seeing the peer go";
}

// The root of a broadcast returns once its message is queued and leaves at
// once, while the other rank has not even started the call: the message is
// thousands of frames (1000-byte chunks), most of them still queued when
// Leave starts. Destroying the collective instead would abort the streams
// and cut them (the peer's call fails UNAVAILABLE; checked by hand). Both
// directions: the rank that leaves dialled the stream (rank 1) or serves it.
TEST(GrpcCollectiveTest, ARankThatLeavesRightAfterItsLastCallStillDeliversIt) {
  for (int root : {1, 0}) {
    SCOPED_TRACE(absl::StrCat("root ", root));
    auto ranks = testing::MakeRanks("grpc", "cpu", 2, absl::Seconds(60));
    ASSERT_NE(ranks, nullptr);
    testing::RunRanks(*ranks, [](int, Collective& c, Backend& backend) {  // both streams connected
      DeviceBuffer buffer = worker::testing::Upload(backend, std::vector<float>(10, 1.0f));
      EXPECT_TRUE(c.AllReduceSum(buffer.span<float>()).ok());
    });
    std::vector<float> values(1 << 20);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1000) + 0.5f;
    const int other = 1 - root;
    DeviceBuffer sent = worker::testing::Upload(*ranks->backends[root], values);
    DeviceBuffer received = worker::testing::Upload(*ranks->backends[other], std::vector<float>(values.size()));
    auto& leaving = static_cast<GrpcCollective&>(*ranks->handles[root]);
    ASSERT_TRUE(leaving.Broadcast(sent.span<float>(), root).ok());
    leaving.Leave();
    EXPECT_EQ(leaving.AllReduceSum(sent.span<float>()).code(), absl::StatusCode::kUnavailable);
    ranks->handles[root].reset();
    const absl::Status status = ranks->handles[other]->Broadcast(received.span<float>(), root);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(worker::testing::Download(*ranks->backends[other], received), values);
  }
}

}  // namespace
}  // namespace shardline::worker::collective
