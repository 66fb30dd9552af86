// The pipeline against the reference trainer (design brief §4): for 1 to 4
// stages, even and uneven cuts, all three schedules, micro-batch counts that
// are not multiples of the stage count and sequences long enough for the
// attention to recompute its weights, every step's loss and grad norm and
// the final weights must equal shardline-train's bit for bit on the CPU
// backend: each stage runs the trainer's arithmetic on its layers, in the
// same order (micro-batches in index order, the grad norm's terms added in
// parameter order across the stages). The stages run in-process
// (LocalPipeline), so this checks the runtime and the schedules; the
// networked workers reuse both.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/deferred_copy_backend.h"
#include "tests/testing/local_pipeline.h"
#include "tests/testing/partly_trained.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/trainer/trainer.h"

namespace shardline::worker::runtime {
namespace {

constexpr int kSteps = 4;

struct Case {
  std::vector<int> cuts;  // first unit of stages 1..p−1; the tiny model has 4 units
  std::string schedule;
  int micro_batches;
  // Text of 300-byte sequences: longer than the CPU attention's key tile, so
  // the blocks keep a log-sum-exp and recompute the weights.
  bool long_sequences = false;
};

std::string Name(const Case& c) {
  std::string cuts;
  for (int cut : c.cuts) absl::StrAppend(&cuts, "_", cut);
  return absl::StrCat(c.cuts.size() + 1, "stages", cuts, "_", c.schedule, "_m", c.micro_batches,
                      c.long_sequences ? "_long" : "");
}

// A corpus of 300-byte windows for the long-sequence cases.
void UseLongSequences(shardline::v1::JobSpec& spec) {
  const std::string path = ::testing::TempDir() + "/long_corpus.txt";
  {
    std::ofstream file(path);
    for (int i = 0; i < 400; ++i) file << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  spec.mutable_model()->set_vocab_size(256);
  spec.mutable_model()->set_context(300);
  spec.mutable_data()->Clear();
  spec.mutable_data()->set_kind("text_bytes");
  spec.mutable_data()->set_path(path);
  spec.mutable_data()->set_val_fraction(0.1);
}

class PipelineEquivalenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineEquivalenceTest, LossesAndWeightsMatchTheReferenceTrainer) {
  const Case& c = GetParam();
  auto spec = testing::TinySpec(c.micro_batches, /*global_batch=*/2 * c.micro_batches);
  spec.mutable_parallel()->set_pipeline_stages(static_cast<int>(c.cuts.size()) + 1);
  spec.mutable_parallel()->set_schedule(c.schedule);
  spec.mutable_train()->mutable_optimizer()->set_grad_clip(1.0);  // exercises the norm reduction
  if (c.long_sequences) UseLongSequences(spec);

  auto backend = testing::CpuBackend();
  auto reference = trainer::Trainer::Create(spec, *backend);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto pipeline = shardline::testing::LocalPipeline::Create(spec, c.cuts);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();

