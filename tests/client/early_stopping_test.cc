// Early stopping (train.early_stopping) through the real binaries:
// shardline-local's cluster stops where shardline-train stops and ends with
// the same best weights, bit for bit; the coordinator keeps that version
// and makes it the job's last.
#include <fstream>
#include <string>

#include "common/file_util.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/client/local_equivalence.h"
#include "tests/client/process_test_util.h"

namespace shardline::client {
namespace {

using testing::TempDir;

// Addition of `digits`-digit numbers on 2 stages × 2 replicas at learning
// rate `lr`, validated every 3 of `steps` steps, stopping early as
// `early_stopping` says.
std::string WriteSpec(const std::string& dir, int steps, const std::string& early_stopping, int digits = 2,
                      double lr = 0.003) {
  const std::string path = dir + "/spec.json";
  std::ofstream(path) << R"({"name": "early",
    "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 32, "n_heads": 2, "n_layers": 3},
    "data": {"kind": "addition", "digits": )" << digits << R"(},
    "train": {"steps": )" << steps << R"(, "global_batch": 8, "micro_batches": 2, "seed": 5, "log_every": 1,
              "eval_every": 3, "eval_examples": 40, "early_stopping": )" << early_stopping << R"(,
              "optimizer": {"kind": "adamw", "lr": )" << lr << R"(, "warmup_steps": 2}},
    "parallel": {"pipeline_stages": 2, "data_parallel": 2},
    "checkpoint": {"every_steps": 5}})";
  return path;
}

// min_delta 100 makes the first pass (after step 3) the best for good.
std::string Patience(int patience) {
  return R"({"patience": )" + std::to_string(patience) + R"(, "min_delta": 100})";
}

std::string StepOf(const std::string& weights) {
  auto file = common::ReadSafetensors(weights);
  EXPECT_TRUE(file.ok()) << weights;
  return file.ok() && file->metadata.count("step") ? file->metadata.at("step") : "";
}

// Passes after 3 (the best), 6 and 9: the patience of 2 runs out after 9,
// of 12 steps. Both stop there, record the same (steps 1-9, the passes
// after 3 and 6 before their steps' records, the one after 9 last) and
// end with step 3's weights.
TEST(EarlyStoppingTest, TheClusterStopsWhereTheReferenceStopsWithTheBestWeights) {
  const std::string dir = TempDir("early-stop");
  ExpectLocalEqualsTrain(dir, WriteSpec(dir, 12, Patience(2)), {}, 12);
  const auto records = Lines(dir + "/local/metrics.jsonl");
  EXPECT_EQ(Field(records[2], "step"), "3");
  EXPECT_NE(Field(records[2], "accuracy"), "");
  EXPECT_EQ(Field(records[10], "step"), "9");
  EXPECT_EQ(Field(records[11], "step"), "9") << "the last pass, the run's final record";
  EXPECT_NE(Field(records[11], "accuracy"), "");
  EXPECT_EQ(StepOf(dir + "/ref.safetensors"), "3");
  EXPECT_EQ(StepOf(dir + "/local.safetensors"), "3");
  const std::string want =
      "stopped early after step 9: 2 validation passes without improving on step 3's loss ";
  EXPECT_NE(common::ReadFile(dir + "/train.log").value_or("").find(want), std::string::npos);
  const std::string local = common::ReadFile(dir + "/local.log").value_or("");
  EXPECT_NE(local.find(want), std::string::npos) << local;
  EXPECT_NE(local.find("the weights are step 3's"), std::string::npos);
}

// A patience the run never exhausts: it trains every step, and still ends
// with its best pass's weights (after step 3, of passes after 3 and 6).
TEST(EarlyStoppingTest, ARunThatNeverStopsEarlyStillEndsWithItsBestWeights) {
  const std::string dir = TempDir("best");
  // Steps 1-6, the pass after 3, then the final one after 6.
  ExpectLocalEqualsTrain(dir, WriteSpec(dir, 6, Patience(10)), {}, 8);
  EXPECT_EQ(Field(Lines(dir + "/local/metrics.jsonl")[7], "step"), "6");
  EXPECT_EQ(StepOf(dir + "/ref.safetensors"), "3");
  EXPECT_EQ(StepOf(dir + "/local.safetensors"), "3");
  const std::string local = common::ReadFile(dir + "/local.log").value_or("");
  EXPECT_NE(local.find("the weights are step 3's, the best validation pass (accuracy "), std::string::npos) << local;
}

// Judged on accuracy: one-digit addition's 15 held-out problems are 0%
// right after step 3, 6.67% after 6, 9 and 12 (while the loss falls: on
// the loss it would run to the end): the pass after 6 is the best,
// and the patience of 2 runs out after 12 of 15 steps.
TEST(EarlyStoppingTest, OnAccuracyTheClusterStopsWhereTheReferenceStops) {
  const std::string dir = TempDir("accuracy");
  // Steps 1-12 and the passes after 3, 6, 9 and 12.
  ExpectLocalEqualsTrain(dir, WriteSpec(dir, 15, R"({"patience": 2, "monitor": "accuracy"})", 1, 0.01), {}, 16);
  const auto records = Lines(dir + "/local/metrics.jsonl");
  ASSERT_EQ(records.size(), 16u);
  EXPECT_EQ(Field(records[6], "step"), "6");
  EXPECT_EQ(Field(records[6], "accuracy"), "0.066666666666666666");
  EXPECT_EQ(Field(records[15], "step"), "12") << "the last pass, the run's final record";
  EXPECT_EQ(StepOf(dir + "/ref.safetensors"), "6");
  EXPECT_EQ(StepOf(dir + "/local.safetensors"), "6");
  const std::string want =
      "stopped early after step 12: 2 validation passes without improving on step 6's accuracy 6.67%; the "
      "weights are step 6's";
  EXPECT_NE(common::ReadFile(dir + "/train.log").value_or("").find(want), std::string::npos);
  const std::string local = common::ReadFile(dir + "/local.log").value_or("");
  EXPECT_NE(local.find(want), std::string::npos) << local;
}

}  // namespace
}  // namespace shardline::client
