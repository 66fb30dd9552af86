#include "common/job_spec.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardline::common {
namespace {

constexpr char kValid[] = R"({
  "name": "t",
  "model": {"kind": "gpt", "vocab_size": 16, "context": 16, "d_model": 32, "n_heads": 4, "n_layers": 2},
  "data": {"kind": "addition", "digits": 2},
  "train": {"steps": 10, "global_batch": 8, "micro_batches": 4, "seed": 3,
            "optimizer": {"kind": "adamw", "lr": 0.001}}
})";

// kValid with `from` replaced by `to`.
std::string Edit(const std::string& from, const std::string& to) {
  std::string s = kValid;
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

void ExpectInvalid(const std::string& json, const std::string& mention) {
  auto spec = ParseJobSpec(json);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find(mention), std::string::npos) << spec.status();
}

TEST(JobSpecTest, ValidSpecGetsDefaults) {
  auto spec = ParseJobSpec(kValid);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parallel().pipeline_stages(), 1);
  EXPECT_EQ(spec->parallel().schedule(), "1f1b");
  EXPECT_EQ(spec->parallel().wire_dtype(), "f32");
  EXPECT_DOUBLE_EQ(spec->train().optimizer().beta2(), 0.95);
  EXPECT_DOUBLE_EQ(spec->train().optimizer().weight_decay(), 0.1);
  EXPECT_DOUBLE_EQ(spec->data().holdout_fraction(), 0.1);
  EXPECT_EQ(spec->train().log_every(), 10);
}

TEST(JobSpecTest, SchedulesAreNamedAndZeroBubbleIsBounded) {
  std::string json = kValid;
  json.insert(json.rfind('}'), R"(, "parallel": {"schedule": "zb", "pipeline_stages": 2})");
  auto spec = ParseJobSpec(json);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parallel().schedule(), "zb");
  json = kValid;
  json.insert(json.rfind('}'), R"(, "parallel": {"schedule": "zero-bubble"})");
  ExpectInvalid(json, "parallel.schedule");
  json = Edit(R"("global_batch": 8, "micro_batches": 4)", R"("global_batch": 1048576, "micro_batches": 1048576)");
  json.insert(json.rfind('}'), R"(, "parallel": {"schedule": "zb", "pipeline_stages": 2})");
  ExpectInvalid(json, "with the 'zb' schedule");
}

TEST(JobSpecTest, UnknownFieldIsNamed) {
  ExpectInvalid(Edit(R"("digits": 2)", R"("digits": 2, "digtis": 3)"), "digtis");
}

TEST(JobSpecTest, HeadsMustDivideWidth) {
  ExpectInvalid(Edit(R"("n_heads": 4)", R"("n_heads": 5)"), "model.n_heads");
}

TEST(JobSpecTest, MicroBatchesMustDivideGlobalBatch) {
  ExpectInvalid(Edit(R"("micro_batches": 4)", R"("micro_batches": 3)"), "train.micro_batches");
}

TEST(JobSpecTest, ReplicasTimesMicroBatchesMustDivideGlobalBatch) {
  std::string json = kValid;  // global batch 8, 4 micro-batches
  json.insert(json.rfind('}'), R"(, "parallel": {"data_parallel": 2})");
  auto two = ParseJobSpec(json);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->parallel().data_parallel(), 2);
  json = kValid;
  json.insert(json.rfind('}'), R"(, "parallel": {"data_parallel": 4})");
  ExpectInvalid(json, "parallel.data_parallel");
}

// t must divide the heads (4 here) and the MLP width (4 × 32 = 128).
TEST(JobSpecTest, TensorParallelMustDivideTheHeadsAndTheMlp) {
  std::string json = kValid;
  json.insert(json.rfind('}'), R"(, "parallel": {"tensor_parallel": 4})");
  auto four = ParseJobSpec(json);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(four->parallel().tensor_parallel(), 4);
  EXPECT_EQ(ParseJobSpec(kValid)->parallel().tensor_parallel(), 1) << "the default";
  for (const char* bad : {"3", "8", "0"}) {
    json = kValid;
    json.insert(json.rfind('}'), std::string(R"(, "parallel": {"tensor_parallel": )") + bad + "}");
    ExpectInvalid(json, "parallel.tensor_parallel");
  }
}

