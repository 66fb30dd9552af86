// The conformance suite, second part (the first, backend_conformance_test.cc,
// says how results are compared): embedding lookups, cross-entropy (whole and
// vocabulary-parallel), the optimizers, sums of squares and the half-precision
// conversions, on every backend built, against the float64 reference.
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "common/half.h"
#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/backend/reference_ops.h"

namespace shardline::worker {
namespace {

using testing::AllNear;
using testing::AsDoubles;
using testing::BackendTest;
using testing::Download;
using testing::RandomVector;
using testing::Upload;

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-4;

class TrainingConformanceTest : public BackendTest {};

TEST_P(TrainingConformanceTest, EmbeddingGathersAndAccumulates) {
  const EmbeddingShape shape{6, 10, 12};
  const auto table = RandomVector(10 * 12, 1);
  const std::vector<int32_t> ids = {3, 0, 9, 3, 7, 1};
  DeviceBuffer dt = Upload(backend(), table), di = Upload(backend(), ids);
  const auto start = RandomVector(6 * 12, 2);
  DeviceBuffer out = Upload(backend(), start);
  ASSERT_TRUE(backend().EmbeddingForward(shape, di.span<int32_t>(), dt.span<float>(),
                                         out.span<float>(), /*accumulate=*/true).ok());
  std::vector<double> want(6 * 12);
  for (int r = 0; r < 6; ++r) {
    for (int c = 0; c < 12; ++c) want[r * 12 + c] = start[r * 12 + c] + table[ids[r] * 12 + c];
  }
  EXPECT_TRUE(AllNear(Download(backend(), out), want, kAtol, kRtol));
  ASSERT_TRUE(backend().EmbeddingForward(shape, di.span<int32_t>(), dt.span<float>(),
                                         out.span<float>(), /*accumulate=*/false).ok());
  for (int r = 0; r < 6; ++r) {
    for (int c = 0; c < 12; ++c) want[r * 12 + c] = table[ids[r] * 12 + c];
  }
  EXPECT_TRUE(AllNear(Download(backend(), out), want, 0, 0));
}

TEST_P(TrainingConformanceTest, CrossEntropySkipsIgnoredTargets) {
  const CrossEntropyShape shape{7, 50};
  const auto logits = RandomVector(7 * 50, 1, -5.0f, 5.0f);
  const std::vector<int32_t> targets = {4, -1, 49, 0, -1, 17, 33};
  DeviceBuffer dl = Upload(backend(), logits), dt = Upload(backend(), targets);
  DeviceBuffer losses = Upload(backend(), std::vector<float>(7, 123.0f));
  ASSERT_TRUE(backend()
                  .CrossEntropyForward(shape, dl.span<float>(), dt.span<int32_t>(),
                                       losses.span<float>())
                  .ok());
  EXPECT_TRUE(AllNear(Download(backend(), losses), reference::CrossEntropy(AsDoubles(logits), targets, 7, 50),
                      1e-5, 1e-5));
}

// A vocabulary-parallel rank's table: rows [first, first + vocab) of 10.
// Each slice reads its own rows and zeros for the others' (so the slices'
// outputs add up to the whole table's, exactly), leaves the others' rows
// alone when accumulating, and adds to its own rows' gradients only.
TEST_P(TrainingConformanceTest, EmbeddingSlicesAddUpToTheWholeTable) {
  const int64_t rows = 6, vocab = 10, dim = 12;
  const auto table = RandomVector(vocab * dim, 1);
  const std::vector<int32_t> ids = {3, 0, 9, 3, 7, 1};
  const auto dout = RandomVector(rows * dim, 2);
  DeviceBuffer di = Upload(backend(), ids), ddout = Upload(backend(), dout);
  std::vector<float> sum(rows * dim, 0.0f);
  for (const auto& [first, end] : std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 7}, {7, 10}}) {
    SCOPED_TRACE(::testing::Message() << "rows [" << first << ", " << end << ")");
    const EmbeddingShape shape{rows, end - first, dim, first, vocab};
    DeviceBuffer dt = Upload(backend(), std::vector<float>(table.begin() + first * dim, table.begin() + end * dim));
    const auto start = RandomVector(rows * dim, 3);
    DeviceBuffer out = Upload(backend(), start);
    ASSERT_TRUE(backend().EmbeddingForward(shape, di.span<int32_t>(), dt.span<float>(), out.span<float>(),
                                           /*accumulate=*/true).ok());
    std::vector<double> want(rows * dim);
    for (int r = 0; r < rows; ++r) {
      const bool held = ids[r] >= first && ids[r] < end;
      for (int c = 0; c < dim; ++c) want[r * dim + c] = start[r * dim + c] + (held ? table[ids[r] * dim + c] : 0.0f);
    }
    EXPECT_TRUE(AllNear(Download(backend(), out), want, 0, 0));
    ASSERT_TRUE(backend().EmbeddingForward(shape, di.span<int32_t>(), dt.span<float>(), out.span<float>(),
                                           /*accumulate=*/false).ok());
    const std::vector<float> part = Download(backend(), out);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    auto dtable = backend().AllocateZeros(static_cast<size_t>((end - first) * dim));
    ASSERT_TRUE(dtable.ok());
    ASSERT_TRUE(backend().EmbeddingBackward(shape, di.span<int32_t>(), ddout.span<float>(),
                                            dtable->span<float>()).ok());
    std::vector<double> grad((end - first) * dim, 0.0);
    for (int r = 0; r < rows; ++r) {
      if (ids[r] < first || ids[r] >= end) continue;
      for (int c = 0; c < dim; ++c) grad[(ids[r] - first) * dim + c] += dout[r * dim + c];
    }
    EXPECT_TRUE(AllNear(Download(backend(), *dtable), grad, 1e-6, 0));
  }
  std::vector<double> whole(rows * dim);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < dim; ++c) whole[r * dim + c] = table[ids[r] * dim + c];
  }
  EXPECT_TRUE(AllNear(sum, whole, 0, 0));
}

