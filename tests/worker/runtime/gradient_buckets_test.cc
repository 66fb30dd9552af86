// GradientBuckets: gradients cut into buckets (a parameter spanning several,
// several parameters packed into one) sum exactly as one call per parameter
// would, with one collective call per bucket; a bucket's sum runs on the
// reduction thread as soon as its parameters are final, before Finish; a
// failure reaches Finish and Abandon ends a step whatever is in flight.
#include "worker/runtime/gradient_buckets.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/collective/in_process_collective.h"

namespace shardline::worker::runtime {
namespace {

// A rank's handle that counts the host-memory sums it has finished.
class CountingCollective final : public collective::Collective {
 public:
  explicit CountingCollective(std::unique_ptr<collective::Collective> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduceSum(DeviceSpan<float> data) override { return inner_->AllReduceSum(data); }
  absl::Status ReduceScatterSum(DeviceSpan<float> data) override { return inner_->ReduceScatterSum(data); }
  absl::Status AllGather(DeviceSpan<float> data) override { return inner_->AllGather(data); }
  absl::Status Broadcast(DeviceSpan<float> data, int root) override { return inner_->Broadcast(data, root); }
  absl::Status AllReduceSumHost(absl::Span<float> data) override {
    absl::Status s = inner_->AllReduceSumHost(data);
    ++host_sums;
    return s;
  }
  absl::Status ReduceScatterSumHost(absl::Span<float> data) override { return inner_->ReduceScatterSumHost(data); }
  absl::Status AllGatherHost(absl::Span<float> data) override { return inner_->AllGatherHost(data); }
  void Close(const std::string& reason) override { inner_->Close(reason); }

  std::atomic<int> host_sums{0};

 private:
  std::unique_ptr<collective::Collective> inner_;
};

const std::vector<size_t> kSizes = {5, 17, 3};

// Rank r's gradients on `backend`.
std::vector<DeviceBuffer> Gradients(Backend& backend, int r) {
  std::vector<DeviceBuffer> out;
  for (size_t p = 0; p < kSizes.size(); ++p) {
    out.push_back(testing::Upload(backend, testing::RandomVector(kSizes[p], (r == 0 ? 10 : 20) + p)));
  }
  return out;
}

std::vector<DeviceSpan<float>> Spans(std::vector<DeviceBuffer>& buffers) {
  std::vector<DeviceSpan<float>> out;
  for (DeviceBuffer& b : buffers) out.push_back(b.span<float>());
  return out;
}

// Rank r of `group`: its backend, counted handle, gradients and buckets of
// `bucket_floats`.
struct RankBuckets {
  RankBuckets(collective::InProcessGroup& group, int r, size_t bucket_floats)
      : backend(testing::CpuBackend()), handle(group.Rank(r, *backend)), buffers(Gradients(*backend, r)) {
    auto created = GradientBuckets::Create(*backend, Spans(buffers), bucket_floats * sizeof(float), handle);
    EXPECT_TRUE(created.ok()) << created.status();
    if (created.ok()) buckets = std::move(*created);
  }
  std::unique_ptr<Backend> backend;
  CountingCollective handle;
  std::vector<DeviceBuffer> buffers;
  std::unique_ptr<GradientBuckets> buckets;
};

// Three gradients of 5, 17 and 3 floats on each of two ranks, summed in
// buckets of `bucket_floats` as a backward pass would start them (last
// parameter first), over two steps; every rank's result and its calls.
void Check(size_t bucket_floats, int want_buckets) {
  auto group = collective::InProcessGroup::Create(2, absl::Seconds(10));
  ASSERT_TRUE(group.ok());
  std::vector<std::vector<float>> want(kSizes.size());
  for (size_t p = 0; p < kSizes.size(); ++p) {
    const auto a = testing::RandomVector(kSizes[p], 10 + p), b = testing::RandomVector(kSizes[p], 20 + p);
    for (size_t i = 0; i < kSizes[p]; ++i) want[p].push_back(a[i] + b[i]);
  }
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      RankBuckets rank(**group, r, bucket_floats);
      ASSERT_NE(rank.buckets, nullptr);
      Backend* backend = rank.backend.get();
      CountingCollective& handle = rank.handle;
      std::vector<DeviceBuffer>& buffers = rank.buffers;
      GradientBuckets* buckets = rank.buckets.get();
      EXPECT_EQ(buckets->buckets(), want_buckets) << bucket_floats << "-float buckets";
      for (int step = 0; step < 2; ++step) {
        for (size_t p = 0; step > 0 && p < kSizes.size(); ++p) {  // the next step's gradients
          const std::vector<float> g = testing::RandomVector(kSizes[p], (r == 0 ? 10 : 20) + p);
          ASSERT_TRUE(backend->CopyToDevice(absl::Span<const float>(g), buffers[p].span<float>()).ok());
        }
        for (size_t first : {2, 1}) ASSERT_TRUE(buckets->Ready(first).ok());
        ASSERT_TRUE(buckets->Finish().ok());  // starts the rest
        EXPECT_EQ(handle.host_sums.load(), want_buckets * (step + 1));
        for (size_t p = 0; p < kSizes.size(); ++p) {
          EXPECT_EQ(testing::Download(*backend, buffers[p]), want[p]) << "rank " << r << " parameter " << p;
        }
        EXPECT_GE(buckets->reduce_seconds(), 0.0);
        EXPECT_GE(buckets->exposed_seconds(), 0.0);
      }
    });
  }
  for (auto& t : ranks) t.join();
}