// Unset, the embedding and the head are split where t divides the
// vocabulary and leaves each rank ≥ 64 rows; set, as asked, t dividing the
// vocabulary; never with t = 1.
TEST(JobSpecTest, VocabParallelDefaultsByRowsPerRankAndMustDivideTheVocabulary) {
  auto spec = ParseJobSpec(kValid);
  ASSERT_TRUE(spec.ok());
  spec->mutable_model()->set_vocab_size(128);
  EXPECT_FALSE(VocabParallel(*spec)) << "t = 1";
  spec->mutable_parallel()->set_tensor_parallel(2);
  EXPECT_TRUE(VocabParallel(*spec)) << "128 rows: 64 per rank";
  spec->mutable_parallel()->set_tensor_parallel(4);
  EXPECT_FALSE(VocabParallel(*spec)) << "32 per rank";
  spec->mutable_model()->set_vocab_size(258);
  spec->mutable_parallel()->set_tensor_parallel(4);
  EXPECT_FALSE(VocabParallel(*spec)) << "4 does not divide 258";
  spec->mutable_parallel()->set_vocab_parallel(false);
  spec->mutable_model()->set_vocab_size(256);
  EXPECT_FALSE(VocabParallel(*spec)) << "asked not to";
  spec->mutable_model()->set_vocab_size(16);
  spec->mutable_parallel()->set_vocab_parallel(true);
  EXPECT_TRUE(VocabParallel(*spec)) << "asked to: 4 rows per rank";

  std::string json = Edit(R"("vocab_size": 16)", R"("vocab_size": 18)");
  json.insert(json.rfind('}'), R"(, "parallel": {"tensor_parallel": 4, "vocab_parallel": true})");
  ExpectInvalid(json, "parallel.vocab_parallel");
  json = Edit(R"("vocab_size": 16)", R"("vocab_size": 18)");
  json.insert(json.rfind('}'), R"(, "parallel": {"tensor_parallel": 4})");
  EXPECT_TRUE(ParseJobSpec(json).ok()) << "unset: replicated, whatever the vocabulary";
}

TEST(JobSpecTest, StageLinkLayoutIsAutoByDefaultAndOneOfThree) {
  EXPECT_EQ(ParseJobSpec(kValid)->parallel().stage_link_layout(), "auto");
  for (const char* layout : {"same_rank", "scatter_gather", "auto"}) {
    std::string json = kValid;
    json.insert(json.rfind('}'), absl::StrCat(R"(, "parallel": {"stage_link_layout": ")", layout, R"("})"));
    EXPECT_TRUE(ParseJobSpec(json).ok()) << layout;
  }
  std::string json = kValid;
  json.insert(json.rfind('}'), R"(, "parallel": {"stage_link_layout": "broadcast"})");
  ExpectInvalid(json, "parallel.stage_link_layout");
}

TEST(JobSpecTest, WireDtypeIsOneOfFive) {
  for (const char* wire : {"f32", "bf16", "f16", "int8", "auto"}) {
    std::string json = kValid;
    json.insert(json.rfind('}'), absl::StrCat(R"(, "parallel": {"wire_dtype": ")", wire, R"("})"));
    EXPECT_TRUE(ParseJobSpec(json).ok()) << wire;
  }
  std::string json = kValid;
  json.insert(json.rfind('}'), R"(, "parallel": {"wire_dtype": "int4"})");
  ExpectInvalid(json, "parallel.wire_dtype");
}

TEST(JobSpecTest, PlacementIsPlannedByDefaultOrInOrder) {
  EXPECT_EQ(ParseJobSpec(kValid)->parallel().placement(), "planned");
  std::string json = kValid;
  json.insert(json.rfind('}'), R"(, "parallel": {"placement": "in_order"})");
  EXPECT_EQ(ParseJobSpec(json)->parallel().placement(), "in_order");
  json = kValid;
  json.insert(json.rfind('}'), R"(, "parallel": {"placement": "random"})");
  ExpectInvalid(json, "parallel.placement");
}

TEST(JobSpecTest, InitFromJobIsAJobId) {
  EXPECT_EQ(ParseJobSpec(kValid)->init().from_job(), "");
  std::string json = kValid;
  json.insert(json.rfind('}'), R"(, "init": {"from_job": "job-3"})");
  EXPECT_EQ(ParseJobSpec(json)->init().from_job(), "job-3");
  for (const std::string& bad : {std::string("../job-3"), std::string("job 3"), std::string(65, 'j')}) {
    json = kValid;
    json.insert(json.rfind('}'), absl::StrCat(R"(, "init": {"from_job": ")", bad, R"("})"));
    ExpectInvalid(json, "init.from_job");
  }
}

