#include "worker/backend/cpu/cpu_thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace shardline::worker::cpu {
namespace {

TEST(CpuThreadPoolTest, RunsEveryPartExactlyOnce) {
  for (int threads : {1, 2, 5}) {
    CpuThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t parts : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(parts));
      pool.Run(parts, [&](int64_t i) { seen[static_cast<size_t>(i)].fetch_add(1); });
      for (int64_t i = 0; i < parts; ++i) EXPECT_EQ(seen[i].load(), 1) << threads << " threads, part " << i;
    }
  }
}

TEST(CpuThreadPoolTest, WorkersTakeParts) {
  CpuThreadPool pool(3);
  std::atomic<int> others{0};
  const std::thread::id caller = std::this_thread::get_id();
  // Parts that wait a little, so the workers wake and take some.
  pool.Run(60, [&](int64_t) {
    if (std::this_thread::get_id() != caller) others.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  EXPECT_GT(others.load(), 0);
}

TEST(CpuThreadPoolTest, ParallelForCoversTheRangeInContiguousPieces) {
  CpuThreadPool pool(4);
  for (size_t n : {size_t{0}, size_t{5}, size_t{100}, size_t{4097}, size_t{100000}}) {
    std::vector<std::atomic<int>> seen(n);
    std::atomic<int> calls{0};
    pool.ParallelFor(n, 64, [&](size_t begin, size_t end) {
      EXPECT_LT(begin, end);
      calls.fetch_add(1);
      for (size_t i = begin; i < end; ++i) seen[i].fetch_add(1);
    });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i].load(), 1) << "n " << n << " item " << i;
    if (n < 128) {
      EXPECT_LE(calls.load(), 1) << "below two grains the caller runs it alone";
    }
    if (n >= 100000) {
      EXPECT_GT(calls.load(), 1);
    }
  }
}

TEST(CpuThreadPoolTest, ManyJobsBackToBackAndIdleGapsBetweenThem) {
  CpuThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 2000; ++job) {
    pool.Run(4, [&](int64_t i) { sum.fetch_add(i + 1); });
    // Now and then long enough for the worker to fall asleep.
    if (job % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(sum.load(), 2000 * 10);
}

}  // namespace
}  // namespace shardline::worker::cpu
