// Tensor parallelism in the pipeline against the reference trainer: p × d × t
// grids in-process (LocalGrid; every position its own CPU backend, the
// tensor-parallel and data-parallel groups in-process collectives) for
// (p, d, t) in {(1,1,2), (2,1,2), (1,2,2), (2,2,2), (1,1,4)}, with the
// embedding and the head replicated and (but (1,1,2) and (1,2,2))
// vocabulary-parallel, and (2,2,2) with ZeRO-1, with gradient
// clipping (the global norm counts every split parameter's parts once and
// a replicated one once): the loss at every one of 25 steps within 1e-5
// relative of shardline-train's (t = 1: the split sums change a GEMM's
// order, nothing else), the final weights put together from the ranks'
// slices within 1e-5 of the trainer's (the whole model's distance, relative
// to its size; each tensor within 1e-3), and two runs of the same grid the
// same bits. (Element by element the weights can differ more: the loss does
// not depend on the attention's key bias, whose gradient is rounding noise
// that AdamW's normalisation turns into steps of up to lr; and at 10× this
// rate, lr 0.01, the tiny model amplifies the rounding to 4e-5 in the loss
// by step 10.)
#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "tests/testing/local_grid.h"
#include "tests/testing/partly_trained.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/trainer/trainer.h"

namespace shardline::worker::runtime {
namespace {

using shardline::testing::LocalGrid;

constexpr int kSteps = 25;

struct Case {
  int stages;
  int replicas;
  int tensor;
  bool shard_optimizer = false;  // ZeRO-1 within each tensor rank's data-parallel group
  bool vocab_parallel = false;   // the embedding and the head split too
};

shardline::v1::JobSpec GridSpec(const Case& c) {
  auto spec = common::ParseJobSpec(R"({"name": "tp-grid",
    "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 32, "n_heads": 4, "n_layers": 2},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": 25, "global_batch": 8, "micro_batches": 2, "seed": 5,
              "optimizer": {"kind": "adamw", "lr": 0.001, "warmup_steps": 2, "grad_clip": 1.0}},
    "parallel": {"schedule": "1f1b"}})");
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->mutable_parallel()->set_pipeline_stages(c.stages);
  spec->mutable_parallel()->set_data_parallel(c.replicas);
  spec->mutable_parallel()->set_tensor_parallel(c.tensor);
  spec->mutable_parallel()->set_shard_optimizer(c.shard_optimizer);
  spec->mutable_parallel()->set_vocab_parallel(c.vocab_parallel);
  spec->mutable_train()->set_micro_batches(2);
  spec->mutable_train()->set_global_batch(4 * c.replicas);
  return *spec;
}

struct GridRun {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> weights;
};

GridRun RunGrid(const shardline::v1::JobSpec& spec, const std::vector<int>& cuts) {
  GridRun run;
  auto grid = shardline::testing::LocalGrid::Create(spec, cuts);
  EXPECT_TRUE(grid.ok()) << grid.status();
  if (!grid.ok()) return run;
  for (int64_t step = 1; step <= kSteps; ++step) {
    auto result = (*grid)->RunStep(step);
    EXPECT_TRUE(result.ok()) << "step " << step << ": " << result.status();
    if (!result.ok()) return run;
    run.losses.push_back(result->loss);
  }
  auto weights = (*grid)->ExportWeights();
  EXPECT_TRUE(weights.ok()) << weights.status();
  for (const auto& [name, tensor] : *weights) {
    const auto v = tensor.values<float>();
    run.weights[name] = std::vector<float>(v.begin(), v.end());
  }
  return run;
}

// The trainer and a grid of `spec` (cut after unit 2) trained together for
// `steps` steps, both validating after each: check(step, the trainer's
// validation, the grid's); the grid trains on after the last.
void TrainAndValidate(
    const shardline::v1::JobSpec& spec, int64_t steps,
    const std::function<void(int64_t, const trainer::EvalResult&, const LocalGrid::Validation&)>& check) {
  auto backend = testing::CpuBackend();
  auto trainer = trainer::Trainer::Create(spec, *backend);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto grid = LocalGrid::Create(spec, {2});
  ASSERT_TRUE(grid.ok()) << grid.status();
  for (int64_t step = 1; step <= steps; ++step) {
    ASSERT_TRUE((*trainer)->TrainStep(step).ok());
    ASSERT_TRUE((*grid)->RunStep(step).ok());
    auto want = (*trainer)->Evaluate();
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = (*grid)->Validate(step);
    ASSERT_TRUE(got.ok()) << got.status();
    check(step, *want, *got);
  }
  EXPECT_TRUE((*grid)->RunStep(steps + 1).ok()) << "the grid trains on after a pass";
}

