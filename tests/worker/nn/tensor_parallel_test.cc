// Tensor parallelism (Megatron's splits, nn/tensor_parallel.h) checked on t
// ranks in-process, each a thread with its own CPU backend and a rank of an
// in-process group: the ranks' parameter slices put together are the whole
// model's (the same initial values), the loss and the gradients put
// together are those of the unsplit model (the split sums change a GEMM's
// order: within 1e-5), the replicated parameters' gradients are the same
// bits on every rank, and finite differences through a split block (its
// input and every parameter) and through the whole split model (every
// parameter, along a direction in the global layout) agree with them; with
// the vocabulary-parallel embedding and head too (their slices and
// parallel cross-entropy), and without (replicated).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/job_spec.h"
#include "common/rng.h"
#include "common/tensor.h"
#include "gtest/gtest.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/collective/in_process_collective.h"
#include "worker/data/data_source.h"
#include "worker/runtime/shard_runtime.h"

namespace shardline::worker {
namespace {

using runtime::ShardRuntime;

constexpr double kEps = 1e-2;

shardline::v1::JobSpec Spec() {
  auto spec = common::ParseJobSpec(R"({"name": "tp",
    "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 32, "n_heads": 4, "n_layers": 2},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": 10, "global_batch": 4, "micro_batches": 1, "seed": 5,
              "optimizer": {"kind": "adamw", "lr": 0.01}}})");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

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

// Mostly along the gradient (a large derivative against the loss's f32
// noise), plus a random part (a gradient wrong in direction shows).
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

// Richardson-extrapolated central difference (steps ε and 2ε).
double CentralDerivative(const std::function<double(double)>& loss_at) {
  const double narrow = (loss_at(1.0) - loss_at(-1.0)) / (2 * kEps);
  const double wide = (loss_at(2.0) - loss_at(-2.0)) / (4 * kEps);
  return (4 * narrow - wide) / 3;
}

void ExpectClose(double fd, double analytic, const std::string& what) {
  EXPECT_LE(std::fabs(fd - analytic), 1e-5 + 2e-3 * std::fabs(analytic))
      << what << ": finite difference " << fd << " vs analytic " << analytic;
}

std::vector<float> Host(Backend& backend, DeviceSpan<float> span) {
  std::vector<float> out(span.size());
  EXPECT_TRUE(backend.CopyToHost(DeviceSpan<const float>(span), absl::Span<float>(out)).ok());
  return out;
}

// Units [begin, end) of the model on t ranks.
class TensorGroup {
 public:
  TensorGroup(const nn::ModelConfig& config, int begin, int end, int t, const nn::OptimizerConfig& optimizer,
              bool split_vocab = false) {
    group_ = std::move(*collective::InProcessGroup::Create(t, absl::Seconds(60)));
    for (int r = 0; r < t; ++r) {
      backends_.push_back(testing::CpuBackend());
      ranks_.push_back(group_->Rank(r, *backends_.back()));
      auto created = ShardRuntime::Create(*backends_.back(), config, begin, end, 5, optimizer,
                                          nn::TensorParallel{r, t, ranks_.back().get(), split_vocab});
      EXPECT_TRUE(created.ok()) << created.status();
      runtimes_.push_back(std::move(*created));
    }
  }
  int size() const { return static_cast<int>(runtimes_.size()); }
  ShardRuntime& runtime(int r) { return *runtimes_[r]; }
  Backend& backend(int r) { return *backends_[r]; }

  // fn(rank) on every rank at once: their collective calls meet.
  void OnEveryRank(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) threads.emplace_back(fn, r);
    for (auto& thread : threads) thread.join();
  }

  // Parameter i's gradient (or value) in the global layout, put together
  // from the ranks' slices; a replicated parameter's from rank 0.
  std::vector<float> Global(size_t i, bool gradient) {
    nn::Parameter* first = runtime(0).parameters()[i];
    const int64_t count = *common::NumElements(first->global_shape);
    std::vector<float> global(static_cast<size_t>(count));
    for (int r = 0; r < (first->slice.whole() ? 1 : size()); ++r) {
      nn::Parameter* p = runtime(r).parameters()[i];
      const std::vector<float> local = Host(backend(r), gradient ? p->g() : p->v());
      nn::PutSlice(local, p->global_shape, p->slice, absl::Span<float>(global));
    }
    return global;
  }

 private:
  std::unique_ptr<collective::InProcessGroup> group_;
  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::unique_ptr<collective::Collective>> ranks_;
  std::vector<std::unique_ptr<ShardRuntime>> runtimes_;
};