  const int p = (*pipeline)->stages();
  for (int step = 1; step <= kSteps; ++step) {
    auto want = (*reference)->TrainStep(step);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = (*pipeline)->RunStep(step);
    ASSERT_TRUE(got.ok()) << got.status();
    const StageStepResult& last = got->back();
    EXPECT_EQ(last.loss, want->loss) << "step " << step;
    EXPECT_EQ(last.grad_norm, want->grad_norm) << "step " << step;
    for (int s = 0; s < p; ++s) {
      const size_t bound = c.schedule == "1f1b" ? std::min(p - s, c.micro_batches)
                           : c.schedule == "zb" ? std::min(p - s + 1, c.micro_batches)
                                                : c.micro_batches;
      EXPECT_EQ((*got)[s].peak_slots, bound) << "stage " << s << " step " << step;
      EXPECT_EQ((*got)[s].grad_norm, last.grad_norm) << "every stage sees the same global norm";
      // The passes' device time: some, and within the step.
      EXPECT_GT((*got)[s].busy_seconds, 0.0) << "stage " << s;
      EXPECT_LE((*got)[s].busy_seconds, (*got)[s].step_seconds) << "stage " << s;
    }
  }
  auto want_weights = (*reference)->runtime().ExportWeights();
  auto got_weights = (*pipeline)->ExportWeights();
  ASSERT_TRUE(want_weights.ok() && got_weights.ok());
  ASSERT_EQ(got_weights->size(), want_weights->size());
  for (const auto& [name, want] : *want_weights) {
    const auto& got = got_weights->at(name);
    ASSERT_EQ(got.shape(), want.shape()) << name;
    const auto a = got.values<float>(), b = want.values<float>();
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << name << "[" << i << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Splits, PipelineEquivalenceTest,
    ::testing::Values(Case{{}, "1f1b", 3}, Case{{2}, "1f1b", 3}, Case{{1}, "gpipe", 5},
                      Case{{3}, "1f1b", 5}, Case{{1, 3}, "1f1b", 4}, Case{{1, 2}, "gpipe", 2},
                      Case{{1, 2, 3}, "1f1b", 5}, Case{{1, 2, 3}, "gpipe", 3},
                      Case{{1, 2, 3}, "1f1b", 1}, Case{{}, "zb", 3}, Case{{2}, "zb", 4},
                      Case{{1, 3}, "zb", 5}, Case{{1, 2, 3}, "zb", 6}, Case{{1, 2, 3}, "zb", 1},
                      Case{{2}, "1f1b", 3, true}, Case{{1, 3}, "zb", 3, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return Name(info.param); });

// Validation passes between steps (train.eval_every) give the trainer's
// validation loss bit for bit, over the same windows, on any cut; the
// last batch is partial (7 or 6 windows in batches of 2), and the long
// sequences recompute the attention weights.
TEST(PipelineValidationTest, ValidationLossesMatchTheReferenceTrainer) {
  for (const bool long_sequences : {false, true}) {
    for (const std::vector<int>& cuts : {std::vector<int>{}, std::vector<int>{2}, std::vector<int>{1, 2, 3}}) {
      SCOPED_TRACE(::testing::Message() << cuts.size() + 1 << " stages" << (long_sequences ? ", long" : ""));
      auto spec = testing::TinySpec(/*micro_batches=*/2, /*global_batch=*/4);
      UseLongSequences(spec);
      if (!long_sequences) spec.mutable_model()->set_context(16);
      spec.mutable_parallel()->set_pipeline_stages(static_cast<int>(cuts.size()) + 1);
      spec.mutable_train()->set_steps(6);
      spec.mutable_train()->set_eval_every(2);
      spec.mutable_train()->set_eval_examples(7);
      auto backend = testing::CpuBackend();
      auto reference = trainer::Trainer::Create(spec, *backend);
      ASSERT_TRUE(reference.ok()) << reference.status();
      auto pipeline = shardline::testing::LocalPipeline::Create(spec, cuts);
      ASSERT_TRUE(pipeline.ok()) << pipeline.status();
      for (int step = 1; step <= 4; ++step) {
        ASSERT_TRUE((*reference)->TrainStep(step).ok());
        ASSERT_TRUE((*pipeline)->RunStep(step).ok());
        if (step % 2 != 0) continue;
        auto want = (*reference)->Evaluate();
        ASSERT_TRUE(want.ok()) << want.status();
        auto got = (*pipeline)->Evaluate(step);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(got->back().loss, want->val_loss) << "step " << step;
        EXPECT_GT(want->val_loss, 1.0);
        for (const StageEvalResult& stage : *got) EXPECT_EQ(stage.windows, want->examples);
        EXPECT_GE(want->examples, 6);
      }
      // Training goes on after a pass as if there had been none.
      auto want = (*reference)->TrainStep(5);
      auto got = (*pipeline)->RunStep(5);
      ASSERT_TRUE(want.ok() && got.ok());
      EXPECT_EQ(got->back().loss, want->loss);
    }
  }
}

// Addition's validation (exact match: the held-out problems whose every
// answer digit is the model's most likely token) counts the same problems
// right on any cut as the trainer, with the same loss, on a model trained
// until it answers some problems and not others (the one-stage pipeline on
// a bf16 wire, which has no edge to round).
TEST(PipelineValidationTest, ExactMatchMatchesTheReferenceTrainer) {
  auto spec = testing::TinySpec(/*micro_batches=*/2, /*global_batch=*/32);
  spec.mutable_model()->set_d_model(32);
  spec.mutable_train()->mutable_optimizer()->set_lr(0.005);
  spec.mutable_train()->mutable_optimizer()->set_warmup_steps(20);
  spec.mutable_train()->set_steps(3000);
  spec.mutable_train()->set_eval_every(100);
  spec.mutable_train()->set_eval_examples(200);  // 12 batches of 16 and one of 8
  auto trained = shardline::testing::TrainUntilPartlyRight(spec);
  ASSERT_TRUE(trained.ok()) << trained.status();
  const trainer::EvalResult& want = trained->eval;
  ASSERT_TRUE(want.exact_match);
  for (const std::vector<int>& cuts : {std::vector<int>{}, std::vector<int>{2}, std::vector<int>{1, 2, 3}}) {
    SCOPED_TRACE(::testing::Message() << cuts.size() + 1 << " stages");
    spec.mutable_parallel()->set_pipeline_stages(static_cast<int>(cuts.size()) + 1);
    // One stage has no edge: a 16-bit wire changes nothing of its pass.
    spec.mutable_parallel()->set_wire_dtype(cuts.empty() ? "bf16" : "f32");
    auto pipeline = shardline::testing::LocalPipeline::Create(spec, cuts);
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    for (int stage = 0; stage < (*pipeline)->stages(); ++stage) {
      ASSERT_TRUE((*pipeline)->runtime(stage).ImportWeights(trained->weights).ok());
    }
    auto got = (*pipeline)->Evaluate(1);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->back().matches, want.matches);
    EXPECT_EQ(got->back().loss, want.val_loss);
    for (const StageEvalResult& stage : *got) EXPECT_EQ(stage.windows, 200);
  }
}

// On a backend whose copies to the host finish later, as a GPU's do, the
// pipeline computes exactly what it computes on the plain CPU backend: the
// stages wait for each copy before sending, never overwrite what a copy still
// reads, and keep received tensors until they have been read. Both wire
// precisions (a 16-bit wire converts before the copy) and all three schedules.
TEST(PipelineAsyncCopyTest, CopiesThatFinishLaterChangeNothing) {
  for (const char* wire : {"f32", "bf16"}) {
    for (const char* schedule : {"1f1b", "gpipe", "zb"}) {
      SCOPED_TRACE(absl::StrCat(wire, " ", schedule));
      auto spec = testing::TinySpec(/*micro_batches=*/5, /*global_batch=*/10);
      spec.mutable_parallel()->set_pipeline_stages(3);
      spec.mutable_parallel()->set_schedule(schedule);
      spec.mutable_parallel()->set_wire_dtype(wire);
      spec.mutable_train()->mutable_optimizer()->set_grad_clip(1.0);
      auto plain = shardline::testing::LocalPipeline::Create(spec, {1, 3});
      ASSERT_TRUE(plain.ok()) << plain.status();
      std::vector<shardline::testing::DeferredCopyBackend*> deferred;
      auto late = shardline::testing::LocalPipeline::Create(
          spec, {1, 3}, absl::Seconds(30), [&]() -> absl::StatusOr<std::unique_ptr<Backend>> {
            auto backend = std::make_unique<shardline::testing::DeferredCopyBackend>(absl::Microseconds(500));
            deferred.push_back(backend.get());
            return backend;
          });
      ASSERT_TRUE(late.ok()) << late.status();
      for (int step = 1; step <= kSteps; ++step) {
        auto want = (*plain)->RunStep(step);
        auto got = (*late)->RunStep(step);
        ASSERT_TRUE(want.ok() && got.ok()) << want.status() << " / " << got.status();
        EXPECT_EQ(got->back().loss, want->back().loss) << "step " << step;
        EXPECT_EQ(got->back().grad_norm, want->back().grad_norm) << "step " << step;
      }
      auto want_weights = (*plain)->ExportWeights();
      auto got_weights = (*late)->ExportWeights();
      ASSERT_TRUE(want_weights.ok() && got_weights.ok());
      for (const auto& [name, want] : *want_weights) {
        const common::Tensor& got = got_weights->at(name);
        const auto a = got.values<float>(), b = want.values<float>();
        ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << name;
      }
      int copies = 0, changes = 0;
      for (auto* backend : deferred) {
        copies += backend->deferred_copies();
        changes += backend->host_changes_seen();
      }
      EXPECT_GE(copies, kSteps * 5 * 2 * 2) << "the copies to the host really were deferred";
      EXPECT_EQ(changes, 0) << "host memory reused before the device had read it";
    }
  }
}

// The same on every backend built: four stages, each with a backend of its
// own on one device, against the reference trainer on that device. On CUDA
// this checks the asynchronous edge (copy stream, events, the stage sender,
// buffers kept until the device has read them) end to end.
class PipelineOnDeviceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineOnDeviceTest, FourStagesMatchTheReferenceTrainerOnTheSameDevice) {
  if (GetParam() != "cpu" && CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  for (const char* schedule : {"1f1b", "zb"}) {
    SCOPED_TRACE(schedule);
    auto spec = testing::TinySpec(/*micro_batches=*/8, /*global_batch=*/64);
    spec.mutable_model()->set_d_model(256);
    spec.mutable_model()->set_n_heads(4);
    spec.mutable_parallel()->set_pipeline_stages(4);
    spec.mutable_parallel()->set_schedule(schedule);
    auto backend = CreateBackend(GetParam(), {1});
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto reference = trainer::Trainer::Create(spec, **backend);
    ASSERT_TRUE(reference.ok()) << reference.status();
    auto pipeline = shardline::testing::LocalPipeline::Create(spec, {1, 2, 3}, absl::Seconds(60), GetParam());
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    // On the CPU this is the trainer's arithmetic: the same bits. On CUDA the
    // stages and the trainer run the same kernels on the same shapes, but each
    // stage has a cuBLAS handle of its own, and cuBLAS promises reproducible
    // results per handle configuration only; no GPU run has shown the bits yet,
    // so there 1e-5 relative.
    const double relative = GetParam() == "cpu" ? 0.0 : 1e-5;
    for (int step = 1; step <= kSteps; ++step) {
      auto want = (*reference)->TrainStep(step);
      ASSERT_TRUE(want.ok()) << want.status();
      auto got = (*pipeline)->RunStep(step);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_NEAR(got->back().loss, want->loss, relative * std::fabs(want->loss)) << "step " << step;
    }
    auto want_weights = (*reference)->runtime().ExportWeights();
    auto got_weights = (*pipeline)->ExportWeights();
    ASSERT_TRUE(want_weights.ok() && got_weights.ok());
    ASSERT_EQ(got_weights->size(), want_weights->size());
    for (const auto& [name, want] : *want_weights) {
      const common::Tensor& got = got_weights->at(name);
      const auto a = got.values<float>(), b = want.values<float>();
      ASSERT_EQ(a.size(), b.size()) << name;
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_NEAR(a[i], b[i], relative * std::fabs(b[i])) << name << "[" << i << "]";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, PipelineOnDeviceTest,
                         ::testing::ValuesIn(testing::BackendsUnderTest()), testing::BackendTestName);

}  // namespace
}  // namespace shardline::worker::runtime
