// The conformance suite: every backend built, checked against the float64
// reference of reference_ops.h. Forward results must agree to f32 accuracy:
// |got − want| ≤ 1e-5 + 1e-4·|want| unless a test says otherwise. GEMMs,
// element-wise ops, LayerNorm, softmax and attention here; lookups, losses,
// optimizers, reductions and conversions in backend_conformance_training_test.cc.
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/backend/reference_ops.h"
#include "worker/backend/attention.h"

namespace shardline::worker {
namespace {

using testing::AllNear;
using testing::BackendTest;
using testing::Download;
using testing::RandomVector;
using testing::AsDoubles;
using testing::Upload;

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-4;

class ConformanceTest : public BackendTest {
 protected:
  // Runs one GEMM on the backend and on the reference; C starts random.
  void CheckGemm(const GemmShape& shape, size_t a_size, size_t b_size, size_t c_size) {
    const auto a = RandomVector(a_size, 1), b = RandomVector(b_size, 2), c = RandomVector(c_size, 3);
    DeviceBuffer da = Upload(backend(), a), db = Upload(backend(), b), dc = Upload(backend(), c);
    ASSERT_TRUE(backend().Gemm(shape, da.span<float>(), db.span<float>(), dc.span<float>()).ok());
    std::vector<double> want = AsDoubles(c);
    reference::Gemm(shape, AsDoubles(a), AsDoubles(b), want);
    EXPECT_TRUE(AllNear(Download(backend(), dc), want, 1e-4, 1e-4));
  }
};

TEST_P(ConformanceTest, GemmMatchesReferenceForOddShapes) {
  GemmShape s;
  s.m = 37;
  s.n = 53;
  s.k = 29;
  CheckGemm(s, 37 * 29, 29 * 53, 37 * 53);
}

TEST_P(ConformanceTest, GemmHandlesEveryTransposeCombination) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a=" << ta << " trans_b=" << tb);
      GemmShape s;
      s.trans_a = ta;
      s.trans_b = tb;
      s.m = 17;
      s.n = 9;
      s.k = 23;
      CheckGemm(s, 17 * 23, 23 * 9, 17 * 9);
    }
  }
}

TEST_P(ConformanceTest, GemmStridedBatchedWithLeadingDimensions) {
  GemmShape s;
  s.trans_b = true;
  s.m = 6;
  s.n = 5;
  s.k = 4;
  s.lda = 7;   // A rows padded
  s.ldb = 9;   // B stored [n × k] with padding
  s.ldc = 8;
  s.batch = 3;
  s.stride_a = 6 * 7 + 3;
  s.stride_b = 5 * 9;
  s.stride_c = 6 * 8 + 1;
  CheckGemm(s, 3 * s.stride_a, 3 * s.stride_b, 3 * s.stride_c);
}

TEST_P(ConformanceTest, GemmAccumulatesIntoCWithAlphaAndBeta) {
  GemmShape s;
  s.m = 8;
  s.n = 8;
  s.k = 8;
  s.alpha = 0.5f;
  s.beta = 1.0f;
  CheckGemm(s, 64, 64, 64);
}

TEST_P(ConformanceTest, GemmBroadcastsAOperandWithZeroStride) {
  GemmShape s;
  s.m = 4;
  s.n = 3;
  s.k = 5;
  s.batch = 4;
  s.stride_a = 0;
  s.stride_b = 15;
  s.stride_c = 12;
  CheckGemm(s, 20, 60, 48);
}

TEST_P(ConformanceTest, GemmWithEmptyInnerDimensionScalesC) {
  GemmShape s;
  s.m = 3;
  s.n = 4;
  s.k = 0;
  std::vector<float> c(12, std::numeric_limits<float>::quiet_NaN());
  DeviceBuffer dc = Upload(backend(), c);
  ASSERT_TRUE(backend().Gemm(s, {}, {}, dc.span<float>()).ok());
  EXPECT_TRUE(AllNear(Download(backend(), dc), std::vector<double>(12, 0.0), 0, 0));
  s.beta = 2.0f;
  const auto c2 = RandomVector(12, 7);
  DeviceBuffer dc2 = Upload(backend(), c2);
  ASSERT_TRUE(backend().Gemm(s, {}, {}, dc2.span<float>()).ok());
  std::vector<double> want(12);
  for (int i = 0; i < 12; ++i) want[i] = 2.0 * c2[i];
  EXPECT_TRUE(AllNear(Download(backend(), dc2), want, kAtol, kRtol));
}

TEST_P(ConformanceTest, AxpyScaleAddFillAndCopy) {
  const size_t n = 1000;
  const auto x = RandomVector(n, 1), y = RandomVector(n, 2);
  DeviceBuffer dx = Upload(backend(), x), dy = Upload(backend(), y);
  ASSERT_TRUE(backend().Axpy(2.0f, dx.span<float>(), dy.span<float>()).ok());
  ASSERT_TRUE(backend().Scale(dy.span<float>(), -0.5f).ok());
  auto sum = backend().AllocateZeros(n);
  ASSERT_TRUE(sum.ok());
  ASSERT_TRUE(backend().Add(dx.span<float>(), dy.span<float>(), sum->span<float>()).ok());
  std::vector<double> want_y(n), want_sum(n);
  for (size_t i = 0; i < n; ++i) {
    want_y[i] = -0.5 * (y[i] + 2.0 * x[i]);
    want_sum[i] = x[i] + want_y[i];
  }
  EXPECT_TRUE(AllNear(Download(backend(), dy), want_y, kAtol, kRtol));
  EXPECT_TRUE(AllNear(Download(backend(), *sum), want_sum, kAtol, kRtol));
  ASSERT_TRUE(backend().CopyOnDevice(DeviceSpan<const float>(dx.span<float>()), dy.span<float>()).ok());
  ASSERT_TRUE(backend().Fill(dx.span<float>().subspan(0, 10), 3.0f).ok());
  std::vector<float> got_x = Download(backend(), dx);
  EXPECT_EQ(Download(backend(), dy), x);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got_x[i], i < 10 ? 3.0f : x[i]) << i;
}