// A validation pass through a 2 × 2 × 2 grid on text (tensor-parallel
// layers inside a forward-only pass): every position's last stage has the
// same loss, the trainer's within the split's rounding.
TEST(TensorParallelGridValidationTest, EveryPositionValidatesAsTheTrainerDoes) {
  const std::string path = ::testing::TempDir() + "/grid_corpus.txt";
  {
    std::ofstream file(path);
    for (int i = 0; i < 200; ++i) file << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  shardline::v1::JobSpec spec = GridSpec(Case{2, 2, 2});
  spec.mutable_model()->set_vocab_size(256);
  spec.mutable_data()->Clear();
  spec.mutable_data()->set_kind("text_bytes");
  spec.mutable_data()->set_path(path);
  spec.mutable_data()->set_val_fraction(0.1);
  spec.mutable_train()->set_eval_every(2);
  spec.mutable_train()->set_eval_examples(9);
  // Each replica runs its share of the batches, every tensor rank the same.
  TrainAndValidate(spec, 2, [](int64_t, const trainer::EvalResult& want, const LocalGrid::Validation& got) {
    EXPECT_EQ(got.replica_windows, (std::vector<int64_t>{5, 4})) << "batches of 2, 2, 2, 2, 1: 0, 2, 4 and 1, 3";
    EXPECT_EQ(got.windows, want.examples);
    EXPECT_LE(std::fabs(got.loss - want.val_loss), 1e-5 * want.val_loss) << got.loss << " vs " << want.val_loss;
  });
}

// Addition's exact match on a 2 × 2 × 2 grid, the LM head whole on each
// tensor rank and split over them (vocabulary-parallel: each rank's best
// class of each row gathered), with the weights of a reference trained
// until it answers some problems and not others: each replica runs its
// share of the batches, every tensor rank counting the same problems right,
// and together as many as the trainer, give or take the one or two whose
// answer the split sums' rounding could tip.
TEST(TensorParallelGridValidationTest, ExactMatchOnAGridCountsTheTrainersProblems) {
  shardline::v1::JobSpec spec = GridSpec(Case{2, 2, 2});
  spec.mutable_train()->set_global_batch(32);
  spec.mutable_train()->mutable_optimizer()->set_lr(0.005);
  spec.mutable_train()->mutable_optimizer()->set_warmup_steps(20);
  spec.mutable_train()->set_steps(3000);
  spec.mutable_train()->set_eval_every(100);
  spec.mutable_train()->set_eval_examples(200);
  auto trained = shardline::testing::TrainUntilPartlyRight(spec);
  ASSERT_TRUE(trained.ok()) << trained.status();
  const int64_t want = trained->eval.matches;
  for (const bool vocab_parallel : {false, true}) {
    SCOPED_TRACE(vocab_parallel ? "vocabulary-parallel head" : "whole head");
    spec.mutable_parallel()->set_vocab_parallel(vocab_parallel);
    ASSERT_EQ(common::VocabParallel(spec), vocab_parallel);
    auto grid = shardline::testing::LocalGrid::Create(spec, {2});
    ASSERT_TRUE(grid.ok()) << grid.status();
    for (int r = 0; r < 2; ++r) {
      for (int k = 0; k < 2; ++k) {
        for (int s = 0; s < 2; ++s) {
          ASSERT_TRUE((*grid)->position(r, k).runtime(s).ImportWeights(trained->weights).ok());
        }
      }
    }
    auto got = (*grid)->Validate(1);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->replica_windows, (std::vector<int64_t>{104, 96})) << "25 batches of 8, shared";
    EXPECT_LE(std::abs(got->matches - want), 2) << got->matches << " vs " << want;
    EXPECT_LE(std::fabs(got->loss - trained->eval.val_loss), 1e-5 * trained->eval.val_loss);
  }
}

// Four replicas and three validation batches: the fourth replica has none
// (its stage 0 tells stage 1 so) and the three shares add up to the
// trainer's loss bit for bit; the grid trains on and validates again.
TEST(TensorParallelGridValidationTest, AReplicaWithoutABatchSitsThePassOut) {
  shardline::v1::JobSpec spec = GridSpec(Case{2, 4, 1});
  spec.mutable_train()->set_eval_every(1);
  spec.mutable_train()->set_eval_examples(5);  // batches of 2, 2 and 1
  TrainAndValidate(spec, 2, [](int64_t step, const trainer::EvalResult& want, const LocalGrid::Validation& got) {
    EXPECT_EQ(got.replica_windows, (std::vector<int64_t>{2, 2, 1, 0}));
    EXPECT_EQ(got.loss, want.val_loss) << "step " << step;
  });
}

