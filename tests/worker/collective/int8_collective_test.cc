// Sums over 8-bit blocks with error feedback (Collective::…Int8), for the
// in-process group and GrpcCollective over real gRPC streams: the residual
// arithmetic, every rank ending with the same values, the gRPC wire giving
// the in-process bits at about a quarter of the bytes, and the point of it
// all: over 100 steps the accumulated sum stays within a fixed bound of the
// exact one, where the same quantization without feedback drifts away.
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/int8_blocks.h"
#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/collective/collective_test_util.h"
#include "worker/collective/error_feedback.h"

namespace shardline::worker::collective {
namespace {

TEST(QuantizeWithFeedbackTest, KeepsWhatTheBlocksMissAndTheBlocksDecodeToTheValues) {
  std::vector<float> values = worker::testing::RandomVector(150, 3, -2.0f, 2.0f);
  std::vector<float> residual = worker::testing::RandomVector(150, 4, -0.01f, 0.01f);
  std::vector<float> meant(150);
  for (size_t i = 0; i < 150; ++i) meant[i] = values[i] + residual[i];
  std::vector<char> blocks(common::Int8BlocksBytes(150));
  QuantizeWithFeedback(absl::MakeSpan(values), absl::MakeSpan(residual), absl::MakeSpan(blocks));
  std::vector<float> decoded(150);
  ASSERT_TRUE(common::DecodeInt8Blocks(blocks, absl::MakeSpan(decoded)).ok());
  EXPECT_EQ(values, decoded) << "the values are what a receiver decodes";
  for (size_t b = 0; b < 150; b += common::kInt8BlockValues) {
    float largest = 0;
    const size_t end = std::min<size_t>(150, b + common::kInt8BlockValues);
    for (size_t i = b; i < end; ++i) largest = std::max(largest, std::fabs(meant[i]));
    for (size_t i = b; i < end; ++i) {
      EXPECT_EQ(residual[i], meant[i] - values[i]) << i;
      EXPECT_LE(std::fabs(residual[i]), largest / 254 * 1.0001f) << i;
    }
  }
}

TEST(QuantizeWithFeedbackTest, ANonFiniteBlockDecodesAsNanAndLeavesNoResidual) {
  std::vector<float> values(130, 0.5f), residual(130, 0.001f);
  values[70] = std::numeric_limits<float>::infinity();
  std::vector<char> blocks(common::Int8BlocksBytes(130));
  QuantizeWithFeedback(absl::MakeSpan(values), absl::MakeSpan(residual), absl::MakeSpan(blocks));
  for (size_t i = 64; i < 128; ++i) {
    EXPECT_TRUE(std::isnan(values[i])) << i;
    EXPECT_EQ(residual[i], 0.0f) << "a skipped step must not poison the next ones: " << i;
  }
  EXPECT_FALSE(std::isnan(values[0]));
  EXPECT_FALSE(std::isnan(values[129]));
}

struct Param {
  std::string kind;  // "inprocess" or "grpc"
};

class Int8CollectiveTest : public ::testing::TestWithParam<Param> {
 protected:
  std::unique_ptr<testing::Ranks> MakeRanks(int ranks) {
    return testing::MakeRanks(GetParam().kind, "cpu", ranks, absl::Seconds(30));
  }
};

constexpr size_t kFloats = 1000;  // 16 blocks, the last one short; chunks cut blocks
constexpr int kSteps = 100;

// Rank r's gradient at `step`: each 64-value block holds one value of
// magnitude 1 and many small ones with a steady bias of 1e-3, below half a
// block's scale (1/254): quantized alone, the bias is lost at every step.
std::vector<float> Gradient(int rank, int step) {
  std::vector<float> g = worker::testing::RandomVector(kFloats, 1000 * rank + step, -5e-4f, 5e-4f);
  for (size_t i = 0; i < kFloats; ++i) g[i] += i % common::kInt8BlockValues == 7 ? (rank % 2 ? -1.0f : 1.0f) : 1e-3f;
  return g;
}

// Runs kSteps all-reduces (or, `scatter`, reduce-scatters) of Gradient()
// over `d` ranks, each rank keeping its residual (or, without `feedback`,
// zeroing it before every call), and returns the largest error of the
// accumulated sum, Σ steps, against the exact one after each step, over
// the elements each rank holds the sum of; every rank's sums must agree.
std::vector<double> AccumulatedErrors(testing::Ranks& ranks, bool scatter, bool feedback) {
  const int d = static_cast<int>(ranks.handles.size());
  std::vector<double> exact(kFloats, 0.0);
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < d; ++r) {
      const std::vector<float> g = Gradient(r, step);
      for (size_t i = 0; i < kFloats; ++i) exact[i] += g[i];
    }
  }
  std::vector<double> worst(kSteps, 0.0);
  std::vector<std::vector<std::vector<float>>> results(d);  // [rank][step]
  testing::RunRanks(ranks, [&](int r, Collective& c, Backend&) {
    std::vector<float> residual(kFloats, 0.0f);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<float> data = Gradient(r, step);
      if (!feedback) std::fill(residual.begin(), residual.end(), 0.0f);
      const absl::Status s = scatter ? c.ReduceScatterSumHostInt8(absl::MakeSpan(data), absl::MakeSpan(residual))
                                     : c.AllReduceSumHostInt8(absl::MakeSpan(data), absl::MakeSpan(residual));
      ASSERT_TRUE(s.ok()) << s;
      results[r].push_back(std::move(data));
    }
  });
  for (int r = 0; r < d; ++r) {
    if (results[r].size() != static_cast<size_t>(kSteps)) return {};
    const Chunk held = scatter ? ChunkOf(kFloats, d, r) : Chunk{0, kFloats};
    std::vector<double> accumulated(kFloats, 0.0), exact_so_far(kFloats, 0.0);
    for (int step = 0; step < kSteps; ++step) {
      for (int q = 0; q < d; ++q) {
        const std::vector<float> g = Gradient(q, step);
        for (size_t i = 0; i < kFloats; ++i) exact_so_far[i] += g[i];
      }
      for (size_t i = held.begin; i < held.end; ++i) {
        accumulated[i] += results[r][step][i];
        worst[step] = std::max(worst[step], std::fabs(accumulated[i] - exact_so_far[i]));
        if (!scatter) {
          EXPECT_EQ(results[r][step][i], results[0][step][i]) << "rank " << r << " step " << step;
        }
      }
    }
  }
  return worst;
}