class TensorParallelTest : public ::testing::TestWithParam<int> {};
// (t, vocabulary-parallel embedding and head)
class TensorParallelModelTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// The whole model, ids to loss: the split one against the unsplit one, and
// finite differences along global directions through the split one.
TEST_P(TensorParallelModelTest, TheSplitModelComputesTheWholeModelsLossAndGradients) {
  const auto [t, split_vocab] = GetParam();
  const auto spec = Spec();
  const nn::ModelConfig config = nn::ModelConfig::FromSpec(spec.model());
  const nn::OptimizerConfig optimizer = nn::OptimizerConfig::FromSpec(spec.train());
  auto data = data::CreateDataSource(spec);
  ASSERT_TRUE(data.ok());
  const data::Batch batch = (*data)->TrainBatch(1, 0, 4).value();
  const ShardRuntime::Inputs in{batch.batch, batch.t, batch.ids, batch.targets,
                                static_cast<float>(1.0 / batch.target_count()), {}};

  auto backend = testing::CpuBackend();
  auto whole = ShardRuntime::Create(*backend, config, 0, config.units(), 5, optimizer);
  ASSERT_TRUE(whole.ok());
  ASSERT_TRUE((*whole)->ZeroGrads().ok());
  ASSERT_TRUE((*whole)->Forward(0, in).ok());
  const double whole_loss = *(*whole)->Loss(0);
  ASSERT_TRUE((*whole)->Backward(0, {}).ok());

  TensorGroup split(config, 0, config.units(), t, optimizer, split_vocab);
  std::vector<double> losses(t);
  split.OnEveryRank([&](int r) {
    ShardRuntime& rt = split.runtime(r);
    ASSERT_TRUE(rt.ZeroGrads().ok());
    ASSERT_TRUE(rt.Forward(0, in).ok());
    losses[r] = *rt.Loss(0);
    ASSERT_TRUE(rt.Backward(0, {}).ok());
  });
  EXPECT_NEAR(losses[0], whole_loss, 1e-5 * whole_loss);
  for (int r = 1; r < t; ++r) EXPECT_EQ(losses[r], losses[0]) << "every rank computes the same loss";

  const std::vector<nn::Parameter*> params = (*whole)->parameters();
  ASSERT_EQ(split.runtime(0).parameters().size(), params.size());
  int sliced = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    nn::Parameter* mine = split.runtime(0).parameters()[i];
    SCOPED_TRACE(mine->name);
    ASSERT_EQ(mine->name, params[i]->name);
    ASSERT_EQ(mine->global_shape, params[i]->shape);
    sliced += !mine->slice.whole();
    EXPECT_EQ(split.Global(i, /*gradient=*/false), Host(*backend, params[i]->v())) << "initial values";
    const std::vector<float> want = Host(*backend, params[i]->g()), got = split.Global(i, /*gradient=*/true);
    double scale = 0;
    for (float g : want) scale = std::max(scale, static_cast<double>(std::fabs(g)));
    for (size_t j = 0; j < want.size(); ++j) ASSERT_NEAR(got[j], want[j], 1e-5 * scale + 1e-9) << "[" << j << "]";
    if (mine->slice.whole()) {
      for (int r = 1; r < t; ++r) {
        EXPECT_EQ(Host(split.backend(r), split.runtime(r).parameters()[i]->g()), Host(split.backend(0), mine->g()))
            << "a replicated parameter's gradient on rank " << r;
      }
    }
  }
  EXPECT_EQ(sliced, 2 * 6 + (split_vocab ? 2 : 0))
      << "qkv, proj, fc and mlp.proj weights, qkv and fc biases, in each of 2 blocks; vocabulary-parallel, "
         "tok_emb and lm_head";

  // Finite differences of the split model along each parameter's global
  // direction, every rank moving its slice of it.
  for (size_t i = 0; i < params.size(); ++i) {
    const std::vector<float> grad = split.Global(i, true), value = split.Global(i, false);
    const std::vector<float> d = CheckDirection(grad, common::HashString(params[i]->name));
    auto loss_at = [&](double step) {
      split.OnEveryRank([&](int r) {
        nn::Parameter* p = split.runtime(r).parameters()[i];
        std::vector<float> local = nn::TakeSlice(value, p->global_shape, p->slice);
        const std::vector<float> dl = nn::TakeSlice(d, p->global_shape, p->slice);
        for (size_t j = 0; j < local.size(); ++j) local[j] += static_cast<float>(step * kEps) * dl[j];
        ASSERT_TRUE(split.backend(r).CopyToDevice(absl::Span<const float>(local), p->v()).ok());
        ASSERT_TRUE(split.runtime(r).Forward(0, in).ok());
        losses[r] = *split.runtime(r).Loss(0);
        split.runtime(r).Discard(0);
      });
      return losses[0];
    };
    const double fd = CentralDerivative(loss_at);
    loss_at(0);  // back to the exact values
    ExpectClose(fd, Dot(grad, d), params[i]->name);
  }
}