TEST(JobSpecTest, MoreStagesThanUnitsIsRefused) {
  std::string json = kValid;
  json.insert(json.rfind('}'), R"(, "parallel": {"pipeline_stages": 5})");
  ExpectInvalid(json, "parallel.pipeline_stages");
}

TEST(JobSpecTest, OptimizerFieldsMustMatchTheKind) {
  ExpectInvalid(Edit(R"("kind": "adamw")", R"("kind": "adam")"), "train.optimizer.kind");
  ExpectInvalid(Edit(R"("kind": "adamw", "lr": 0.001)", R"("kind": "sgd", "lr": 0.1, "beta1": 0.9)"),
                "train.optimizer.beta1");
  ExpectInvalid(Edit(R"("lr": 0.001)", R"("lr": -1)"), "train.optimizer.lr");
}

TEST(JobSpecTest, MissingSectionsAndBadKindsAreNamed) {
  ExpectInvalid(R"({"model": {"kind": "gpt"}})", "data");
  ExpectInvalid(Edit(R"("kind": "addition")", R"("kind": "images")"), "data.kind");
  ExpectInvalid(Edit(R"("kind": "gpt")", R"("kind": "rnn")"), "model.kind");
  ExpectInvalid(Edit(R"("digits": 2)", R"("digits": 9)"), "data.digits");
  ExpectInvalid("not json", "job spec");
}

TEST(JobSpecTest, TokenFilesNameTheirWidthAndWhereValidationIs) {
  const std::string data = R"("data": {"kind": "addition", "digits": 2})";
  auto tokens = ParseJobSpec(Edit(data, R"("data": {"kind": "tokens", "path": "train.bin"})"));
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->data().token_bytes(), 2) << "uint16 by default";
  EXPECT_DOUBLE_EQ(tokens->data().val_fraction(), 0.1);
  auto separate = ParseJobSpec(
      Edit(data, R"("data": {"kind": "tokens", "path": "train.bin", "val_path": "val.bin", "token_bytes": 4})"));
  ASSERT_TRUE(separate.ok()) << separate.status();
  EXPECT_FALSE(separate->data().has_val_fraction());
  EXPECT_TRUE(ParseJobSpec(Edit(data, R"("data": {"kind": "text_bytes", "path": "a", "val_path": "b"})")).ok());
  ExpectInvalid(Edit(data, R"("data": {"kind": "tokens"})"), "data.path is required for data.kind 'tokens'");
  ExpectInvalid(Edit(data, R"("data": {"kind": "tokens", "path": "a", "token_bytes": 3})"),
                "data.token_bytes is 3, must be 2 or 4");
  ExpectInvalid(Edit(data, R"("data": {"kind": "text_bytes", "path": "a", "token_bytes": 2})"),
                "data.token_bytes is not used by data.kind 'text_bytes'");
  ExpectInvalid(Edit(data, R"("data": {"kind": "tokens", "path": "a", "val_path": "b", "val_fraction": 0.2})"),
                "data.val_fraction and data.val_path both");
  ExpectInvalid(Edit(data, R"("data": {"kind": "addition", "digits": 2, "val_path": "b"})"),
                "data.val_path is not used by data.kind 'addition'");
  ExpectInvalid(Edit(data, R"("data": {"kind": "tokens", "path": "a", "val_path": "b\u0000c"})"),
                "data.val_path holds a NUL byte");
}