class TensorParallelGridTest : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelGridTest, MatchesTheTrainerWithinToleranceAndItselfBitForBit) {
  const Case& c = GetParam();
  const shardline::v1::JobSpec spec = GridSpec(c);
  const std::vector<int> cuts = c.stages == 1 ? std::vector<int>{} : std::vector<int>{2};

  auto backend = testing::CpuBackend();
  auto trainer = trainer::Trainer::Create(spec, *backend);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::vector<double> want;
  for (int64_t step = 1; step <= kSteps; ++step) {
    auto r = (*trainer)->TrainStep(step);
    ASSERT_TRUE(r.ok()) << r.status();
    want.push_back(r->loss);
  }

  const GridRun first = RunGrid(spec, cuts);
  ASSERT_EQ(first.losses.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(std::fabs(first.losses[i] - want[i]), 1e-5 * std::fabs(want[i]))
        << "step " << i + 1 << ": " << first.losses[i] << " vs the trainer's " << want[i];
  }
  auto reference = (*trainer)->runtime().ExportWeights();
  ASSERT_TRUE(reference.ok());
  ASSERT_EQ(first.weights.size(), reference->size());
  double model_gap = 0, model_size = 0;
  for (const auto& [name, tensor] : *reference) {
    const auto b = tensor.values<float>();
    const std::vector<float>& a = first.weights.at(name);
    ASSERT_EQ(a.size(), b.size()) << name;
    double gap = 0, size = 0;
    for (size_t i = 0; i < b.size(); ++i) {
      gap += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      size += static_cast<double>(b[i]) * b[i];
    }
    EXPECT_LE(std::sqrt(gap), 1e-3 * std::sqrt(size) + 1e-5) << name << ": a slice put back in the wrong place?";
    model_gap += gap;
    model_size += size;
  }
  EXPECT_LE(std::sqrt(model_gap), 1e-5 * std::sqrt(model_size));

  const GridRun second = RunGrid(spec, cuts);
  EXPECT_EQ(second.losses, first.losses) << "the same grid, another run: the same bits";
  EXPECT_TRUE(second.weights == first.weights);
}