// One split block: its input gradient (the same on every rank) and every
// parameter against finite differences of Σ w·y.
TEST_P(TensorParallelTest, ASplitBlocksInputAndParameterGradientsMatchFiniteDifferences) {
  const int t = GetParam();
  const auto spec = Spec();
  const nn::ModelConfig config = nn::ModelConfig::FromSpec(spec.model());
  TensorGroup split(config, 1, 2, t, nn::OptimizerConfig::FromSpec(spec.train()));
  const int64_t batch = 3, steps = 7, n = batch * steps * config.d_model;
  std::vector<float> x = UnitDirection(n, 11), w = UnitDirection(n, 12);
  for (float& v : x) v *= 20.0f;  // O(1) activations
  std::vector<std::vector<float>> dx(t, std::vector<float>(n)), y(t, std::vector<float>(n));
  split.OnEveryRank([&](int r) {
    ShardRuntime& rt = split.runtime(r);
    ASSERT_TRUE(rt.ZeroGrads().ok());
    ASSERT_TRUE(rt.Forward(0, ShardRuntime::Inputs{batch, steps, {}, {}, 1.0f, x}, absl::Span<float>(y[r])).ok());
    ASSERT_TRUE(rt.Backward(0, w, absl::Span<float>(dx[r])).ok());
  });
  for (int r = 1; r < t; ++r) {
    EXPECT_EQ(y[r], y[0]) << "the output is the same on every rank";
    EXPECT_EQ(dx[r], dx[0]) << "the input gradient is the same on every rank";
  }
  std::vector<double> losses(t);
  auto loss_of = [&](const std::vector<float>& input) {
    split.OnEveryRank([&](int r) {
      ASSERT_TRUE(split.runtime(r)
                      .Forward(0, ShardRuntime::Inputs{batch, steps, {}, {}, 1.0f, input}, absl::Span<float>(y[r]))
                      .ok());
      split.runtime(r).Discard(0);
      losses[r] = Dot(w, y[r]);
    });
    return losses[0];
  };
  const std::vector<float> d = CheckDirection(dx[0], 13);
  ExpectClose(CentralDerivative([&](double step) {
                std::vector<float> moved(x);
                for (int64_t i = 0; i < n; ++i) moved[i] += static_cast<float>(step * kEps) * d[i];
                return loss_of(moved);
              }),
              Dot(dx[0], d), "block input");
  const size_t count = split.runtime(0).parameters().size();
  for (size_t i = 0; i < count; ++i) {
    const std::string name = split.runtime(0).parameters()[i]->name;
    const std::vector<float> grad = split.Global(i, true), value = split.Global(i, false);
    const std::vector<float> dir = CheckDirection(grad, common::HashString(name));
    auto set = [&](double step) {
      split.OnEveryRank([&](int r) {
        nn::Parameter* p = split.runtime(r).parameters()[i];
        std::vector<float> local = nn::TakeSlice(value, p->global_shape, p->slice);
        const std::vector<float> dl = nn::TakeSlice(dir, p->global_shape, p->slice);
        for (size_t j = 0; j < local.size(); ++j) local[j] += static_cast<float>(step * kEps) * dl[j];
        ASSERT_TRUE(split.backend(r).CopyToDevice(absl::Span<const float>(local), p->v()).ok());
      });
    };
    const double fd = CentralDerivative([&](double step) {
      set(step);
      return loss_of(x);
    });
    set(0);
    ExpectClose(fd, Dot(grad, dir), name);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, TensorParallelTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return absl::StrCat("t", info.param); });
INSTANTIATE_TEST_SUITE_P(Ranks, TensorParallelModelTest, ::testing::Combine(::testing::Values(2, 4), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
                           return absl::StrCat("t", std::get<0>(info.param),
                                               std::get<1>(info.param) ? "_vocab_parallel" : "_vocab_replicated");
                         });

TEST(TensorParallelConfigTest, ASplitThatDoesNotDivideTheHeadsOrTheMlpIsRefused) {
  nn::ModelConfig config = nn::ModelConfig::FromSpec(Spec().model());
  auto backend = testing::CpuBackend();
  auto group = collective::InProcessGroup::Create(3, absl::Seconds(1));
  ASSERT_TRUE(group.ok());
  auto rank = (*group)->Rank(0, *backend);
  auto created = ShardRuntime::Create(*backend, config, 0, config.units(), 5,
                                      nn::OptimizerConfig::FromSpec(Spec().train()),
                                      nn::TensorParallel{0, 3, rank.get()});
  EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(created.status().message().find("n_heads"), std::string::npos) << created.status();
}

