// GradientBuckets: gradients cut into buckets (a parameter spanning several,
// several parameters packed into one) sum exactly as one call per parameter
// would, with one collective call per bucket.
#include "worker/runtime/gradient_buckets.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/collective/in_process_collective.h"

namespace shardline::worker::runtime {
namespace {

// Three gradients of 5, 17 and 3 floats on each of two ranks, summed in
// buckets of `bucket_floats`; every rank's result and the calls it took.
void Check(size_t bucket_floats, int want_calls) {
  const std::vector<size_t> sizes = {5, 17, 3};
  auto group = collective::InProcessGroup::Create(2, absl::Seconds(10));
  ASSERT_TRUE(group.ok());
  std::vector<std::vector<float>> want(sizes.size());
  for (size_t p = 0; p < sizes.size(); ++p) {
    const auto a = testing::RandomVector(sizes[p], 10 + p), b = testing::RandomVector(sizes[p], 20 + p);
    for (size_t i = 0; i < sizes[p]; ++i) want[p].push_back(a[i] + b[i]);
  }
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto backend = testing::CpuBackend();
      auto handle = (*group)->Rank(r, *backend);
      std::vector<DeviceBuffer> buffers;
      std::vector<DeviceSpan<float>> grads;
      for (size_t p = 0; p < sizes.size(); ++p) {
        buffers.push_back(testing::Upload(*backend, testing::RandomVector(sizes[p], (r == 0 ? 10 : 20) + p)));
        grads.push_back(buffers.back().span<float>());
      }
      GradientBuckets buckets(*backend, bucket_floats * sizeof(float));
      ASSERT_TRUE(buckets.AllReduce(grads, *handle).ok());
      EXPECT_EQ(buckets.calls(), want_calls) << bucket_floats << "-float buckets";
      for (size_t p = 0; p < sizes.size(); ++p) {
        EXPECT_EQ(testing::Download(*backend, buffers[p]), want[p]) << "rank " << r << " parameter " << p;
      }
    });
  }
  for (auto& t : ranks) t.join();
}

TEST(GradientBucketsTest, BucketsOfAnySizeGiveTheSameSums) {
  Check(1 << 20, 1);  // everything in one packed bucket
  Check(8, 4);        // 25 floats: a parameter spans three buckets, others share one
  Check(17, 2);
  Check(1, 25);       // one float per call
}

TEST(GradientBucketsTest, ChunksOfABucketFitTheStagingSlots) {
  EXPECT_EQ(GradientBuckets::LargestChunkBytes(100 * sizeof(float), 3), 34 * sizeof(float));
  EXPECT_EQ(GradientBuckets::LargestChunkBytes(100 * sizeof(float), 1), 100 * sizeof(float));
}

}  // namespace
}  // namespace shardline::worker::runtime
