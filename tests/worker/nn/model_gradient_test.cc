// Finite-difference checks through whole layers: one transformer block on
// its own (input and every parameter), and the whole model from token ids to
// loss (every parameter). Each check compares the derivative of the loss
// along a unit direction d (see CheckDirection) with Σ g·d. The numeric side
// is a central difference at steps ε = 1e-2 and 2ε, Richardson-extrapolated,
// on the f32 model. Tolerance: |fd − analytic| ≤ 1e-5 + 2e-3·|analytic| (a
// gradient 1% off fails it).
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "common/cost_model.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/data/data_source.h"
#include "worker/runtime/shard_runtime.h"

namespace shardline::worker {
namespace {

using runtime::ShardRuntime;

constexpr double kEps = 1e-2;

std::vector<float> UnitDirection(size_t n, uint64_t key) {
  common::Rng rng(key);
  std::vector<float> d(n);
  double norm = 0;
  for (float& v : d) {
    v = static_cast<float>(rng.Normal());
    norm += static_cast<double>(v) * v;
  }
  for (float& v : d) v = static_cast<float>(v / std::sqrt(norm));
  return d;
}

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// dL/ds at s = 0 from loss_at(s) = L(θ + s·ε·d): central differences at
// steps ε and 2ε combined (Richardson) so that the ε² error term cancels;
// steps this wide keep the f32 noise of the loss small.
double CentralDerivative(const std::function<double(double)>& loss_at) {
  const double narrow = (loss_at(1.0) - loss_at(-1.0)) / (2 * kEps);
  const double wide = (loss_at(2.0) - loss_at(-2.0)) / (4 * kEps);
  return (4 * narrow - wide) / 3;
}

// A unit direction mostly along the analytic gradient (so the derivative is
// large against the f32 noise of the loss, and a gradient that is wrong in
// size shows), plus a random part (so one wrong in direction shows too).
std::vector<float> CheckDirection(const std::vector<float>& grad, uint64_t key) {
  std::vector<float> d = UnitDirection(grad.size(), key);
  const double norm = std::sqrt(Dot(grad, grad));
  if (norm == 0) return d;
  double total = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    d[i] = static_cast<float>(0.8 * grad[i] / norm + 0.6 * d[i]);
    total += static_cast<double>(d[i]) * d[i];
  }
  for (float& v : d) v = static_cast<float>(v / std::sqrt(total));
  return d;
}

void ExpectClose(double fd, double analytic, const std::string& what) {
  EXPECT_LE(std::fabs(fd - analytic), 1e-5 + 2e-3 * std::fabs(analytic))
      << what << ": finite difference " << fd << " vs analytic " << analytic;
}

// Checks every parameter of `runtime` against `loss` (which runs a forward
// pass with the current weights); the gradients must already be computed.
void CheckParameters(Backend& backend, ShardRuntime& runtime, const std::function<double()>& loss) {
  for (nn::Parameter* p : runtime.parameters()) {
    std::vector<float> value(p->count()), grad(p->count());
    ASSERT_TRUE(backend.CopyToHost(DeviceSpan<const float>(p->v()), absl::Span<float>(value)).ok());
    ASSERT_TRUE(backend.CopyToHost(DeviceSpan<const float>(p->g()), absl::Span<float>(grad)).ok());
    const std::vector<float> d = CheckDirection(grad, common::HashString(p->name));
    auto loss_at = [&](double step) {
      std::vector<float> moved(value);
      for (size_t i = 0; i < moved.size(); ++i) moved[i] += static_cast<float>(step * kEps) * d[i];
      EXPECT_TRUE(backend.CopyToDevice(absl::Span<const float>(moved), p->v()).ok());
      return loss();
    };
    const double fd = CentralDerivative(loss_at);
    ASSERT_TRUE(backend.CopyToDevice(absl::Span<const float>(value), p->v()).ok());
    ExpectClose(fd, Dot(grad, d), p->name);
  }
}

TEST(ModelGradientTest, WholeModelFromTokensToLoss) {
  auto backend = testing::CpuBackend();
  const auto spec = testing::TinySpec();
  auto data = data::CreateDataSource(spec);
  ASSERT_TRUE(data.ok());
  const nn::ModelConfig config = nn::ModelConfig::FromSpec(spec.model());
  auto runtime = ShardRuntime::Create(*backend, config, 0, config.units(), 5,
                                      nn::OptimizerConfig::FromSpec(spec.train()));
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  const data::Batch batch = (*data)->TrainBatch(1, 0, 4).value();
  ShardRuntime::Inputs in{batch.batch, batch.t, batch.ids, batch.targets,
                          static_cast<float>(1.0 / batch.target_count()), {}};
  auto loss = [&] {
    EXPECT_TRUE((*runtime)->Forward(0, in).ok());
    const double l = *(*runtime)->Loss(0);
    (*runtime)->Discard(0);
    return l;
  };
  ASSERT_TRUE((*runtime)->ZeroGrads().ok());
  ASSERT_TRUE((*runtime)->Forward(0, in).ok());
  ASSERT_TRUE((*runtime)->Backward(0, {}).ok());
  EXPECT_EQ((*runtime)->parameters().size(), 2u + 2 * 12u + 3u);
  CheckParameters(*backend, **runtime, loss);
}

// One block at a short length and at one past the CPU attention's key tile,
// where it keeps a log-sum-exp per query and recomputes the weights.
TEST(ModelGradientTest, OneBlockInputAndParameters) {
  for (const int64_t t : {int64_t{7}, common::kCpuAttentionKeyTile + 45}) {
    SCOPED_TRACE(::testing::Message() << "t = " << t);
    auto backend = testing::CpuBackend();
    auto spec = testing::TinySpec();
    spec.mutable_model()->set_context(std::max<int64_t>(spec.model().context(), t));
    const nn::ModelConfig config = nn::ModelConfig::FromSpec(spec.model());
    auto runtime = ShardRuntime::Create(*backend, config, 1, 2, 5, nn::OptimizerConfig::FromSpec(spec.train()));
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    EXPECT_FALSE((*runtime)->is_first());
    EXPECT_FALSE((*runtime)->is_last());
    const int64_t batch = 3, n = batch * t * config.d_model;
    std::vector<float> x = UnitDirection(n, 11), w = UnitDirection(n, 12);
    for (float& v : x) v *= std::sqrt(static_cast<float>(n));  // O(1) activations
    std::vector<float> y(n);
    auto loss_of = [&](const std::vector<float>& input) {
      ShardRuntime::Inputs in{batch, t, {}, {}, 1.0f, input};
      EXPECT_TRUE((*runtime)->Forward(0, in, absl::Span<float>(y)).ok());
      (*runtime)->Discard(0);
      return Dot(w, y);
    };
    ASSERT_TRUE((*runtime)->ZeroGrads().ok());
    ShardRuntime::Inputs in{batch, t, {}, {}, 1.0f, x};
    ASSERT_TRUE((*runtime)->Forward(0, in, absl::Span<float>(y)).ok());
    std::vector<float> dx(n);
    ASSERT_TRUE((*runtime)->Backward(0, w, absl::Span<float>(dx)).ok());

    const std::vector<float> d = CheckDirection(dx, 13);
    auto input_loss_at = [&](double step) {
      std::vector<float> moved(x);
      for (int64_t i = 0; i < n; ++i) moved[i] += static_cast<float>(step * kEps) * d[i];
      return loss_of(moved);
    };
    ExpectClose(CentralDerivative(input_loss_at), Dot(dx, d), "block input");
    CheckParameters(*backend, **runtime, [&] { return loss_of(x); });
  }
}

}  // namespace
}  // namespace shardline::worker