TEST(TensorParallelConfigTest, AVocabularySplitThatDoesNotDivideTheVocabularyIsRefused) {
  nn::ModelConfig config = nn::ModelConfig::FromSpec(Spec().model());  // vocabulary 16
  auto backend = testing::CpuBackend();
  auto group = collective::InProcessGroup::Create(3, absl::Seconds(1));
  ASSERT_TRUE(group.ok());
  auto rank = (*group)->Rank(0, *backend);
  for (int unit : {0, config.units() - 1}) {  // the embedding, the head
    auto created = ShardRuntime::Create(*backend, config, unit, unit + 1, 5,
                                        nn::OptimizerConfig::FromSpec(Spec().train()),
                                        nn::TensorParallel{0, 3, rank.get(), /*split_vocab=*/true});
    EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument) << "unit " << unit;
    EXPECT_NE(created.status().message().find("vocabulary (16)"), std::string::npos) << created.status();
  }
}

// Each row's most likely class (ShardRuntime::Inputs::argmax, exact-match
// validation) is the first of its largest logits over the whole vocabulary,
// on the whole head and on a vocabulary-parallel one over 2 and 4 ranks:
// the head's weights give row 0 a tie between class 3 and class 11 (another
// rank's, split) and row 1 one between classes 9 and 12.
TEST(TensorParallelArgMaxTest, TheFirstOfTheLargestLogitsOverTheWholeVocabulary) {
  const nn::ModelConfig config = nn::ModelConfig::FromSpec(Spec().model());
  const nn::OptimizerConfig optimizer = nn::OptimizerConfig::FromSpec(Spec().train());
  const int64_t d = config.d_model, vocab = config.vocab;
  std::vector<float> p(static_cast<size_t>(d)), q(static_cast<size_t>(d));  // orthogonal, LayerNorm keeps them
  for (int64_t i = 0; i < d; ++i) {
    p[static_cast<size_t>(i)] = i % 2 == 0 ? 1.0f : -1.0f;
    q[static_cast<size_t>(i)] = i % 4 < 2 ? 1.0f : -1.0f;
  }
  std::map<std::string, common::Tensor> weights;
  const int head = config.units() - 1;
  auto backend = testing::CpuBackend();
  auto whole = ShardRuntime::Create(*backend, config, head, head + 1, 5, optimizer);
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (nn::Parameter* param : (*whole)->parameters()) {
    auto tensor = common::Tensor::Zeros(common::DType::kF32, param->global_shape);
    ASSERT_TRUE(tensor.ok());
    absl::Span<float> v = tensor->values<float>();
    if (param->global_shape.size() == 2) {  // lm_head.weight [vocab × d]
      for (int64_t c = 0; c < vocab; ++c) {
        for (int64_t i = 0; i < d; ++i) {
          const float pi = p[static_cast<size_t>(i)], qi = q[static_cast<size_t>(i)];
          v[static_cast<size_t>(c * d + i)] = c == 3 || c == 11 ? pi : c == 9 || c == 12 ? qi : 0.1f * (pi + qi);
        }
      }
    } else if (absl::EndsWith(param->name, "weight")) {
      std::fill(v.begin(), v.end(), 1.0f);  // ln_f: gain 1, bias 0
    }
    weights.emplace(param->name, *std::move(tensor));
  }
  std::vector<float> x(p);
  x.insert(x.end(), q.begin(), q.end());
  ShardRuntime::Inputs in;
  in.batch = 2;
  in.t = 1;
  in.activations = x;
  std::vector<int32_t> want(2);
  in.argmax = absl::MakeSpan(want);
  ASSERT_TRUE((*whole)->ImportWeights(weights).ok());
  ASSERT_TRUE((*whole)->Forward(0, in).ok());
  EXPECT_EQ(want, (std::vector<int32_t>{3, 9}));
  for (int t : {2, 4}) {
    SCOPED_TRACE(absl::StrCat(t, " ranks"));
    TensorGroup split(config, head, head + 1, t, optimizer, /*split_vocab=*/true);
    std::vector<std::vector<int32_t>> got(static_cast<size_t>(t), std::vector<int32_t>(2, -1));
    split.OnEveryRank([&](int r) {
      ASSERT_TRUE(split.runtime(r).ImportWeights(weights).ok());
      ShardRuntime::Inputs mine = in;
      mine.argmax = absl::MakeSpan(got[static_cast<size_t>(r)]);
      ASSERT_TRUE(split.runtime(r).Forward(0, mine).ok());
    });
    for (int r = 0; r < t; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], want) << "rank " << r;
  }
}

}  // namespace
}  // namespace shardline::worker