// Vocabulary-parallel cross-entropy: three slices of 50 classes, each's
// parts, combined in slice order, give the whole rows' losses; each slice's
// backward with the combined log-sum-exp gives its columns of the whole
// rows' gradient.
TEST_P(TrainingConformanceTest, CrossEntropySlicesGiveTheWholeRowsLossesAndGradients) {
  const int64_t rows = 7, vocab = 50;
  const auto logits = RandomVector(rows * vocab, 1, -5.0f, 5.0f);
  const std::vector<int32_t> targets = {4, -1, 49, 0, -1, 17, 33};
  DeviceBuffer dt = Upload(backend(), targets);
  const std::vector<std::pair<int64_t, int64_t>> slices = {{0, 20}, {20, 35}, {35, 50}};
  const int64_t k = static_cast<int64_t>(slices.size());
  auto parts = backend().AllocateZeros(static_cast<size_t>(k * rows * 3));
  ASSERT_TRUE(parts.ok());
  std::vector<DeviceBuffer> sliced;
  for (int64_t s = 0; s < k; ++s) {
    const auto [first, end] = slices[s];
    std::vector<float> columns;
    for (int64_t r = 0; r < rows; ++r) {
      columns.insert(columns.end(), logits.begin() + r * vocab + first, logits.begin() + r * vocab + end);
    }
    sliced.push_back(Upload(backend(), columns));
    ASSERT_TRUE(backend()
                    .CrossEntropyParts(CrossEntropyShape{rows, end - first, first, vocab}, sliced.back().span<float>(),
                                       dt.span<int32_t>(), parts->span<float>().subspan(s * rows * 3, rows * 3))
                    .ok());
  }
  DeviceBuffer losses = Upload(backend(), std::vector<float>(rows, 123.0f));
  DeviceBuffer lse = Upload(backend(), std::vector<float>(rows, 0.0f));
  ASSERT_TRUE(backend()
                  .CrossEntropyCombine(LossPartsShape{rows, k}, parts->span<float>(), dt.span<int32_t>(),
                                       losses.span<float>(), lse.span<float>())
                  .ok());
  EXPECT_TRUE(AllNear(Download(backend(), losses), reference::CrossEntropy(AsDoubles(logits), targets, rows, vocab),
                      1e-5, 1e-5));
  // The whole rows' gradient, then each slice's against its columns.
  DeviceBuffer dl = Upload(backend(), logits);
  auto whole = backend().AllocateZeros(static_cast<size_t>(rows * vocab));
  ASSERT_TRUE(whole.ok());
  ASSERT_TRUE(backend()
                  .CrossEntropyBackward(CrossEntropyShape{rows, vocab}, dl.span<float>(), dt.span<int32_t>(), 0.5f,
                                        whole->span<float>())
                  .ok());
  const std::vector<float> whole_grad = Download(backend(), *whole);
  for (int64_t s = 0; s < k; ++s) {
    const auto [first, end] = slices[s];
    SCOPED_TRACE(::testing::Message() << "classes [" << first << ", " << end << ")");
    auto grad = backend().AllocateZeros(static_cast<size_t>(rows * (end - first)));
    ASSERT_TRUE(grad.ok());
    ASSERT_TRUE(backend()
                    .CrossEntropyBackward(CrossEntropyShape{rows, end - first, first, vocab}, sliced[s].span<float>(),
                                          dt.span<int32_t>(), 0.5f, grad->span<float>(), lse.span<float>())
                    .ok());
    std::vector<double> want;
    for (int64_t r = 0; r < rows; ++r) {
      want.insert(want.end(), whole_grad.begin() + r * vocab + first, whole_grad.begin() + r * vocab + end);
    }
    EXPECT_TRUE(AllNear(Download(backend(), *grad), want, 1e-6, 1e-5));
  }
}

