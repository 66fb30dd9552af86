// Every backward op of every backend built, checked against central finite
// differences of the float64 reference forward pass (reference_ops.h).
// The loss is L = Σ w ⊙ y with fixed random weights w, so dy = w.
// Finite-difference step h = 1e-5 in double; tolerance on each gradient
// element: |analytic − numeric| ≤ 1e-4 + 1e-3·|numeric| (f32 analytic side).
#include <cmath>
#include <functional>
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

constexpr double kStep = 1e-5;
constexpr double kAtol = 1e-4;
constexpr double kRtol = 1e-3;

using Loss = std::function<double(const std::vector<double>&)>;

std::vector<double> NumericGradient(const Loss& loss, std::vector<double> x) {
  std::vector<double> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kStep;
    const double up = loss(x);
    x[i] = saved - kStep;
    const double down = loss(x);
    x[i] = saved;
    grad[i] = (up - down) / (2 * kStep);
  }
  return grad;
}

double Dot(const std::vector<double>& w, const std::vector<double>& y) {
  double sum = 0.0;
  for (size_t i = 0; i < y.size(); ++i) sum += w[i] * y[i];
  return sum;
}

class GradientCheckTest : public BackendTest {};

TEST_P(GradientCheckTest, GeluBackwardAddsTheGradient) {
  const auto x = RandomVector(300, 1, -4.0f, 4.0f), w = RandomVector(300, 2);
  DeviceBuffer dx_in = Upload(backend(), x), dy = Upload(backend(), w);
  DeviceBuffer dx = Upload(backend(), std::vector<float>(300, 0.25f));
  ASSERT_TRUE(backend().GeluBackward(dx_in.span<float>(), dy.span<float>(), dx.span<float>()).ok());
  std::vector<double> want = NumericGradient(
      [&](const std::vector<double>& xs) {
        double sum = 0.0;
        for (size_t i = 0; i < xs.size(); ++i) sum += w[i] * reference::Gelu(xs[i]);
        return sum;
      },
      AsDoubles(x));
  for (double& g : want) g += 0.25;  // backward ops accumulate
  EXPECT_TRUE(AllNear(Download(backend(), dx), want, kAtol, kRtol));
}

TEST_P(GradientCheckTest, LayerNormBackwardInputScaleAndShift) {
  const int64_t rows = 5, cols = 24;
  const auto x = RandomVector(rows * cols, 1, -2.0f, 3.0f), w = RandomVector(rows * cols, 2);
  const auto gamma = RandomVector(cols, 3, 0.5f, 1.5f), beta = RandomVector(cols, 4);
  const LayerNormShape shape{rows, cols, 1e-5f};
  DeviceBuffer dx_in = Upload(backend(), x), dg_in = Upload(backend(), gamma),
               db_in = Upload(backend(), beta), dy = Upload(backend(), w);
  auto y = backend().AllocateZeros(rows * cols);
  auto mean = backend().AllocateZeros(rows);
  auto rstd = backend().AllocateZeros(rows);
  auto dx = backend().AllocateZeros(rows * cols);
  auto dgamma = backend().AllocateZeros(cols);
  auto dbeta = backend().AllocateZeros(cols);
  ASSERT_TRUE(y.ok() && mean.ok() && rstd.ok() && dx.ok() && dgamma.ok() && dbeta.ok());
  ASSERT_TRUE(backend().LayerNormForward(shape, dx_in.span<float>(), dg_in.span<float>(),
                                         db_in.span<float>(), y->span<float>(),
                                         mean->span<float>(), rstd->span<float>()).ok());
  ASSERT_TRUE(backend().LayerNormBackward(shape, dx_in.span<float>(), dg_in.span<float>(),
                                          mean->span<float>(), rstd->span<float>(),
                                          dy.span<float>(), dx->span<float>(),
                                          dgamma->span<float>(), dbeta->span<float>()).ok());
  const auto wd = AsDoubles(w);
  auto loss = [&](const std::vector<double>& xs, const std::vector<double>& g,
                  const std::vector<double>& b) {
    std::vector<double> out, m, s;
    reference::LayerNorm(xs, g, b, rows, cols, 1e-5, out, m, s);
    return Dot(wd, out);
  };
  const auto xd = AsDoubles(x), gd = AsDoubles(gamma), bd = AsDoubles(beta);
  EXPECT_TRUE(AllNear(Download(backend(), *dx),
                      NumericGradient([&](const auto& v) { return loss(v, gd, bd); }, xd), kAtol,
                      kRtol));
  EXPECT_TRUE(AllNear(Download(backend(), *dgamma),
                      NumericGradient([&](const auto& v) { return loss(xd, v, bd); }, gd), kAtol,
                      kRtol));
  EXPECT_TRUE(AllNear(Download(backend(), *dbeta),
                      NumericGradient([&](const auto& v) { return loss(xd, gd, v); }, bd), kAtol,
                      kRtol));
}

