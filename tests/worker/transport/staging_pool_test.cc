#include "worker/transport/staging_pool.h"

#include <atomic>
#include <cstring>
#include <thread>

#include "gtest/gtest.h"
#include "worker/transport/host_buffer.h"

namespace shardline::worker::transport {
namespace {

// Plain memory that counts what it hands out, failing after `limit` blocks.
struct CountingMemory {
  std::atomic<int> live{0};
  int limit = 1 << 30;
  HostMemory memory() {
    HostMemory m;
    m.allocate = [this](size_t bytes) -> absl::StatusOr<void*> {
      if (live >= limit) return absl::ResourceExhaustedError("no more");
      ++live;
      return PlainHostMemory().allocate(bytes);
    };
    m.release = [this](void* p) {
      --live;
      PlainHostMemory().release(p);
    };
    return m;
  }
};

TEST(StagingPoolTest, AllSlotsAreAllocatedUpFrontAndHandedOutAtMostOnce) {
  CountingMemory counting;
  auto pool = StagingPool::Create(4096, 3, counting.memory());
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(counting.live, 3);
  std::vector<StagingSlot> held;
  for (int i = 0; i < 3; ++i) {
    std::optional<StagingSlot> slot = (*pool)->TryAcquire();
    ASSERT_TRUE(slot.has_value());
    std::memset(slot->data(), i, slot->bytes());  // the whole slot is ours
    for (const StagingSlot& other : held) EXPECT_NE(other.data(), slot->data());
    held.push_back(std::move(*slot));
  }
  EXPECT_EQ((*pool)->free_slots(), 0);
  EXPECT_FALSE((*pool)->TryAcquire().has_value());
  held.pop_back();
  EXPECT_EQ((*pool)->free_slots(), 1);
  EXPECT_EQ((*pool)->peak_in_use(), 3);
  EXPECT_EQ(counting.live, 3) << "returning a slot frees nothing";
}

TEST(StagingPoolTest, ASlotReturnedOnAnotherThreadIsFreeAgain) {
  auto pool = StagingPool::Create(64, 1, PlainHostMemory());
  ASSERT_TRUE(pool.ok());
  std::optional<StagingSlot> first = (*pool)->TryAcquire();
  ASSERT_TRUE(first.has_value());
  void* const memory = first->data();
  std::thread releaser([slot = std::move(*first)]() mutable { slot = StagingSlot(); });
  releaser.join();
  std::optional<StagingSlot> second = (*pool)->TryAcquire();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->data(), memory);
}

TEST(StagingPoolTest, SlotsKeepTheirPoolAliveAndTheLastOneFreesIt) {
  CountingMemory counting;
  StagingSlot slot;
  {
    auto pool = StagingPool::Create(128, 2, counting.memory());
    ASSERT_TRUE(pool.ok());
    slot = *(*pool)->TryAcquire();
  }
  EXPECT_EQ(counting.live, 2) << "a slot is still out";
  std::memset(slot.data(), 7, slot.bytes());
  slot = StagingSlot();
  EXPECT_EQ(counting.live, 0);
}

TEST(StagingPoolTest, AFailedAllocationFreesWhatWasAllocated) {
  CountingMemory counting;
  counting.limit = 2;
  auto pool = StagingPool::Create(128, 3, counting.memory());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(counting.live, 0);
  EXPECT_EQ(StagingPool::Create(0, 3, PlainHostMemory()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StagingPool::Create(64, 0, PlainHostMemory()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostBufferTest, MovesKeepTheSlotAndCopiesLandOnTheHeap) {
  auto pool = StagingPool::Create(64 * sizeof(float), 1, PlainHostMemory());
  ASSERT_TRUE(pool.ok());
  HostBuffer staged(*(*pool)->TryAcquire(), 10);
  for (size_t i = 0; i < staged.size(); ++i) staged[i] = static_cast<float>(i);
  const float* const memory = staged.data();
  EXPECT_TRUE(staged.staged());

  HostBuffer copy = staged;
  EXPECT_FALSE(copy.staged());
  EXPECT_NE(copy.data(), memory);
  EXPECT_EQ(copy, staged);

  HostBuffer moved = std::move(staged);
  EXPECT_TRUE(moved.staged());
  EXPECT_EQ(moved.data(), memory);
  EXPECT_EQ(moved, copy);
  EXPECT_EQ((*pool)->free_slots(), 0);
  moved = HostBuffer({1.0f, 2.0f});
  EXPECT_EQ((*pool)->free_slots(), 1) << "the slot went back when the buffer let go of it";
  EXPECT_EQ(moved, HostBuffer(std::vector<float>{1.0f, 2.0f}));
}

}  // namespace
}  // namespace shardline::worker::transport