TEST_P(TrainingConformanceTest, AdamWMatchesHandComputedSteps) {
  const size_t n = 257;
  const auto p0 = RandomVector(n, 1), g1 = RandomVector(n, 2), g2 = RandomVector(n, 3);
  DeviceBuffer p = Upload(backend(), p0), g = Upload(backend(), g1);
  auto m = backend().AllocateZeros(n);
  auto v = backend().AllocateZeros(n);
  ASSERT_TRUE(m.ok() && v.ok());
  AdamWStep step{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
  ASSERT_TRUE(backend().AdamWUpdate(step, p.span<float>(), g.span<float>(), m->span<float>(),
                                    v->span<float>()).ok());
  g = Upload(backend(), g2);
  step.step = 2;
  ASSERT_TRUE(backend().AdamWUpdate(step, p.span<float>(), g.span<float>(), m->span<float>(),
                                    v->span<float>()).ok());
  std::vector<double> want(n);
  for (size_t i = 0; i < n; ++i) {
    double pi = p0[i], mi = 0, vi = 0;
    const double grads[2] = {g1[i], g2[i]};
    for (int t = 1; t <= 2; ++t) {
      mi = 0.9 * mi + 0.1 * grads[t - 1];
      vi = 0.95 * vi + 0.05 * grads[t - 1] * grads[t - 1];
      const double mh = mi / (1 - std::pow(0.9, t)), vh = vi / (1 - std::pow(0.95, t));
      pi -= 0.01 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * pi);
    }
    want[i] = pi;
  }
  EXPECT_TRUE(AllNear(Download(backend(), p), want, 1e-6, 1e-5));
}

TEST_P(TrainingConformanceTest, SgdMomentumMatchesHandComputedSteps) {
  const size_t n = 100;
  const auto p0 = RandomVector(n, 1), g1 = RandomVector(n, 2);
  DeviceBuffer p = Upload(backend(), p0), g = Upload(backend(), g1);
  auto buf = backend().AllocateZeros(n);
  ASSERT_TRUE(buf.ok());
  const SgdStep step{0.1f, 0.9f, 0.01f};
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(backend().SgdMomentumUpdate(step, p.span<float>(), g.span<float>(),
                                            buf->span<float>()).ok());
  }
  std::vector<double> want(n);
  for (size_t i = 0; i < n; ++i) {
    double pi = p0[i], b = 0;
    for (int t = 0; t < 2; ++t) {
      b = 0.9 * b + g1[i] + 0.01 * pi;
      pi -= 0.1 * b;
    }
    want[i] = pi;
  }
  EXPECT_TRUE(AllNear(Download(backend(), p), want, 1e-6, 1e-5));
}