// With feedback the error of the accumulated sum is what the last residuals
// hold: each rank's part at most half a block's scale, and its owner's
// residual of the sum, so at most about (2d − 1) / 254 of the blocks'
// largest value (1, and d for the sums), at step 10 as at step 100. Without
// feedback the bias below half a scale is lost every step: the error grows
// by about d · 1e-3 a step.
TEST_P(Int8CollectiveTest, TheAccumulatedSumStaysWithinABoundOverAHundredSteps) {
  const int d = 3;
  const double bound = (2.0 * d - 1) * 1.1 / 254;
  for (bool scatter : {false, true}) {
    SCOPED_TRACE(scatter ? "reduce-scatter" : "all-reduce");
    auto ranks = MakeRanks(d);
    ASSERT_NE(ranks, nullptr);
    const std::vector<double> with = AccumulatedErrors(*ranks, scatter, true);
    ASSERT_EQ(with.size(), static_cast<size_t>(kSteps));
    for (int step = 0; step < kSteps; ++step) ASSERT_LE(with[step], bound) << "step " << step;
    auto again = MakeRanks(d);
    ASSERT_NE(again, nullptr);
    const std::vector<double> without = AccumulatedErrors(*again, scatter, false);
    ASSERT_EQ(without.size(), static_cast<size_t>(kSteps));
    EXPECT_GT(without[kSteps - 1], 0.15) << "without feedback the bias is lost: the test can fail";
    EXPECT_GT(without[kSteps - 1], 5 * without[9]) << "and the error grows with the steps";
  }
}

