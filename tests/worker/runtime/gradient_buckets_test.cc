// GradientBuckets: gradients cut into buckets (a parameter spanning several,
// several parameters packed into one) sum exactly as one call per parameter
// would, with one collective call per bucket; a bucket's sum runs on the
// reduction thread as soon as its parameters are final, before Finish; a
// failure reaches Finish and Abandon ends a step whatever is in flight.
// Sharded (ZeRO-1), each rank gets the sums of its own pieces, which cover
// every element once over the ranks, the norm terms of every piece, and
// every owner's pieces of the weights and of the optimizer state.
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
  absl::Status AllReduceSumHostInt8(absl::Span<float> data, absl::Span<float> residual) override {
    absl::Status s = inner_->AllReduceSumHostInt8(data, residual);
    ++int8_sums;
    return s;
  }
  void Close(const std::string& reason) override { inner_->Close(reason); }

  std::atomic<int> host_sums{0};
  std::atomic<int> int8_sums{0};

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
// `bucket_floats` (pieces of `piece` floats; sharded or not).
struct RankBuckets {
  RankBuckets(collective::InProcessGroup& group, int r, size_t bucket_floats, size_t piece = kNormPieceElements,
              bool shard = false, bool int8 = false)
      : backend(testing::CpuBackend()), handle(group.Rank(r, *backend)), buffers(Gradients(*backend, r)) {
    GradientBucketsOptions options;
    options.bucket_bytes = bucket_floats * sizeof(float);
    options.shard = shard;
    options.int8 = int8;
    options.piece_elements = piece;
    auto created = GradientBuckets::Create(*backend, Spans(buffers), handle, options);
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
void Check(size_t bucket_floats, size_t piece, int want_buckets) {
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
      RankBuckets rank(**group, r, bucket_floats, piece);
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
  Check(1 << 20, kNormPieceElements, 1);  // everything in one bucket
  Check(8, 4, 4);   // 25 floats in pieces of 4: a parameter spans three buckets, others share one
  Check(17, kNormPieceElements, 3);  // whole parameters: none fits beside another
  Check(1, 1, 25);  // one float per call
}

// Over 8-bit blocks each bucket is one …Int8 call with a residual of its
// own kept from step to step: both ranks get the same sums, each within
// the blocks' bound of the exact one, and over two steps the accumulated
// sums stay as close (the residuals carry what the blocks missed).
TEST(GradientBucketsTest, Int8BucketsGiveEveryRankTheSameSumsWithinTheBound) {
  auto group = collective::InProcessGroup::Create(2, absl::Seconds(10));
  ASSERT_TRUE(group.ok());
  std::vector<std::vector<float>> exact(kSizes.size());
  for (size_t p = 0; p < kSizes.size(); ++p) {
    const auto a = testing::RandomVector(kSizes[p], 10 + p), b = testing::RandomVector(kSizes[p], 20 + p);
    for (size_t i = 0; i < kSizes[p]; ++i) exact[p].push_back(a[i] + b[i]);
  }
  std::vector<std::vector<std::vector<float>>> accumulated(2);  // [rank][parameter]
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      RankBuckets rank(**group, r, 8, 4, false, true);
      ASSERT_NE(rank.buckets, nullptr);
      EXPECT_TRUE(rank.buckets->int8());
      for (size_t p = 0; p < kSizes.size(); ++p) accumulated[r].emplace_back(kSizes[p], 0.0f);
      for (int step = 0; step < 2; ++step) {
        for (size_t p = 0; step > 0 && p < kSizes.size(); ++p) {
          const std::vector<float> g = testing::RandomVector(kSizes[p], (r == 0 ? 10 : 20) + p);
          ASSERT_TRUE(rank.backend->CopyToDevice(absl::Span<const float>(g), rank.buffers[p].span<float>()).ok());
        }
        ASSERT_TRUE(rank.buckets->Finish().ok());
        for (size_t p = 0; p < kSizes.size(); ++p) {
          const std::vector<float> sum = testing::Download(*rank.backend, rank.buffers[p]);
          for (size_t i = 0; i < sum.size(); ++i) accumulated[r][p][i] += sum[i];
        }
      }
      EXPECT_EQ(rank.handle.int8_sums.load(), 2 * rank.buckets->buckets());
      EXPECT_EQ(rank.handle.host_sums.load(), 0) << "no f32 sums";
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(accumulated[0], accumulated[1]) << "the replicas must take the same step";
  // Inputs within ±1, sums within ±2: a rank's residual at most 1/254, the
  // sum's owner's at most 2/254.
  int inexact = 0;
  for (size_t p = 0; p < kSizes.size(); ++p) {
    for (size_t i = 0; i < kSizes[p]; ++i) {
      EXPECT_NEAR(accumulated[0][p][i], 2 * exact[p][i], 3.0 / 254) << "parameter " << p << " element " << i;
      inexact += accumulated[0][p][i] != 2 * exact[p][i];
    }
  }
  EXPECT_GT(inexact, 12) << "of 25: the sums went over 8-bit blocks";
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
  GradientBucketsOptions options;
  options.bucket_bytes = 3 * sizeof(float);
  auto buckets = GradientBuckets::Create(*backend, Spans(buffers), *handle, options);
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
  const size_t floats = 1 << 20;
  EXPECT_EQ(GradientBuckets::LargestChunkBytes(floats * sizeof(float), 4), floats / 4 * sizeof(float));
  EXPECT_EQ(GradientBuckets::LargestChunkBytes(floats * sizeof(float), 4, /*shard=*/true),
            (floats / 4 + kNormPieceElements) * sizeof(float));
  EXPECT_EQ(GradientBuckets::LargestChunkBytes(100 * sizeof(float), 1), kNormPieceElements * sizeof(float))
      << "a bucket holds at least one whole piece";
}

// Two ranks, pieces of 4 floats, buckets of 8 (parameter 1 spans three).
TEST(GradientBucketsTest, ShardedRanksSumTheirOwnPiecesAndGatherTheRest) {
  auto group = collective::InProcessGroup::Create(2, absl::Seconds(10));
  ASSERT_TRUE(group.ok());
  std::vector<std::vector<float>> sum(kSizes.size());
  for (size_t p = 0; p < kSizes.size(); ++p) {
    const auto a = testing::RandomVector(kSizes[p], 10 + p), b = testing::RandomVector(kSizes[p], 20 + p);
    for (size_t i = 0; i < kSizes[p]; ++i) sum[p].push_back(a[i] + b[i]);
  }
  // The norm terms: each 4-float piece's Σ g² in double, parameter order.
  std::vector<double> want_terms;
  for (size_t p = 0; p < kSizes.size(); ++p) {
    for (size_t k = 0; k * 4 < kSizes[p]; ++k) {
      double t = 0;
      for (size_t i = k * 4; i < std::min(kSizes[p], k * 4 + 4); ++i) t += static_cast<double>(sum[p][i]) * sum[p][i];
      want_terms.push_back(t);
    }
  }
  std::vector<std::vector<nn::Optimizer::Share>> owned(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      RankBuckets rank(**group, r, 8, 4, /*shard=*/true);
      ASSERT_NE(rank.buckets, nullptr);
      GradientBuckets& buckets = *rank.buckets;
      ASSERT_TRUE(buckets.sharded());
      owned[r] = buckets.owned();
      ASSERT_TRUE(buckets.Finish().ok());
      for (size_t p = 0; p < kSizes.size(); ++p) {
        const std::vector<float> got = testing::Download(*rank.backend, rank.buffers[p]);
        for (const nn::Optimizer::Range& run : owned[r][p]) {
          for (size_t i = run.begin; i < run.end; ++i) {
            EXPECT_EQ(got[i], sum[p][i]) << "rank " << r << " parameter " << p << " element " << i;
          }
        }
      }
      auto terms = buckets.GatheredSumsOfSquares();
      ASSERT_TRUE(terms.ok()) << terms.status();
      EXPECT_EQ(*terms, want_terms) << "rank " << r;
      // Weights: each rank writes 100·r + i into its own elements; after the
      // gather every rank holds every owner's.
      std::vector<DeviceBuffer> values;
      std::vector<DeviceSpan<float>> value_spans;
      std::vector<DeviceBuffer> state;
      std::vector<DeviceSpan<const float>> state_spans;
      for (size_t p = 0; p < kSizes.size(); ++p) {
        std::vector<float> v(kSizes[p], -1.0f), s;
        for (const nn::Optimizer::Range& run : owned[r][p]) {
          for (size_t i = run.begin; i < run.end; ++i) {
            v[i] = static_cast<float>(100 * r + i);
            s.push_back(static_cast<float>(1000 * r + i));
          }
        }
        values.push_back(testing::Upload(*rank.backend, v));
        value_spans.push_back(values.back().span<float>());
        state.push_back(s.empty() ? DeviceBuffer() : testing::Upload(*rank.backend, s));
        state_spans.push_back(DeviceSpan<const float>(state.back().span<float>()));
      }
      ASSERT_TRUE(buckets.GatherParameters(value_spans).ok());
      auto whole_state = buckets.GatherState(state_spans);
      ASSERT_TRUE(whole_state.ok()) << whole_state.status();
      for (size_t p = 0; p < kSizes.size(); ++p) {
        const std::vector<float> got = testing::Download(*rank.backend, values[p]);
        for (size_t i = 0; i < kSizes[p]; ++i) {
          EXPECT_TRUE(got[i] == static_cast<float>(i) || got[i] == static_cast<float>(100 + i))
              << "rank " << r << " parameter " << p << " element " << i << ": " << got[i];
          EXPECT_EQ((*whole_state)[p][i] - 1000 * (got[i] >= 100 ? 1 : 0), static_cast<float>(i));
        }
      }
    });
  }
  for (auto& t : ranks) t.join();
  // Over the ranks, every element is owned exactly once; parameter 1 (17
  // floats over three buckets) has more than one run on some rank.
  size_t runs_of_1 = 0;
  for (size_t p = 0; p < kSizes.size(); ++p) {
    std::vector<int> owners(kSizes[p], 0);
    for (int r = 0; r < 2; ++r) {
      for (const nn::Optimizer::Range& run : owned[r][p]) {
        for (size_t i = run.begin; i < run.end; ++i) ++owners[i];
        if (p == 1) ++runs_of_1;
      }
    }
    EXPECT_EQ(owners, std::vector<int>(kSizes[p], 1)) << "parameter " << p;
  }
  EXPECT_GT(runs_of_1, 2u);
}

}  // namespace
}  // namespace shardline::worker::runtime