TEST_P(TrainingConformanceTest, SumOfSquaresIsExactToDoublePrecision) {
  const auto x = RandomVector(1'000'003, 1, -2.0f, 2.0f);
  DeviceBuffer dx = Upload(backend(), x);
  double want = 0.0;
  for (float v : x) want += static_cast<double>(v) * v;
  auto got = backend().SumOfSquares(dx.span<float>());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_NEAR(*got, want, 1e-9 * want);
  auto again = backend().SumOfSquares(dx.span<float>());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*got, *again) << "the reduction must be deterministic";
}

// The batched reduction (one wait for all) gives each span's SumOfSquares,
// bit for bit, empty spans 0.
TEST_P(TrainingConformanceTest, SumsOfSquaresEqualsSumOfSquaresOfEach) {
  std::vector<DeviceBuffer> buffers;
  std::vector<DeviceSpan<const float>> spans;
  for (size_t n : {size_t{1}, size_t{1000}, size_t{0}, size_t{300'007}, size_t{33}}) {
    buffers.push_back(Upload(backend(), RandomVector(n, static_cast<int>(n), -3.0f, 3.0f)));
    spans.push_back(buffers.back().span<float>().subspan(0, n));
  }
  auto sums = backend().SumsOfSquares(spans);
  ASSERT_TRUE(sums.ok()) << sums.status();
  ASSERT_EQ(sums->size(), spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    auto one = backend().SumOfSquares(spans[i]);
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ((*sums)[i], *one) << "span " << i;
  }
  EXPECT_EQ((*sums)[2], 0.0);
  auto none = backend().SumsOfSquares({});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

TEST_P(TrainingConformanceTest, HalfConversionsMatchTheHostBitForBit) {
  std::vector<float> x = RandomVector(5000, 1, -70000.0f, 70000.0f);
  const auto small = RandomVector(2000, 2, -1e-6f, 1e-6f);  // f16 subnormals
  x.insert(x.end(), small.begin(), small.end());
  for (float special : {0.0f, -0.0f, 65504.0f, 65520.0f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048,
                        std::numeric_limits<float>::infinity(), 1e-30f, 3.4e38f}) {
    x.push_back(special);
  }
  DeviceBuffer dx = Upload(backend(), x);
  for (common::DType dtype : {common::DType::kBF16, common::DType::kF16}) {
    SCOPED_TRACE(common::DTypeName(dtype));
    auto half = backend().Allocate(x.size() * 2);
    ASSERT_TRUE(half.ok());
    ASSERT_TRUE(backend().ConvertFromF32(dx.span<float>(), dtype, half->span<uint16_t>()).ok());
    const std::vector<uint16_t> bits = Download<uint16_t>(backend(), *half);
    auto back = backend().AllocateZeros(x.size());
    ASSERT_TRUE(back.ok());
    ASSERT_TRUE(backend().ConvertToF32(half->span<uint16_t>(), dtype, back->span<float>()).ok());
    const std::vector<float> widened = Download(backend(), *back);
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t want = dtype == common::DType::kBF16 ? common::FloatToBFloat16Bits(x[i])
                                                          : common::FloatToFloat16Bits(x[i]);
      ASSERT_EQ(bits[i], want) << "value " << x[i];
      const float want_back = dtype == common::DType::kBF16 ? common::BFloat16BitsToFloat(want)
                                                            : common::Float16BitsToFloat(want);
      ASSERT_EQ(widened[i], want_back) << "value " << x[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, TrainingConformanceTest,
                         ::testing::ValuesIn(testing::BackendsUnderTest()),
                         testing::BackendTestName);

}  // namespace
}  // namespace shardline::worker
