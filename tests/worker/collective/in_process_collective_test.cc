// The in-process collective: each operation's result for 1 to 4 ranks (ranks
// as threads, each with a backend of its own, on every backend built), sums
// added in rank order whatever the timing, chunks that cover the buffer, and
// the failures: calls that do not match, a rank that never comes, a rank
// that closes the group while the others wait, a bad root.
#include "worker/collective/in_process_collective.h"

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/thread_state.h"
#include "tests/worker/backend/backend_test_util.h"

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

class InProcessCollectiveTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() != "cpu" && CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
  // Runs `body(rank, collective, backend)` on `ranks` threads of one group.
  void RunRanks(int ranks, const std::function<void(int, Collective&, Backend&)>& body,
                absl::Duration timeout = absl::Seconds(30)) {
    auto group = InProcessGroup::Create(ranks, timeout);
    ASSERT_TRUE(group.ok()) << group.status();
    std::vector<std::unique_ptr<Backend>> backends;
    std::vector<std::unique_ptr<Collective>> handles;
    for (int r = 0; r < ranks; ++r) {
      auto backend = CreateBackend(GetParam(), {1});
      ASSERT_TRUE(backend.ok()) << backend.status();
      backends.push_back(std::move(*backend));
      handles.push_back((*group)->Rank(r, *backends.back()));
    }
    std::vector<std::thread> threads;
    // Started last-rank-first, so the ranks arrive in another order than theirs.
    for (int r = ranks - 1; r >= 0; --r) {
      threads.emplace_back([&, r] { body(r, *handles[r], *backends[r]); });
    }
    for (auto& t : threads) t.join();
  }
};