INSTANTIATE_TEST_SUITE_P(Grids, TensorParallelGridTest,
                         ::testing::Values(Case{1, 1, 2}, Case{2, 1, 2}, Case{1, 2, 2}, Case{2, 2, 2}, Case{1, 1, 4},
                                           Case{2, 1, 2, false, true}, Case{2, 2, 2, false, true},
                                           Case{1, 1, 4, false, true}, Case{2, 2, 2, true, true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat("p", info.param.stages, "_d", info.param.replicas, "_t",
                                               info.param.tensor, info.param.shard_optimizer ? "_zero1" : "",
                                               info.param.vocab_parallel ? "_vocab" : "");
                         });

// Scatter/gather between the stages (each rank sends its part of a tensor,
// the receiving group all-gathers the parts: parallel.stage_link_layout)
// moves the same values as whole tensors do: the same bits, at every step
// and in the weights, for t = 2 and 4, data-parallel, vocabulary-parallel,
// and at a 16-bit wire precision (narrowed part by part).
TEST(TensorParallelStageLayoutTest, ScatterGatherEdgesGiveTheSameBitsAsWholeTensors) {
  struct Layout {
    Case grid;
    const char* wire;
  };
  for (const Layout& l : {Layout{Case{2, 1, 2}, "f32"}, Layout{Case{2, 2, 2, false, true}, "f32"},
                          Layout{Case{2, 1, 4}, "f32"}, Layout{Case{2, 1, 2}, "bf16"}}) {
    SCOPED_TRACE(absl::StrCat("(", l.grid.stages, ",", l.grid.replicas, ",", l.grid.tensor, ")",
                              l.grid.vocab_parallel ? " vocabulary-parallel" : "", " wire ", l.wire));
    shardline::v1::JobSpec spec = GridSpec(l.grid);
    spec.mutable_parallel()->set_wire_dtype(l.wire);
    spec.mutable_parallel()->set_stage_link_layout("same_rank");
    const GridRun whole = RunGrid(spec, {2});
    spec.mutable_parallel()->set_stage_link_layout("scatter_gather");
    const GridRun parts = RunGrid(spec, {2});
    ASSERT_EQ(whole.losses.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(parts.losses, whole.losses);
    EXPECT_TRUE(parts.weights == whole.weights);
  }
}

// The zero-bubble schedule (each backward pass split into its input and
// weight parts, the weight parts run later) gives 1F1B's bits on split
// stages too: the tensor group's all-reduces stay in the input part, and
// with replicas the gradient buckets start after the last weight part.
TEST(TensorParallelScheduleTest, ZeroBubbleGivesOneFOneBsBits) {
  for (const Case& c : {Case{2, 1, 2}, Case{2, 2, 2, true, true}}) {
    SCOPED_TRACE(absl::StrCat("(", c.stages, ",", c.replicas, ",", c.tensor, ")"));
    shardline::v1::JobSpec spec = GridSpec(c);
    spec.mutable_train()->set_micro_batches(3);
    spec.mutable_train()->set_global_batch(6 * c.replicas);
    const GridRun one = RunGrid(spec, {2});
    spec.mutable_parallel()->set_schedule("zb");
    const GridRun zb = RunGrid(spec, {2});
    ASSERT_EQ(one.losses.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(zb.losses, one.losses);
    EXPECT_TRUE(zb.weights == one.weights);
  }
}

// Resharding: the checkpoint of a (2,1,2) grid with the vocabulary split
// after 10 steps (each stage's shard in the global layout, the tensor ranks'
// slices put together) loads into a (1,2,1) grid, a (1,1,4) one with the
// embedding and head replicated and a (1,1,4) one with them split, whose
// step 11 loss is the uninterrupted (2,1,2) run's within 1e-5. (The global
// batch and its 4 micro-batches are the same in every grid: m = 4/d per
// replica.)
TEST(TensorParallelReshardingTest, ACheckpointOfOneGridResumesInAnother) {
  auto spec_for = [](int stages, int replicas, int tensor, bool vocab_parallel) {
    shardline::v1::JobSpec spec = GridSpec(Case{stages, replicas, tensor, false, vocab_parallel});
    spec.mutable_train()->set_global_batch(8);
    spec.mutable_train()->set_micro_batches(4 / replicas);
    return spec;
  };
  const shardline::v1::JobSpec from = spec_for(2, 1, 2, true);
  auto grid = shardline::testing::LocalGrid::Create(from, {2});
  ASSERT_TRUE(grid.ok()) << grid.status();
  for (int64_t step = 1; step <= 10; ++step) ASSERT_TRUE((*grid)->RunStep(step).ok());
  // Every rank of a stage exports at once (they put their slices together).
  std::map<std::string, common::Tensor> checkpoint;
  for (int s = 0; s < 2; ++s) {
    std::vector<absl::StatusOr<ShardRuntime::HostTensors>> shards(2, absl::UnknownError(""));
    std::vector<std::thread> threads;
    for (int k = 0; k < 2; ++k) {
      threads.emplace_back([&, k] { shards[k] = (*grid)->position(0, k).stage(s).ExportState(); });
    }
    for (auto& thread : threads) thread.join();
    ASSERT_TRUE(shards[0].ok() && shards[1].ok());
    for (auto& [name, tensor] : *shards[0]) {
      const auto a = tensor.values<float>(), b = shards[1]->at(name).values<float>();
      ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << name << ": the ranks' shards differ";
      checkpoint.emplace(name, std::move(tensor));
    }
  }
  auto uninterrupted = (*grid)->RunStep(11);
  ASSERT_TRUE(uninterrupted.ok());

  for (const auto& [replicas, tensor, vocab] : {std::tuple{2, 1, false}, std::tuple{1, 4, false}, std::tuple{1, 4, true}}) {
    SCOPED_TRACE(absl::StrCat("resumed as (1,", replicas, ",", tensor, ")", vocab ? " vocabulary-parallel" : ""));
    const shardline::v1::JobSpec to = spec_for(1, replicas, tensor, vocab);
    auto resumed = shardline::testing::LocalGrid::Create(to, {});
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    for (int r = 0; r < replicas; ++r) {
      for (int k = 0; k < tensor; ++k) {
        ASSERT_TRUE((*resumed)->position(r, k).stage(0).ImportState(checkpoint).ok());
      }
    }
    auto next = (*resumed)->RunStep(11);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_LE(std::fabs(next->loss - uninterrupted->loss), 1e-5 * std::fabs(uninterrupted->loss))
        << next->loss << " vs " << uninterrupted->loss;
  }
}

}  // namespace
}  // namespace shardline::worker::runtime