TEST(JobSpecTest, ValidationEveryFewStepsIsForLossData) {
  auto with = [](std::string s, const std::string& from, const std::string& to) {
    return s.replace(s.find(from), from.size(), to);
  };
  const std::string text = Edit(R"("data": {"kind": "addition", "digits": 2})", R"("data": {"kind": "text_bytes", "path": "a"})");
  auto spec = ParseJobSpec(text);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->train().eval_every(), 0) << "none by default";
  EXPECT_FALSE(EvaluatesAfter(*spec, 10));
  auto every = ParseJobSpec(with(text, R"("seed": 3)", R"("seed": 3, "eval_every": 4)"));
  ASSERT_TRUE(every.ok()) << every.status();
  EXPECT_TRUE(EvaluatesAfter(*every, 4));
  EXPECT_FALSE(EvaluatesAfter(*every, 6));
  EXPECT_TRUE(EvaluatesAfter(*every, 8));
  EXPECT_TRUE(EvaluatesAfter(*every, 10)) << "and the last step";
  // Addition's validation is exact match, on any layout.
  auto addition = ParseJobSpec(Edit(R"("seed": 3)", R"("seed": 3, "eval_every": 4)"));
  ASSERT_TRUE(addition.ok()) << addition.status();
  EXPECT_TRUE(EvaluatesExactMatch(*addition));
  EXPECT_FALSE(EvaluatesExactMatch(*every));
  std::string split = Edit(R"("seed": 3)", R"("seed": 3, "eval_every": 4)");
  split.insert(split.rfind('}'), R"(, "parallel": {"tensor_parallel": 2, "vocab_parallel": true})");
  EXPECT_TRUE(ParseJobSpec(split).ok()) << "a vocabulary-parallel head gathers each row's best class";
  ExpectInvalid(with(text, R"("seed": 3)", R"("seed": 3, "eval_every": -1)"), "train.eval_every is -1, must be in [0, ");
  auto beyond = ParseJobSpec(with(text, R"("seed": 3)", R"("seed": 3, "eval_every": 11)"));
  ASSERT_TRUE(beyond.ok()) << beyond.status();
  EXPECT_FALSE(EvaluatesAfter(*beyond, 9));
  EXPECT_TRUE(EvaluatesAfter(*beyond, 10)) << "more than steps: after the last only";
}

TEST(JobSpecTest, EarlyStoppingNeedsValidationAndCheckpointsItsPasses) {
  auto plain = ParseJobSpec(kValid);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(StopsEarly(*plain));
  EXPECT_FALSE(plain->train().has_early_stopping()) << "left out of specs that do not use it";
  EXPECT_FALSE(CheckpointsAfter(*plain, 4));
  EXPECT_TRUE(CheckpointsAfter(*plain, 10)) << "the last step";

  const std::string stops = R"("seed": 3, "eval_every": 4, "early_stopping": {"patience": 2})";
  auto early = ParseJobSpec(Edit(R"("seed": 3)", stops));
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_TRUE(StopsEarly(*early));
  EXPECT_EQ(early->train().early_stopping().min_delta(), 0.0);
  EXPECT_TRUE(early->train().early_stopping().has_min_delta()) << "the default filled in";
  EXPECT_TRUE(CheckpointsAfter(*early, 4)) << "a validation step's version may be the best";
  EXPECT_FALSE(CheckpointsAfter(*early, 6));
  EXPECT_TRUE(CheckpointsAfter(*early, 8));
  std::string every_three = Edit(R"("seed": 3)", stops);
  every_three.insert(every_three.rfind('}'), R"(, "checkpoint": {"every_steps": 3})");
  auto both = ParseJobSpec(every_three);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_TRUE(CheckpointsAfter(*both, 3));
  EXPECT_TRUE(CheckpointsAfter(*both, 4));
  EXPECT_FALSE(CheckpointsAfter(*both, 5));

  ExpectInvalid(Edit(R"("seed": 3)", R"("seed": 3, "early_stopping": {"patience": 2})"),
                "train.early_stopping.patience needs validation passes: set train.eval_every");
  ExpectInvalid(Edit(R"("seed": 3)", R"("seed": 3, "eval_every": 4, "early_stopping": {"patience": -1})"),
                "train.early_stopping.patience is -1");
  ExpectInvalid(Edit(R"("seed": 3)",
                     R"("seed": 3, "eval_every": 4, "early_stopping": {"patience": 1, "min_delta": -0.5})"),
                "train.early_stopping.min_delta is -0.5");
  ExpectInvalid(Edit(R"("seed": 3)",
                     R"("seed": 3, "eval_every": 4, "early_stopping": {"patience": 1, "min_delta": "nan"})"),
                "train.early_stopping.min_delta");
  EXPECT_TRUE(ParseJobSpec(Edit(R"("seed": 3)", R"("seed": 3, "early_stopping": {"patience": 0})")).ok())
      << "patience 0 is off";
}

