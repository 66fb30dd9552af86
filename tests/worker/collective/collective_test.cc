// Both collectives, the in-process group and GrpcCollective over real gRPC
// streams on loopback, on every backend built: each operation's result for 1
// to 4 ranks (ranks as threads, each with a backend of its own), every sum
// added in rank order whatever the timing, chunks that cover the buffer, and
// the failures: calls that do not match, a rank that never comes, a rank
// that closes the group while the others wait, a bad root. (Peers that
// misbehave on the wire: grpc_collective_test.cc.)

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "tests/testing/thread_state.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/collective/collective_test_util.h"

namespace shardline::worker::collective {
namespace {

TEST(ChunkOfTest, ChunksCoverTheBufferInOrderAndDifferByAtMostOne) {
  for (size_t n : {0, 1, 5, 7, 1000, 1001}) {
    for (int d : {1, 2, 3, 4, 7}) {
      size_t next = 0;
      for (int r = 0; r < d; ++r) {
        const Chunk c = ChunkOf(n, d, r);
        EXPECT_EQ(c.begin, next) << n << "/" << d << " chunk " << r;
        EXPECT_EQ(c.begin, n * r / d);
        EXPECT_TRUE(c.size() == n / d || c.size() == n / d + 1) << n << "/" << d << " chunk " << r;
        next = c.end;
      }
      EXPECT_EQ(next, n);
    }
  }
  const size_t huge = (size_t{1} << 62) + 3;  // n · r would overflow
  EXPECT_EQ(ChunkOf(huge, 3, 3 - 1).end, huge);
}

TEST(AddInRankOrderTest, AddsLeftToRightInFloat) {
  // In float, (1e8 + 1) − 1e8 is 0 (1e8 + 1 rounds to 1e8), while 1e8 − 1e8
  // + 1 is 1: the order shows.
  const std::vector<float> a = {1e8f, 1.0f}, b = {1.0f, 2.0f}, c = {-1e8f, 3.0f};
  std::vector<float> out(2);
  const float* parts[] = {a.data(), b.data(), c.data()};
  AddInRankOrder(parts, absl::Span<float>(out));
  EXPECT_EQ(out, (std::vector<float>{0.0f, 6.0f}));
  const float* other_order[] = {a.data(), c.data(), b.data()};
  AddInRankOrder(other_order, absl::Span<float>(out));
  EXPECT_EQ(out[0], 1.0f);
}

struct Param {
  std::string kind;    // "inprocess", "grpc" or "grpc_two_rounds"
  std::string device;  // "cpu", "cuda:0"
};

class CollectiveTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (GetParam().device != "cpu" && CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
  bool grpc() const { return GetParam().kind != "inprocess"; }
  // Runs `body(rank, collective, backend)` on `ranks` threads of one group.
  void RunRanks(int ranks, const std::function<void(int, Collective&, Backend&)>& body,
                absl::Duration timeout = absl::Seconds(30)) {
    auto group = testing::MakeRanks(GetParam().kind, GetParam().device, ranks, timeout);
    ASSERT_NE(group, nullptr);
    testing::RunRanks(*group, body);
  }
};

// Rank r's input: values whose sums depend on the order they are added in.
std::vector<float> Input(int rank, size_t n) {
  std::vector<float> v = worker::testing::RandomVector(n, 100 + rank, -1.0f, 1.0f);
  for (size_t i = 0; i < n; i += 3) v[i] *= rank % 2 ? -3e7f : 3e7f;
  return v;
}

std::vector<float> RankOrderSum(int ranks, size_t n) {
  std::vector<float> sum = Input(0, n);
  for (int r = 1; r < ranks; ++r) {
    const std::vector<float> x = Input(r, n);
    for (size_t i = 0; i < n; ++i) sum[i] += x[i];
  }
  return sum;
}

TEST_P(CollectiveTest, AllReduceSumAddsInRankOrderOnEveryRank) {
  for (int d : {1, 2, 3, 4}) {
    for (size_t n : {1, 5, 1000, 100000}) {  // gRPC: all in one round, the last in two for d > 2
      SCOPED_TRACE(absl::StrCat(d, " ranks, ", n, " floats"));
      const std::vector<float> want = RankOrderSum(d, n);
      RunRanks(d, [&](int r, Collective& c, Backend& backend) {
        EXPECT_EQ(c.rank(), r);
        EXPECT_EQ(c.size(), d);
        DeviceBuffer buffer = worker::testing::Upload(backend, Input(r, n));
        for (int repeat = 0; repeat < 3; ++repeat) {  // the same bits every time
          ASSERT_TRUE(backend.CopyToDevice(absl::Span<const float>(Input(r, n)), buffer.span<float>()).ok());
          ASSERT_TRUE(c.AllReduceSum(buffer.span<float>()).ok());
          EXPECT_EQ(worker::testing::Download(backend, buffer), want) << "rank " << r;
        }
      });
    }
  }
}

TEST_P(CollectiveTest, ReduceScatterSumLeavesEachRankItsChunkOfTheSum) {
  const size_t n = 103;
  const int d = 3;
  const std::vector<float> sum = RankOrderSum(d, n);
  RunRanks(d, [&](int r, Collective& c, Backend& backend) {
    DeviceBuffer buffer = worker::testing::Upload(backend, Input(r, n));
    ASSERT_TRUE(c.ReduceScatterSum(buffer.span<float>()).ok());
    std::vector<float> want = Input(r, n);  // the other chunks are the rank's own
    const Chunk own = ChunkOf(n, d, r);
    std::copy(sum.begin() + own.begin, sum.begin() + own.end, want.begin() + own.begin);
    EXPECT_EQ(worker::testing::Download(backend, buffer), want) << "rank " << r;
  });
}

TEST_P(CollectiveTest, AllGatherGivesEveryRankEachOwnersChunk) {
  const size_t n = 10;
  const int d = 4;
  std::vector<float> want(n);
  for (int r = 0; r < d; ++r) {
    const Chunk c = ChunkOf(n, d, r);
    const std::vector<float> x = Input(r, n);
    std::copy(x.begin() + c.begin, x.begin() + c.end, want.begin() + c.begin);
  }
  RunRanks(d, [&](int r, Collective& c, Backend& backend) {
    DeviceBuffer buffer = worker::testing::Upload(backend, Input(r, n));
    ASSERT_TRUE(c.AllGather(buffer.span<float>()).ok());
    EXPECT_EQ(worker::testing::Download(backend, buffer), want) << "rank " << r;
  });
}

TEST_P(CollectiveTest, ReduceScatterThenAllGatherIsAllReduce) {
  const size_t n = 1001;
  const int d = 4;
  const std::vector<float> want = RankOrderSum(d, n);
  RunRanks(d, [&](int r, Collective& c, Backend& backend) {
    DeviceBuffer buffer = worker::testing::Upload(backend, Input(r, n));
    ASSERT_TRUE(c.ReduceScatterSum(buffer.span<float>()).ok());
    ASSERT_TRUE(c.AllGather(buffer.span<float>()).ok());
    EXPECT_EQ(worker::testing::Download(backend, buffer), want) << "rank " << r;
  });
}

// The host-memory calls compute the same bits, and meet the device calls of
// the same operation (the ranks' memory is their own business).
TEST_P(CollectiveTest, HostMemoryCallsGiveTheDeviceCallsBits) {
  const size_t n = 1001;
  const int d = 3;
  const std::vector<float> want = RankOrderSum(d, n);
  RunRanks(d, [&](int r, Collective& c, Backend& backend) {
    std::vector<float> host = Input(r, n);
    ASSERT_TRUE(c.AllReduceSumHost(absl::Span<float>(host)).ok());
    EXPECT_EQ(host, want) << "rank " << r;
    host = Input(r, n);
    ASSERT_TRUE(c.ReduceScatterSumHost(absl::Span<float>(host)).ok());
    const Chunk own = ChunkOf(n, d, r);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(host[i], i >= own.begin && i < own.end ? want[i] : Input(r, n)[i]) << "rank " << r << " float " << i;
    }
    ASSERT_TRUE(c.AllGatherHost(absl::Span<float>(host)).ok());
    EXPECT_EQ(host, want) << "rank " << r;
    // Rank 0 on the host, the others on their devices.
    DeviceBuffer buffer = worker::testing::Upload(backend, Input(r, n));
    host = Input(r, n);
    ASSERT_TRUE((r == 0 ? c.AllReduceSumHost(absl::Span<float>(host)) : c.AllReduceSum(buffer.span<float>())).ok());
    EXPECT_EQ(r == 0 ? host : worker::testing::Download(backend, buffer), want) << "rank " << r;
  });
}

// A group of d ranks each standing for k ranks of a larger group (k parts
// each) sums with the bits of the d·k ranks' sum: rank r's parts are the
// larger group's ranks r·k … r·k + k − 1, added in that order.
TEST_P(CollectiveTest, RanksWithSeveralPartsSumWithTheLargerGroupsBits) {
  const size_t n = 1001;
  for (auto [d, k] : {std::pair{1, 2}, {1, 3}, {2, 2}, {3, 2}, {2, 3}, {2, 8}, {1, 12}}) {
    SCOPED_TRACE(absl::StrCat(d, " ranks of ", k, " parts"));
    const std::vector<float> want = RankOrderSum(d * k, n);
    ASSERT_NE(want, RankOrderSum(d, n));
    RunRanks(d, [&](int r, Collective& c, Backend&) {
      std::vector<std::vector<float>> parts;
      std::vector<const float*> held;
      for (int h = 0; h + 1 < k; ++h) parts.push_back(Input(r * k + h, n));
      for (const auto& part : parts) held.push_back(part.data());
      std::vector<float> data = Input(r * k + k - 1, n);
      ASSERT_TRUE(c.AllReduceSumHostParts(absl::Span<float>(data), held).ok());
      EXPECT_EQ(data, want) << "rank " << r;
      EXPECT_EQ(parts[0], Input(r * k, n)) << "held parts are read only";
      data = Input(r * k + k - 1, n);
      ASSERT_TRUE(c.ReduceScatterSumHostParts(absl::Span<float>(data), held).ok());
      const Chunk own = ChunkOf(n, d, r);
      for (size_t i = own.begin; i < own.end; ++i) ASSERT_EQ(data[i], want[i]) << "rank " << r << " float " << i;
      // No parts held: the plain sum.
      data = Input(r, n);
      ASSERT_TRUE(c.AllReduceSumHostParts(absl::Span<float>(data), {}).ok());
      EXPECT_EQ(data, RankOrderSum(d, n));
      if (grpc() && d > 1) {  // every rank sends its parts before it receives: the queues bound them
        const std::vector<const float*> too_many(common::kMaxReplicaGroups, parts[0].data());
        EXPECT_EQ(c.AllReduceSumHostParts(absl::Span<float>(data), too_many).code(),
                  absl::StatusCode::kInvalidArgument);
      }
    });
  }
}

TEST_P(CollectiveTest, BroadcastCopiesTheRootsBuffer) {
  RunRanks(3, [&](int r, Collective& c, Backend& backend) {
    DeviceBuffer buffer = worker::testing::Upload(backend, Input(r, 50));
    ASSERT_TRUE(c.Broadcast(buffer.span<float>(), 2).ok());
    EXPECT_EQ(worker::testing::Download(backend, buffer), Input(2, 50)) << "rank " << r;
    EXPECT_EQ(c.Broadcast(buffer.span<float>(), 3).code(), absl::StatusCode::kInvalidArgument);
  });
}

TEST_P(CollectiveTest, CallsThatDoNotMatchFailEveryRankAndCloseTheGroup) {
  // Different sizes: the in-process group compares the calls and fails
  // every rank with FAILED_PRECONDITION; over gRPC the rank that receives a
  // chunk of the wrong size does, and its closed streams fail the other.
  std::atomic<int> mismatches{0};
  RunRanks(2, [&](int r, Collective& c, Backend& backend) {
    DeviceBuffer buffer = worker::testing::Upload(backend, Input(r, r == 0 ? 8 : 9));
    const absl::Status status = c.AllReduceSum(buffer.span<float>());
    EXPECT_FALSE(status.ok());
    if (status.code() == absl::StatusCode::kFailedPrecondition) {
      ++mismatches;
      const bool chunks = absl::StrContains(status.message(), "4 floats") && absl::StrContains(status.message(), "5 floats");
      const bool calls = absl::StrContains(status.message(), "8 floats") && absl::StrContains(status.message(), "9 floats");
      EXPECT_TRUE(chunks || calls) << status;
    }
    // The ranks are out of step now: the next call fails at once.
    EXPECT_FALSE(c.AllReduceSum(buffer.span<float>()).ok());
  });
  EXPECT_GE(mismatches.load(), grpc() ? 1 : 2);
  mismatches = 0;
  RunRanks(2, [&](int r, Collective& c, Backend& backend) {
    DeviceBuffer buffer = worker::testing::Upload(backend, Input(r, 8));
    const absl::Status status = r == 0 ? c.AllReduceSum(buffer.span<float>()) : c.Broadcast(buffer.span<float>(), 0);
    EXPECT_FALSE(status.ok());
    mismatches += status.code() == absl::StatusCode::kFailedPrecondition;
  });
  EXPECT_GE(mismatches.load(), 1);
}

TEST_P(CollectiveTest, ARankThatNeverComesFailsTheOthersNamingIt) {
  RunRanks(
      3,
      [&](int r, Collective& c, Backend& backend) {
        if (r == 1) return;  // this rank's thread skips the call
        DeviceBuffer buffer = worker::testing::Upload(backend, Input(r, 4));
        const absl::Status status = c.AllReduceSum(buffer.span<float>());
        EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
        EXPECT_TRUE(absl::StrContains(status.message(), grpc() ? "from rank 1 " : "rank(s) 1 did not join")) << status;
      },
      absl::Milliseconds(grpc() ? 1000 : 200));
}

TEST_P(CollectiveTest, CloseWakesTheRanksThatWait) {
  std::atomic<pid_t> waiter{0};
  std::atomic<bool> waiter_done{false};
  RunRanks(2, [&](int r, Collective& c, Backend& backend) {
    if (r == 1) {
      // Rank 0 is waiting for this one (timeout 30 s): closing fails it now.
      ASSERT_TRUE(shardline::testing::AwaitThreadBlockedOrDone(waiter, waiter_done, absl::Seconds(10)));
      c.Close("replica 1 failed its step");
      return;
    }
    waiter = shardline::testing::CurrentThreadId();
    DeviceBuffer buffer = worker::testing::Upload(backend, Input(r, 4));
    const absl::Time start = absl::Now();
    const absl::Status status = c.AllReduceSum(buffer.span<float>());
    waiter_done = true;
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "woken by the close, not by the timeout";
    if (!grpc()) {
      EXPECT_EQ(status.message(), "replica 1 failed its step");
    }
  });
}

std::vector<Param> Params() {
  std::vector<Param> out;
  for (const char* kind : {"inprocess", "grpc", "grpc_two_rounds"}) {
    for (const std::string& device : worker::testing::BackendsUnderTest()) out.push_back({kind, device});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Collectives, CollectiveTest, ::testing::ValuesIn(Params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return absl::StrCat(info.param.kind, "_", info.param.device == "cpu" ? "cpu" : "cuda0");
                         });

TEST(InProcessGroupTest, BadGroupsAreInvalidArguments) {
  EXPECT_EQ(InProcessGroup::Create(0, absl::Seconds(1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InProcessGroup::Create(2, absl::ZeroDuration()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardline::worker::collective