TEST(GradientBucketsTest, BucketsOfAnySizeGiveTheSameSums) {
  Check(1 << 20, 1);  // everything in one bucket
  Check(8, 4);        // 25 floats: a parameter spans three buckets, others share one
  Check(17, 2);
  Check(1, 25);       // one float per call
}

// With 3-float buckets the last parameter (3 floats) is bucket 0 alone:
// once both ranks say it is final, its sum happens on the reduction thread
// while the ranks do nothing more (no Finish yet).
TEST(GradientBucketsTest, ABucketIsSummedAsSoonAsItsParametersAreFinal) {
  auto group = collective::InProcessGroup::Create(2, absl::Seconds(10));
  ASSERT_TRUE(group.ok());
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      RankBuckets rank(**group, r, 3);
      ASSERT_NE(rank.buckets, nullptr);
      ASSERT_TRUE(rank.buckets->Ready(2).ok());
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (rank.handle.host_sums.load() < 1 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
      EXPECT_EQ(rank.handle.host_sums.load(), 1) << "rank " << r << ": bucket 0 was not summed before Finish";
      ASSERT_TRUE(rank.buckets->Finish().ok());
      EXPECT_EQ(rank.handle.host_sums.load(), rank.buckets->buckets());
    });
  }
  for (auto& t : ranks) t.join();
}

// Rank 1 never comes: rank 0's started bucket waits in the group until the
// group is closed; Finish then reports the failure naming the bucket, and
// Abandon after a close returns at once instead of waiting out the timeout.
TEST(GradientBucketsTest, AFailedSumReachesFinishAndAbandonEndsTheStep) {
  auto group = collective::InProcessGroup::Create(2, absl::Seconds(60));
  ASSERT_TRUE(group.ok());
  auto backend = testing::CpuBackend();
  auto handle = (*group)->Rank(0, *backend);
  std::vector<DeviceBuffer> buffers = Gradients(*backend, 0);
  auto buckets = GradientBuckets::Create(*backend, Spans(buffers), 3 * sizeof(float), *handle);
  ASSERT_TRUE(buckets.ok());
  ASSERT_TRUE((*buckets)->Ready(2).ok());
  const auto start = std::chrono::steady_clock::now();
  handle->Close("rank 1 is gone");
  const absl::Status finished = (*buckets)->Finish();
  EXPECT_EQ(finished.code(), absl::StatusCode::kUnavailable) << finished;
  EXPECT_NE(finished.message().find("gradient bucket 0 of"), absl::string_view::npos) << finished;
  EXPECT_NE(finished.message().find("rank 1 is gone"), absl::string_view::npos) << finished;
  (*buckets)->Abandon();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(GradientBucketsTest, ChunksOfABucketFitTheStagingSlots) {
  EXPECT_EQ(GradientBuckets::LargestChunkBytes(100 * sizeof(float), 3), 34 * sizeof(float));
  EXPECT_EQ(GradientBuckets::LargestChunkBytes(100 * sizeof(float), 1), 100 * sizeof(float));
}

}  // namespace
}  // namespace shardline::worker::runtime