TEST(JobSpecTest, EarlyStoppingMonitorsTheLossOrAnExactMatchsAccuracy) {
  const auto with_early_stopping = [](const std::string& early_stopping) {
    return Edit(R"("seed": 3)", R"("seed": 3, "eval_every": 4, "early_stopping": )" + early_stopping);
  };
  auto on_loss = ParseJobSpec(with_early_stopping(R"({"patience": 2})"));
  ASSERT_TRUE(on_loss.ok()) << on_loss.status();
  EXPECT_EQ(on_loss->train().early_stopping().monitor(), "loss") << "the default filled in";
  const std::string on_accuracy =
      R"("seed": 3, "eval_every": 4, "early_stopping": {"patience": 2, "monitor": "accuracy", "min_delta": 0.01})";
  auto addition = ParseJobSpec(Edit(R"("seed": 3)", on_accuracy));
  ASSERT_TRUE(addition.ok()) << addition.status();
  EXPECT_EQ(addition->train().early_stopping().monitor(), "accuracy");

  ExpectInvalid(with_early_stopping(R"({"patience": 2, "monitor": "acc"})"),
                "train.early_stopping.monitor is 'acc', must be 'loss' or 'accuracy'");
  ExpectInvalid(with_early_stopping(R"({"patience": 2, "monitor": "accuracy", "min_delta": 1})"),
                "train.early_stopping.min_delta (1) must be below 1 with monitor 'accuracy'");
  std::string text =
      Edit(R"("data": {"kind": "addition", "digits": 2})", R"("data": {"kind": "text_bytes", "path": "a"})");
  text.replace(text.find(R"("seed": 3)"), 9, on_accuracy);
  ExpectInvalid(text, "train.early_stopping.monitor 'accuracy' needs exact-match validation (data.kind 'addition'); "
                      "data.kind 'text_bytes' validates on the loss only");
}

TEST(JobSpecTest, ShippedExamplesAreValid) {
  for (const char* name : {"addition.json", "text.json", "gpt2-finetune.json", "addition-tensor.json"}) {
    auto spec = LoadJobSpec(std::string(SHARDLINE_SOURCE_DIR) + "/examples/" + name);
    EXPECT_TRUE(spec.ok()) << name << ": " << spec.status();
  }
  EXPECT_EQ(LoadJobSpec("/nonexistent/spec.json").status().code(), absl::StatusCode::kNotFound);
}

// The hostile-client probe: this spec passed validation, and the planner's
// memory estimate overflowed int64 into a plan that "fit".
TEST(JobSpecTest, AMicroBatchTooLargeForAStageLinkIsRefused) {
  ExpectInvalid(R"({"name": "huge",
    "model": {"kind": "gpt", "vocab_size": 1048576, "context": 65536, "d_model": 65536, "n_heads": 1024,
              "n_layers": 1024},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": 10, "global_batch": 1048576, "micro_batches": 1, "seed": 3,
              "optimizer": {"kind": "adamw", "lr": 0.001}}})",
                "tokens per micro-batch");
  // 2 × 16384 tokens are few enough, but at d_model 65536 their activations
  // are 2^31 values: more than a stage link carries.
  ExpectInvalid(Edit(R"("context": 16, "d_model": 32)", R"("context": 16384, "d_model": 65536)"),
                "a stage link carries");
}

TEST(JobSpecTest, NamesAreShortAndPrintable) {
  ExpectInvalid(Edit(R"("name": "t")", R"("name": ")" + std::string(129, 'n') + R"(")"), "at most 128");
  ExpectInvalid(Edit(R"("name": "t")", R"("name": "a\u0007b")"), "control character");
  EXPECT_TRUE(ParseJobSpec(Edit(R"("name": "t")", R"("name": ")" + std::string(128, 'n') + R"(")")).ok());
}

TEST(JobSpecTest, ErrorsQuoteOnlyAPrefixOfBadInput) {
  auto spec = ParseJobSpec(Edit(R"("kind": "gpt")", R"("kind": ")" + std::string(100000, 'x') + R"(")"));
  ASSERT_FALSE(spec.ok());
  EXPECT_LT(spec.status().message().size(), 300u) << spec.status().message().substr(0, 300);
  EXPECT_NE(spec.status().message().find("(100000 bytes)"), std::string::npos) << spec.status().message();
  auto field = ParseJobSpec(Edit(R"("name": "t")", R"(")" + std::string(100000, 'f') + R"(": 1, "name": "t")"));
  ASSERT_FALSE(field.ok());
  EXPECT_LT(field.status().message().size(), 300u) << "an unknown field's name is quoted in part";
}

TEST(JobSpecTest, ASpecIsAtMostOneMiB) {
  ExpectInvalid(Edit(R"("name": "t")", R"("name": "t", "description": ")" + std::string(1 << 20, 'd') + R"(")"),
                "at most 1048576");
}

TEST(JobSpecTest, ASpecFileIsReadWithABound) {
  auto spec = LoadJobSpec("/dev/zero");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("larger than"), std::string::npos) << spec.status();
}

}  // namespace
}  // namespace shardline::common