TEST_P(GradientCheckTest, CausalSoftmaxBackward) {
  const int64_t batch = 2, t = 9;
  const double scale = 0.5;
  const auto s = RandomVector(batch * t * t, 1, -3.0f, 3.0f), w = RandomVector(batch * t * t, 2);
  const SoftmaxShape shape{batch, t, static_cast<float>(scale)};
  DeviceBuffer ds = Upload(backend(), s), dp = Upload(backend(), w);
  auto probs = backend().AllocateZeros(s.size());
  auto dscores = backend().AllocateZeros(s.size());
  ASSERT_TRUE(probs.ok() && dscores.ok());
  ASSERT_TRUE(backend().CausalSoftmaxForward(shape, ds.span<float>(), probs->span<float>()).ok());
  ASSERT_TRUE(backend().CausalSoftmaxBackward(shape, probs->span<float>(), dp.span<float>(),
                                              dscores->span<float>()).ok());
  const auto wd = AsDoubles(w);
  const auto want = NumericGradient(
      [&](const auto& v) { return Dot(wd, reference::CausalSoftmax(v, batch, t, scale)); },
      AsDoubles(s));
  EXPECT_TRUE(AllNear(Download(backend(), *dscores), want, kAtol, kRtol));
}

TEST_P(GradientCheckTest, AttentionBackward) {
  const AttentionShape shape{2, 6, 3, 4};
  const size_t qkv_n = 2 * 6 * 3 * 12, out_n = 2 * 6 * 12;
  const auto qkv = RandomVector(qkv_n, 1, -1.5f, 1.5f), w = RandomVector(out_n, 2);
  DeviceBuffer dq = Upload(backend(), qkv), dout = Upload(backend(), w);
  auto out = backend().AllocateZeros(out_n);
  auto saved = backend().AllocateZeros(static_cast<size_t>(*AttentionSavedFloats(backend(), shape)));
  auto scratch = backend().AllocateZeros(static_cast<size_t>(*AttentionScratchFloats(backend(), shape)));
  DeviceBuffer dqkv = Upload(backend(), std::vector<float>(qkv_n, -1.0f));
  ASSERT_TRUE(out.ok() && saved.ok() && scratch.ok());
  ASSERT_TRUE(AttentionForward(backend(), shape, dq.span<float>(), out->span<float>(), saved->span<float>()).ok());
  ASSERT_TRUE(AttentionBackward(backend(), shape, dq.span<float>(), out->span<float>(), saved->span<float>(),
                                dout.span<float>(), dqkv.span<float>(), scratch->span<float>())
                  .ok());
  const auto wd = AsDoubles(w);
  auto want = NumericGradient([&](const auto& v) { return Dot(wd, reference::Attention(shape, v)); },
                              AsDoubles(qkv));
  for (double& g : want) g -= 1.0;  // dqkv started at −1 and is accumulated into
  EXPECT_TRUE(AllNear(Download(backend(), dqkv), want, kAtol, kRtol));
}

TEST_P(GradientCheckTest, CrossEntropyBackwardWithIgnoredRows) {
  const CrossEntropyShape shape{6, 13};
  const float grad_scale = 1.0f / 4;  // mean over the 4 rows that count
  const auto logits = RandomVector(6 * 13, 1, -3.0f, 3.0f);
  const std::vector<int32_t> targets = {2, -1, 12, 0, -1, 7};
  DeviceBuffer dl = Upload(backend(), logits), dt = Upload(backend(), targets);
  auto dlogits = backend().AllocateZeros(6 * 13);
  ASSERT_TRUE(dlogits.ok());
  ASSERT_TRUE(backend().CrossEntropyBackward(shape, dl.span<float>(), dt.span<int32_t>(),
                                             grad_scale, dlogits->span<float>()).ok());
  const auto want = NumericGradient(
      [&](const auto& v) {
        double sum = 0.0;
        for (double l : reference::CrossEntropy(v, targets, 6, 13)) sum += grad_scale * l;
        return sum;
      },
      AsDoubles(logits));
  EXPECT_TRUE(AllNear(Download(backend(), *dlogits), want, kAtol, kRtol));
}

