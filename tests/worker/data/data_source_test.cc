#include "worker/data/data_source.h"

#include <fstream>
#include <set>

#include "gtest/gtest.h"
#include "worker/data/addition_data.h"
#include "worker/data/text_bytes_data.h"

namespace shardline::worker::data {
namespace {

TEST(AdditionDataTest, EncodesWithReversedZeroPaddedAnswer) {
  AdditionData data(2, 0.1, 1);
  EXPECT_EQ(AdditionData::Render(data.Encode(37, 85)), "37+85=221.");
  EXPECT_EQ(AdditionData::Render(data.Encode(5, 4)), "05+04=900.");
  EXPECT_EQ(data.sequence_length(), 9);
}

TEST(AdditionDataTest, BatchesAreAFunctionOfStepAndPlaceOnly) {
  AdditionData data(2, 0.1, 1);
  const Batch a = data.TrainBatch(3, 1, 4), b = data.TrainBatch(3, 1, 4);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_NE(data.TrainBatch(4, 1, 4).ids, a.ids);
  // The same global batch whatever the micro-batch split.
  const Batch whole = data.TrainBatch(3, 0, 8);
  std::vector<int32_t> joined;
  for (int k = 0; k < 4; ++k) {
    const Batch part = data.TrainBatch(3, k, 2);
    joined.insert(joined.end(), part.ids.begin(), part.ids.end());
  }
  EXPECT_EQ(joined, whole.ids);
  EXPECT_NE(AdditionData(2, 0.1, 2).TrainBatch(3, 1, 4).ids, a.ids) << "the seed matters";
}

TEST(AdditionDataTest, OnlyAnswerDigitsAndEndAreScored) {
  AdditionData data(2, 0.1, 1);
  const Batch b = data.TrainBatch(1, 0, 3);
  for (int64_t s = 0; s < 3; ++s) {
    for (int64_t j = 0; j < b.t; ++j) {
      const int32_t target = b.targets[s * b.t + j];
      if (j < 5) {
        EXPECT_EQ(target, -1);
      } else {
        EXPECT_GE(target, 0);
      }
    }
    EXPECT_EQ(b.targets[s * b.t + 8], AdditionData::kEnd);
  }
  EXPECT_EQ(b.target_count(), 3 * 4);
}

TEST(AdditionDataTest, TrainingNeverSeesHeldOutPairs) {
  AdditionData data(2, 0.1, 1);
  int held_out = 0;
  for (int a = 0; a < 100; ++a) {
    for (int b = 0; b < 100; ++b) held_out += data.IsHeldOut(a, b);
  }
  EXPECT_GT(held_out, 700);
  EXPECT_LT(held_out, 1300);
  for (int step = 1; step <= 50; ++step) {
    const Batch batch = data.TrainBatch(step, 0, 64);
    for (int64_t s = 0; s < batch.batch; ++s) {
      const int32_t* t = &batch.ids[s * batch.t];
      ASSERT_FALSE(data.IsHeldOut(t[0] * 10 + t[1], t[3] * 10 + t[4])) << "step " << step;
    }
  }
  const EvalSet eval = data.MakeEvalSet(100000);
  EXPECT_EQ(static_cast<int>(eval.prompts.size()), held_out);
  std::set<std::vector<int32_t>> unique(eval.prompts.begin(), eval.prompts.end());
  EXPECT_EQ(unique.size(), eval.prompts.size());
  for (const auto& p : eval.prompts) {
    ASSERT_EQ(p.size(), 6u);
    EXPECT_TRUE(data.IsHeldOut(p[0] * 10 + p[1], p[3] * 10 + p[4]));
  }
  EXPECT_EQ(data.MakeEvalSet(10).prompts.size(), 10u);
}

class TextBytesDataTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = ::testing::TempDir() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
};

TEST_F(TextBytesDataTest, SplitsTrainingAndValidationByPosition) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>('a' + i % 26);
  auto data = TextBytesData::Load(Write("alpha.txt", text), 0.2, 8, 1);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->train_bytes(), 800u);
  const Batch b = (*data)->TrainBatch(1, 0, 16);
  EXPECT_EQ(b.ids.size(), 16u * 8);
  for (size_t i = 0; i < b.ids.size(); ++i) {
    EXPECT_EQ(b.targets[i], 'a' + ((b.ids[i] - 'a' + 1) % 26)) << "targets are the next byte";
  }
  EXPECT_EQ((*data)->TrainBatch(1, 0, 16).ids, b.ids);
  const EvalSet eval = (*data)->MakeEvalSet(1000);
  int64_t windows = 0;
  for (const Batch& vb : eval.batches) windows += vb.batch;
  EXPECT_EQ(windows, (200 - 1) / 8);
  EXPECT_EQ(eval.batches[0].ids[0], text[800]);
}

// What a replica counts without making the other replicas' batches.
TEST_F(TextBytesDataTest, TrainTargetsCountWhatTheBatchesScore) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>('a' + i % 26);
  auto bytes = TextBytesData::Load(Write("count.txt", text), 0.2, 8, 1);
  ASSERT_TRUE(bytes.ok());
  AdditionData addition(2, 0.1, 3);
  for (const DataSource* data : {static_cast<const DataSource*>(bytes->get()), static_cast<const DataSource*>(&addition)}) {
    for (int step = 1; step <= 5; ++step) {
      for (int64_t sequences : {1, 7, 16}) {
        EXPECT_EQ(data->TrainTargets(sequences), data->TrainBatch(step, step % 3, sequences).target_count());
      }
    }
  }
}

TEST_F(TextBytesDataTest, BadFilesGiveClearErrors) {
  EXPECT_EQ(TextBytesData::Load("/nonexistent", 0.1, 8, 1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(TextBytesData::Load(Write("empty.txt", ""), 0.1, 8, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TextBytesData::Load(Write("short.txt", "tiny text"), 0.1, 8, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardline::worker::data