TEST_P(Int8CollectiveTest, OneRankSumsNothingAndAResidualOfAnotherSizeIsRefused) {
  auto one = MakeRanks(1);
  ASSERT_NE(one, nullptr);
  std::vector<float> data = {1.0f, 1e-3f}, residual(2, 0.0f);
  ASSERT_TRUE(one->handles[0]->AllReduceSumHostInt8(absl::MakeSpan(data), absl::MakeSpan(residual)).ok());
  EXPECT_EQ(data, (std::vector<float>{1.0f, 1e-3f})) << "nothing crosses a wire: nothing is quantized";
  auto two = MakeRanks(2);
  ASSERT_NE(two, nullptr);
  std::vector<float> short_residual(1);
  EXPECT_EQ(two->handles[0]->AllReduceSumHostInt8(absl::MakeSpan(data), absl::MakeSpan(short_residual)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(two->handles[1]->ReduceScatterSumHostInt8(absl::MakeSpan(data), absl::MakeSpan(short_residual)).code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Kinds, Int8CollectiveTest, ::testing::Values(Param{"inprocess"}, Param{"grpc"}),
                         [](const ::testing::TestParamInfo<Param>& info) { return info.param.kind; });

// The gRPC wire carries the blocks the ranks made, so its sums are the
// in-process group's bits, with about 68 bytes received for every 256 of
// the same f32 all-reduces (counted once every rank is done: a rank may
// receive a call's parts before it makes the call).
TEST(Int8GrpcCollectiveTest, GivesTheInProcessBitsAtAQuarterOfTheBytes) {
  const int d = 3;
  std::map<std::string, std::vector<std::vector<float>>> sums;  // run → [rank] after 3 steps
  std::map<std::string, uint64_t> received;                       // run → rank 0's bytes
  for (const std::string run : {"inprocess", "grpc", "grpc-f32"}) {
    // f32 in two rounds, as the 8-bit sums go: the same calls, 4-byte floats.
    auto ranks = testing::MakeRanks(run == "inprocess"  ? "inprocess"
                                    : run == "grpc-f32" ? "grpc_two_rounds"
                                                        : "grpc",
                                    "cpu", d, absl::Seconds(30));
    ASSERT_NE(ranks, nullptr);
    std::vector<std::vector<float>>& mine = sums[run];
    mine.resize(d);
    testing::RunRanks(*ranks, [&](int r, Collective& c, Backend&) {
      std::vector<float> residual(kFloats, 0.0f), data;
      for (int step = 0; step < 3; ++step) {
        data = Gradient(r, step);
        const absl::Status s = run == "grpc-f32" ? c.AllReduceSumHost(absl::MakeSpan(data))
                                                 : c.AllReduceSumHostInt8(absl::MakeSpan(data), absl::MakeSpan(residual));
        ASSERT_TRUE(s.ok()) << s;
      }
      mine[r] = data;
    });
    received[run] = ranks->handles[0]->BytesReceived();
  }
  for (int r = 0; r < d; ++r) EXPECT_EQ(sums["grpc"][r], sums["inprocess"][r]) << "rank " << r;
  EXPECT_EQ(sums["grpc"][1], sums["grpc"][0]);
  EXPECT_NE(sums["grpc"][0], sums["grpc-f32"][0]);
  ASSERT_GT(received["grpc-f32"], 0u);
  EXPECT_LT(static_cast<double>(received["grpc"]) / static_cast<double>(received["grpc-f32"]), 0.3)
      << received["grpc"] << " bytes over 8-bit blocks, " << received["grpc-f32"] << " in f32";
}

}  // namespace
}  // namespace shardline::worker::collective