TEST_P(GradientCheckTest, EmbeddingBackwardWithRepeatedIds) {
  const EmbeddingShape shape{8, 5, 6};
  const std::vector<int32_t> ids = {1, 4, 1, 0, 1, 3, 4, 2};
  const auto table = RandomVector(5 * 6, 1), w = RandomVector(8 * 6, 2);
  DeviceBuffer di = Upload(backend(), ids), dw = Upload(backend(), w);
  auto dtable = backend().AllocateZeros(5 * 6);
  ASSERT_TRUE(dtable.ok());
  ASSERT_TRUE(backend().EmbeddingBackward(shape, di.span<int32_t>(), dw.span<float>(),
                                          dtable->span<float>()).ok());
  const auto want = NumericGradient(
      [&](const auto& v) {
        double sum = 0.0;
        for (int r = 0; r < 8; ++r) {
          for (int c = 0; c < 6; ++c) sum += w[r * 6 + c] * v[ids[r] * 6 + c];
        }
        return sum;
      },
      AsDoubles(table));
  EXPECT_TRUE(AllNear(Download(backend(), *dtable), want, kAtol, kRtol));
}

// A linear layer Y = X·Wᵀ + b built from the primitives, as the model will:
// dX = dY·W, dW = dYᵀ·X, db = SumRows(dY).
TEST_P(GradientCheckTest, LinearLayerFromGemmAndSumRows) {
  const int64_t n = 7, in = 5, out = 4;
  const auto x = RandomVector(n * in, 1), wt = RandomVector(out * in, 2), b = RandomVector(out, 3);
  const auto w = RandomVector(n * out, 4);  // loss weights = dY
  DeviceBuffer dxv = Upload(backend(), x), dwt = Upload(backend(), wt), ddy = Upload(backend(), w);
  auto dx = backend().AllocateZeros(n * in);
  auto dweight = backend().AllocateZeros(out * in);
  auto dbias = backend().AllocateZeros(out);
  ASSERT_TRUE(dx.ok() && dweight.ok() && dbias.ok());
  GemmShape dx_shape;  // [n×out]·[out×in]
  dx_shape.m = n;
  dx_shape.n = in;
  dx_shape.k = out;
  dx_shape.beta = 1.0f;
  ASSERT_TRUE(backend().Gemm(dx_shape, ddy.span<float>(), dwt.span<float>(), dx->span<float>()).ok());
  GemmShape dw_shape;  // [out×n]·[n×in]
  dw_shape.trans_a = true;
  dw_shape.m = out;
  dw_shape.n = in;
  dw_shape.k = n;
  dw_shape.beta = 1.0f;
  ASSERT_TRUE(
      backend().Gemm(dw_shape, ddy.span<float>(), dxv.span<float>(), dweight->span<float>()).ok());
  ASSERT_TRUE(backend().SumRows(ddy.span<float>(), dbias->span<float>(), n, out).ok());

  const auto xd = AsDoubles(x), wtd = AsDoubles(wt), bd = AsDoubles(b), wd = AsDoubles(w);
  auto loss = [&](const std::vector<double>& xs, const std::vector<double>& ws,
                  const std::vector<double>& bs) {
    double sum = 0.0;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        double y = bs[o];
        for (int64_t i = 0; i < in; ++i) y += xs[r * in + i] * ws[o * in + i];
        sum += wd[r * out + o] * y;
      }
    }
    return sum;
  };
  EXPECT_TRUE(AllNear(Download(backend(), *dx),
                      NumericGradient([&](const auto& v) { return loss(v, wtd, bd); }, xd), kAtol,
                      kRtol));
  EXPECT_TRUE(AllNear(Download(backend(), *dweight),
                      NumericGradient([&](const auto& v) { return loss(xd, v, bd); }, wtd), kAtol,
                      kRtol));
  EXPECT_TRUE(AllNear(Download(backend(), *dbias),
                      NumericGradient([&](const auto& v) { return loss(xd, wtd, v); }, bd), kAtol,
                      kRtol));
}

INSTANTIATE_TEST_SUITE_P(Backends, GradientCheckTest,
                         ::testing::ValuesIn(testing::BackendsUnderTest()),
                         testing::BackendTestName);

}  // namespace
}  // namespace shardline::worker