TEST_P(ConformanceTest, BiasAddAndSumRows) {
  const int64_t rows = 33, cols = 70;
  const auto x = RandomVector(rows * cols, 1), bias = RandomVector(cols, 2);
  DeviceBuffer dx = Upload(backend(), x), db = Upload(backend(), bias);
  ASSERT_TRUE(backend().BiasAdd(dx.span<float>(), db.span<float>(), rows, cols).ok());
  std::vector<double> want(rows * cols), col_sum(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      want[r * cols + c] = x[r * cols + c] + bias[c];
      col_sum[c] += want[r * cols + c];
    }
  }
  EXPECT_TRUE(AllNear(Download(backend(), dx), want, kAtol, kRtol));
  // SumRows adds into its output.
  DeviceBuffer out = Upload(backend(), std::vector<float>(cols, 1.0f));
  ASSERT_TRUE(backend().SumRows(dx.span<float>(), out.span<float>(), rows, cols).ok());
  for (double& v : col_sum) v += 1.0;
  EXPECT_TRUE(AllNear(Download(backend(), out), col_sum, 1e-4, 1e-4));
}

TEST_P(ConformanceTest, GeluForwardMatchesReference) {
  const auto x = RandomVector(4097, 1, -6.0f, 6.0f);
  DeviceBuffer dx = Upload(backend(), x);
  auto y = backend().AllocateZeros(x.size());
  ASSERT_TRUE(y.ok());
  ASSERT_TRUE(backend().GeluForward(dx.span<float>(), y->span<float>()).ok());
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = reference::Gelu(x[i]);
  EXPECT_TRUE(AllNear(Download(backend(), *y), want, kAtol, kRtol));
}

TEST_P(ConformanceTest, LayerNormForwardMatchesReference) {
  const int64_t rows = 19, cols = 96;
  const auto x = RandomVector(rows * cols, 1, -3.0f, 5.0f);
  const auto gamma = RandomVector(cols, 2, 0.5f, 1.5f), beta = RandomVector(cols, 3);
  DeviceBuffer dx = Upload(backend(), x), dg = Upload(backend(), gamma), db = Upload(backend(), beta);
  auto y = backend().AllocateZeros(rows * cols);
  auto mean = backend().AllocateZeros(rows);
  auto rstd = backend().AllocateZeros(rows);
  ASSERT_TRUE(y.ok() && mean.ok() && rstd.ok());
  const LayerNormShape shape{rows, cols, 1e-5f};
  ASSERT_TRUE(backend()
                  .LayerNormForward(shape, dx.span<float>(), dg.span<float>(), db.span<float>(),
                                    y->span<float>(), mean->span<float>(), rstd->span<float>())
                  .ok());
  std::vector<double> want_y, want_mean, want_rstd;
  reference::LayerNorm(AsDoubles(x), AsDoubles(gamma), AsDoubles(beta), rows, cols, 1e-5, want_y, want_mean, want_rstd);
  EXPECT_TRUE(AllNear(Download(backend(), *y), want_y, 1e-5, 1e-4));
  EXPECT_TRUE(AllNear(Download(backend(), *mean), want_mean, 1e-5, 1e-4));
  EXPECT_TRUE(AllNear(Download(backend(), *rstd), want_rstd, 1e-5, 1e-4));
}

TEST_P(ConformanceTest, CausalSoftmaxMasksTheFutureInPlace) {
  const int64_t batch = 3, t = 37;
  const auto scores = RandomVector(batch * t * t, 1, -4.0f, 4.0f);
  DeviceBuffer d = Upload(backend(), scores);
  const SoftmaxShape shape{batch, t, 0.7f};
  ASSERT_TRUE(backend().CausalSoftmaxForward(shape, d.span<float>(), d.span<float>()).ok());
  const std::vector<float> got = Download(backend(), d);
  EXPECT_TRUE(AllNear(got, reference::CausalSoftmax(AsDoubles(scores), batch, t, 0.7), 1e-6, 1e-4));
  for (int64_t row = 0; row < batch * t; ++row) {
    double sum = 0.0;
    for (int64_t j = 0; j < t; ++j) {
      if (j > row % t) {
        ASSERT_EQ(got[row * t + j], 0.0f) << "row " << row << " col " << j;
      }
      sum += got[row * t + j];
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
}

TEST_P(ConformanceTest, AttentionForwardMatchesReference) {
  const AttentionShape shape{3, 11, 4, 8};
  const size_t c = 32;
  const auto qkv = RandomVector(3 * 11 * 3 * c, 1, -2.0f, 2.0f);
  DeviceBuffer dqkv = Upload(backend(), qkv);
  auto out = backend().AllocateZeros(3 * 11 * c);
  auto saved = backend().AllocateZeros(static_cast<size_t>(*AttentionSavedFloats(backend(), shape)));
  ASSERT_TRUE(out.ok() && saved.ok());
  ASSERT_TRUE(AttentionForward(backend(), shape, dqkv.span<float>(), out->span<float>(), saved->span<float>()).ok());
  EXPECT_TRUE(AllNear(Download(backend(), *out), reference::Attention(shape, AsDoubles(qkv)), 1e-5, 1e-4));
}

INSTANTIATE_TEST_SUITE_P(Backends, ConformanceTest,
                         ::testing::ValuesIn(testing::BackendsUnderTest()),
                         testing::BackendTestName);

}  // namespace
}  // namespace shardline::worker