// Rank r's input: values whose sums depend on the order they are added in.
std::vector<float> Input(int rank, size_t n) {
  std::vector<float> v = testing::RandomVector(n, 100 + rank, -1.0f, 1.0f);
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

TEST_P(InProcessCollectiveTest, AllReduceSumAddsInRankOrderOnEveryRank) {
  for (int d : {1, 2, 3, 4}) {
    for (size_t n : {1, 5, 1000}) {
      SCOPED_TRACE(absl::StrCat(d, " ranks, ", n, " floats"));
      const std::vector<float> want = RankOrderSum(d, n);
      RunRanks(d, [&](int r, Collective& c, Backend& backend) {
        EXPECT_EQ(c.rank(), r);
        EXPECT_EQ(c.size(), d);
        DeviceBuffer buffer = testing::Upload(backend, Input(r, n));
        for (int repeat = 0; repeat < 3; ++repeat) {  // the same bits every time
          ASSERT_TRUE(backend.CopyToDevice(absl::Span<const float>(Input(r, n)), buffer.span<float>()).ok());
          ASSERT_TRUE(c.AllReduceSum(buffer.span<float>()).ok());
          EXPECT_EQ(testing::Download(backend, buffer), want) << "rank " << r;
        }
      });
    }
  }
}

TEST_P(InProcessCollectiveTest, ReduceScatterSumLeavesEachRankItsChunkOfTheSum) {
  const size_t n = 103;
  const int d = 3;
  const std::vector<float> sum = RankOrderSum(d, n);
  RunRanks(d, [&](int r, Collective& c, Backend& backend) {
    DeviceBuffer buffer = testing::Upload(backend, Input(r, n));
    ASSERT_TRUE(c.ReduceScatterSum(buffer.span<float>()).ok());
    std::vector<float> want = Input(r, n);  // the other chunks are the rank's own
    const Chunk own = ChunkOf(n, d, r);
    std::copy(sum.begin() + own.begin, sum.begin() + own.end, want.begin() + own.begin);
    EXPECT_EQ(testing::Download(backend, buffer), want) << "rank " << r;
  });
}

TEST_P(InProcessCollectiveTest, AllGatherGivesEveryRankEachOwnersChunk) {
  const size_t n = 10;
  const int d = 4;
  std::vector<float> want(n);
  for (int r = 0; r < d; ++r) {
    const Chunk c = ChunkOf(n, d, r);
    const std::vector<float> x = Input(r, n);
    std::copy(x.begin() + c.begin, x.begin() + c.end, want.begin() + c.begin);
  }
  RunRanks(d, [&](int r, Collective& c, Backend& backend) {
    DeviceBuffer buffer = testing::Upload(backend, Input(r, n));
    ASSERT_TRUE(c.AllGather(buffer.span<float>()).ok());
    EXPECT_EQ(testing::Download(backend, buffer), want) << "rank " << r;
  });
}

TEST_P(InProcessCollectiveTest, ReduceScatterThenAllGatherIsAllReduce) {
  const size_t n = 1001;
  const int d = 4;
  const std::vector<float> want = RankOrderSum(d, n);
  RunRanks(d, [&](int r, Collective& c, Backend& backend) {
    DeviceBuffer buffer = testing::Upload(backend, Input(r, n));
    ASSERT_TRUE(c.ReduceScatterSum(buffer.span<float>()).ok());
    ASSERT_TRUE(c.AllGather(buffer.span<float>()).ok());
    EXPECT_EQ(testing::Download(backend, buffer), want) << "rank " << r;
  });
}

TEST_P(InProcessCollectiveTest, BroadcastCopiesTheRootsBuffer) {
  RunRanks(3, [&](int r, Collective& c, Backend& backend) {
    DeviceBuffer buffer = testing::Upload(backend, Input(r, 50));
    ASSERT_TRUE(c.Broadcast(buffer.span<float>(), 2).ok());
    EXPECT_EQ(testing::Download(backend, buffer), Input(2, 50)) << "rank " << r;
    EXPECT_EQ(c.Broadcast(buffer.span<float>(), 3).code(), absl::StatusCode::kInvalidArgument);
  });
}

TEST_P(InProcessCollectiveTest, CallsThatDoNotMatchFailOnEveryRankAndCloseTheGroup) {
  RunRanks(2, [&](int r, Collective& c, Backend& backend) {
    DeviceBuffer buffer = testing::Upload(backend, Input(r, r == 0 ? 8 : 9));
    const absl::Status status = c.AllReduceSum(buffer.span<float>());
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(status.message().find("8 floats"), std::string::npos) << status;
    EXPECT_NE(status.message().find("9 floats"), std::string::npos) << status;
    // The ranks are out of step now: the next call fails at once.
    EXPECT_EQ(c.AllReduceSum(buffer.span<float>()).code(), absl::StatusCode::kUnavailable);
  });
  RunRanks(2, [&](int r, Collective& c, Backend& backend) {
    DeviceBuffer buffer = testing::Upload(backend, Input(r, 8));
    const absl::Status status = r == 0 ? c.AllReduceSum(buffer.span<float>()) : c.AllGather(buffer.span<float>());
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(status.message().find("AllGather"), std::string::npos) << status;
  });
}

TEST_P(InProcessCollectiveTest, ARankThatNeverComesFailsTheOthersNamingIt) {
  RunRanks(
      3,
      [&](int r, Collective& c, Backend& backend) {
        if (r == 1) return;  // this rank's thread skips the call
        DeviceBuffer buffer = testing::Upload(backend, Input(r, 4));
        const absl::Status status = c.AllReduceSum(buffer.span<float>());
        EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
        EXPECT_NE(status.message().find("rank(s) 1 did not join"), std::string::npos) << status;
      },
      absl::Milliseconds(200));
}

TEST_P(InProcessCollectiveTest, CloseWakesTheRanksThatWait) {
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
    DeviceBuffer buffer = testing::Upload(backend, Input(r, 4));
    const absl::Status status = c.AllReduceSum(buffer.span<float>());
    waiter_done = true;
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_EQ(status.message(), "replica 1 failed its step");
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, InProcessCollectiveTest, ::testing::ValuesIn(testing::BackendsUnderTest()),
                         testing::BackendTestName);

TEST(InProcessGroupTest, BadGroupsAreInvalidArguments) {
  EXPECT_EQ(InProcessGroup::Create(0, absl::Seconds(1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InProcessGroup::Create(2, absl::ZeroDuration()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardline::worker::collective
