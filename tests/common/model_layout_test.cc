// common::CheckWeightsFitModel: a file's tensors against the model's.
#include "common/model_layout.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace shardline::common {
namespace {

shardline::v1::ModelSpec Tiny() {
  shardline::v1::ModelSpec m;
  m.set_kind("gpt");
  m.set_vocab_size(16);
  m.set_context(12);
  m.set_d_model(16);
  m.set_n_heads(2);
  m.set_n_layers(2);
  return m;
}

SafetensorsIndex Whole(const shardline::v1::ModelSpec& model) {
  SafetensorsIndex index;
  for (const ModelParameter& p : ModelParameters(model)) index.entries[p.name] = {DType::kF32, p.shape};
  return index;
}

TEST(CheckWeightsFitModelTest, TakesTheWholeModelWithOrWithoutOptimizerState) {
  SafetensorsIndex index = Whole(Tiny());
  EXPECT_EQ(index.entries.size(), 2u + 2 * 12 + 3);
  EXPECT_TRUE(CheckWeightsFitModel(index, Tiny(), "the weights").ok());
  index.entries["optimizer.m.ln_f.weight"] = {DType::kF32, {16}};
  EXPECT_TRUE(CheckWeightsFitModel(index, Tiny(), "the weights").ok());
}

TEST(CheckWeightsFitModelTest, NamesWhatIsMissing) {
  SafetensorsIndex index = Whole(Tiny());
  index.entries.erase("blocks.1.mlp.fc.bias");
  const absl::Status s = CheckWeightsFitModel(index, Tiny(), "the weights sent");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "the weights sent do not fit the spec's model")) << s.message();
  EXPECT_TRUE(absl::StrContains(s.message(), "they lack 1 of its 29 tensors (blocks.1.mlp.fc.bias)")) << s.message();
}

TEST(CheckWeightsFitModelTest, NamesTensorsOfAnotherShapeOrType) {
  SafetensorsIndex index = Whole(Tiny());
  index.entries["blocks.0.attn.qkv.weight"].shape = {48, 8};
  index.entries["ln_f.bias"].dtype = DType::kF16;
  const absl::Status s = CheckWeightsFitModel(index, Tiny(), "the weights");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "blocks.0.attn.qkv.weight is f32[48, 8], the model's f32[48, 16]")) << s.message();
  EXPECT_TRUE(absl::StrContains(s.message(), "ln_f.bias is f16[16], the model's f32[16]")) << s.message();
}

TEST(CheckWeightsFitModelTest, NamesTensorsTheModelLacks) {
  // A deeper model's weights: two blocks too many.
  shardline::v1::ModelSpec deeper = Tiny();
  deeper.set_n_layers(4);
  const absl::Status s = CheckWeightsFitModel(Whole(deeper), Tiny(), "the weights");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "they hold 24 tensors it does not have ('blocks.2.attn.proj.bias', ")) << s.message();
  EXPECT_TRUE(absl::StrContains(s.message(), " and 21 more)")) << s.message();
}

TEST(CheckWeightsFitModelTest, ShowsAFewOfManyProblems) {
  SafetensorsIndex other;
  other.entries["w"] = {DType::kF32, {2}};
  const absl::Status s = CheckWeightsFitModel(other, Tiny(), "the weights");
  EXPECT_TRUE(absl::StrContains(s.message(), "they lack 29 of its 29 tensors (tok_emb.weight, pos_emb.weight, "
                                     "blocks.0.ln1.weight and 26 more)")) << s.message();
  EXPECT_TRUE(absl::StrContains(s.message(), "they hold 1 tensors it does not have ('w')")) << s.message();
  EXPECT_LT(s.message().size(), 600u);
}

}  // namespace
}  // namespace shardline::common
