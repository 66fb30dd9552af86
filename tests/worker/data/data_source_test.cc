#include "worker/data/data_source.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/addition_data.h"
#include "worker/data/token_file_data.h"

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
  const Batch a = data.TrainBatch(3, 1, 4).value(), b = data.TrainBatch(3, 1, 4).value();
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_NE(data.TrainBatch(4, 1, 4).value().ids, a.ids);
  // The same global batch whatever the micro-batch split.
  const Batch whole = data.TrainBatch(3, 0, 8).value();
  std::vector<int32_t> joined;
  for (int k = 0; k < 4; ++k) {
    const Batch part = data.TrainBatch(3, k, 2).value();
    joined.insert(joined.end(), part.ids.begin(), part.ids.end());
  }
  EXPECT_EQ(joined, whole.ids);
  EXPECT_NE(AdditionData(2, 0.1, 2).TrainBatch(3, 1, 4).value().ids, a.ids) << "the seed matters";
}

TEST(AdditionDataTest, OnlyAnswerDigitsAndEndAreScored) {
  AdditionData data(2, 0.1, 1);
  const Batch b = data.TrainBatch(1, 0, 3).value();
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
    const Batch batch = data.TrainBatch(step, 0, 64).value();
    for (int64_t s = 0; s < batch.batch; ++s) {
      const int32_t* t = &batch.ids[s * batch.t];
      ASSERT_FALSE(data.IsHeldOut(t[0] * 10 + t[1], t[3] * 10 + t[4])) << "step " << step;
    }
  }
  const EvalSet eval = data.MakeEvalSet(100000, 64).value();
  EXPECT_EQ(eval.kind, EvalSet::Kind::kExactMatch);
  std::set<std::vector<int32_t>> unique;
  int64_t sequences = 0;
  for (const Batch& b : eval.batches) {
    EXPECT_LE(b.batch, 64);
    ASSERT_EQ(b.t, 9);
    for (int64_t s = 0; s < b.batch; ++s) {
      const int32_t* t = &b.ids[s * b.t];
      EXPECT_TRUE(data.IsHeldOut(t[0] * 10 + t[1], t[3] * 10 + t[4]));
      unique.insert(std::vector<int32_t>(t, t + b.t));
    }
    sequences += b.batch;
  }
  EXPECT_EQ(sequences, held_out);
  EXPECT_EQ(static_cast<int64_t>(unique.size()), sequences);
  EXPECT_EQ(data.MakeEvalSet(10, 4).value().batches.size(), 3u);
  EXPECT_EQ(data.MakeEvalSet(10, 4).value().batches.back().batch, 2);
}

TEST(AdditionDataTest, ExactMatchScoresTheAnswerDigitsOnly) {
  AdditionData data(2, 0.1, 1);
  const Batch b = data.MakeEvalSet(5, 5).value().batches.at(0);
  ASSERT_EQ(b.batch, 5);
  for (int64_t s = 0; s < b.batch; ++s) {
    const int32_t* ids = &b.ids[s * b.t];
    const int32_t* targets = &b.targets[s * b.t];
    const std::vector<int32_t> whole = data.Encode(ids[0] * 10 + ids[1], ids[3] * 10 + ids[4]);
    EXPECT_EQ(std::vector<int32_t>(ids, ids + b.t), std::vector<int32_t>(whole.begin(), whole.end() - 1));
    for (int64_t j = 0; j < b.t; ++j) {
      // After "37+85": the three answer digits, predicted from "=", "2" and "2".
      EXPECT_EQ(targets[j], j >= 5 && j <= 7 ? whole[j + 1] : -1) << "position " << j;
    }
  }
  EXPECT_EQ(b.target_count(), 5 * 3);
}

class TokenFileDataTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = ::testing::TempDir() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
};

TEST_F(TokenFileDataTest, SplitsTrainingAndValidationByPosition) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>('a' + i % 26);
  auto data = TokenFileData::Load({Write("alpha.txt", text), "", 0.2}, 8, 1);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->train_tokens(), 800u);
  EXPECT_EQ((*data)->vocab_needed(), 256);
  const Batch b = (*data)->TrainBatch(1, 0, 16).value();
  EXPECT_EQ(b.ids.size(), 16u * 8);
  for (size_t i = 0; i < b.ids.size(); ++i) {
    EXPECT_EQ(b.targets[i], 'a' + ((b.ids[i] - 'a' + 1) % 26)) << "targets are the next byte";
  }
  EXPECT_EQ((*data)->TrainBatch(1, 0, 16).value().ids, b.ids);
  const EvalSet eval = (*data)->MakeEvalSet(1000, 16).value();
  int64_t windows = 0;
  for (const Batch& vb : eval.batches) windows += vb.batch;
  EXPECT_EQ(windows, (200 - 1) / 8);
  EXPECT_EQ(eval.batches[0].ids[0], text[800]);
}

// What a replica counts without making the other replicas' batches.
TEST_F(TokenFileDataTest, TrainTargetsCountWhatTheBatchesScore) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>('a' + i % 26);
  auto bytes = TokenFileData::Load({Write("count.txt", text), "", 0.2}, 8, 1);
  ASSERT_TRUE(bytes.ok());
  AdditionData addition(2, 0.1, 3);
  for (const DataSource* data : {static_cast<const DataSource*>(bytes->get()), static_cast<const DataSource*>(&addition)}) {
    for (int step = 1; step <= 5; ++step) {
      for (int64_t sequences : {1, 7, 16}) {
        EXPECT_EQ(data->TrainTargets(sequences), data->TrainBatch(step, step % 3, sequences).value().target_count());
      }
    }
  }
}

TEST_F(TokenFileDataTest, BadFilesGiveClearErrors) {
  EXPECT_EQ(TokenFileData::Load({"/nonexistent"}, 8, 1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(TokenFileData::Load({Write("empty.txt", "")}, 8, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenFileData::Load({Write("short.txt", "tiny text")}, 8, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Little-endian ids of `width` bytes, as numpy's tofile writes uint16/uint32.
std::string Ids(const std::vector<uint32_t>& ids, int width) {
  std::string out;
  for (uint32_t id : ids) {
    for (int b = 0; b < width; ++b) out += static_cast<char>((id >> (8 * b)) & 0xff);
  }
  return out;
}

TEST_F(TokenFileDataTest, ReadsLittleEndianTokenIdsOfTwoOrFourBytes) {
  for (int width : {2, 4}) {
    SCOPED_TRACE(width);
    // id i = 1000 + 7 i (mod 50000): the next id follows from the last.
    std::vector<uint32_t> ids;
    for (uint32_t i = 0; i < 500; ++i) ids.push_back((1000 + 7 * i) % 50000 + (width == 4 ? 70000 : 0));
    auto data = TokenFileData::Load({Write("ids.bin", Ids(ids, width)), "", 0.1, width}, 16, 3);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ((*data)->train_tokens(), 450u);
    EXPECT_EQ((*data)->val_tokens(), 50u);
    EXPECT_EQ((*data)->vocab_needed(), *std::max_element(ids.begin(), ids.end()) + 1);
    const Batch b = (*data)->TrainBatch(2, 1, 8).value();
    ASSERT_EQ(b.ids.size(), 8u * 16);
    for (int64_t s = 0; s < b.batch; ++s) {
      // Each window is consecutive ids of the training part.
      const auto first = std::find(ids.begin(), ids.begin() + 450, static_cast<uint32_t>(b.ids[s * 16]));
      ASSERT_NE(first, ids.begin() + 450);
      const size_t at = static_cast<size_t>(first - ids.begin());
      ASSERT_LE(at + 17, 450u);
      for (size_t j = 0; j < 16; ++j) {
        EXPECT_EQ(b.ids[s * 16 + j], static_cast<int32_t>(ids[at + j]));
        EXPECT_EQ(b.targets[s * 16 + j], static_cast<int32_t>(ids[at + j + 1]));
      }
    }
    const EvalSet eval = (*data)->MakeEvalSet(100, 16).value();
    ASSERT_EQ(eval.batches.size(), 1u);
    EXPECT_EQ(eval.batches[0].batch, (50 - 1) / 16);
    EXPECT_EQ(eval.batches[0].ids[0], static_cast<int32_t>(ids[450]));
  }
}

TEST_F(TokenFileDataTest, TakesValidationFromItsOwnFile) {
  std::vector<uint32_t> train, val;
  for (uint32_t i = 0; i < 100; ++i) train.push_back(i % 40);
  for (uint32_t i = 0; i < 40; ++i) val.push_back(40 + i);
  auto data = TokenFileData::Load({Write("train.bin", Ids(train, 2)), Write("val.bin", Ids(val, 2)), 0.1, 2}, 8, 3);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->train_tokens(), 100u) << "all of path is for training";
  EXPECT_EQ((*data)->vocab_needed(), 80) << "the largest id of either file";
  for (int step = 1; step <= 20; ++step) {
    const Batch batch = (*data)->TrainBatch(step, 0, 4).value();
    for (int32_t id : batch.ids) ASSERT_LT(id, 40) << "never a validation token";
  }
  const EvalSet eval = (*data)->MakeEvalSet(100, 16).value();
  int64_t windows = 0;
  for (const Batch& vb : eval.batches) {
    windows += vb.batch;
    for (int32_t id : vb.ids) EXPECT_GE(id, 40);
  }
  EXPECT_EQ(windows, (40 - 1) / 8);
}

// A token file cut short while a job trains on it: the batches that reach
// past its end fail with DATA_LOSS (before, the mapping's SIGBUS killed the
// worker), and validation too; the windows it still holds read as before.
TEST_F(TokenFileDataTest, AFileCutShortWhileTrainingGivesDataLoss) {
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 4000; ++i) ids.push_back(i % 500);
  const std::string path = Write("cut.bin", Ids(ids, 2));
  auto data = TokenFileData::Load({path, "", 0.1, 2}, 16, 7);
  ASSERT_TRUE(data.ok()) << data.status();
  const Batch before = (*data)->TrainBatch(3, 0, 8).value();
  ASSERT_EQ(::truncate(path.c_str(), 2 * 100), 0);
  int lost = 0;
  for (int step = 1; step <= 20; ++step) {
    const absl::StatusOr<Batch> batch = (*data)->TrainBatch(step, 0, 8);
    if (batch.ok()) continue;
    ++lost;
    EXPECT_EQ(batch.status().code(), absl::StatusCode::kDataLoss) << batch.status();
    EXPECT_NE(batch.status().message().find("truncated or rewritten in place"), std::string::npos) << batch.status();
  }
  EXPECT_EQ(lost, 20) << "every batch of 8 windows in 3,600 tokens reaches past the first 100";
  EXPECT_EQ((*data)->MakeEvalSet(100, 4).status().code(), absl::StatusCode::kDataLoss) << "its tail is gone";
  std::ofstream(path) << Ids(ids, 2);
  EXPECT_EQ((*data)->TrainBatch(3, 0, 8).value().ids, before.ids) << "whole again, it reads as before";
}

// A stage 0 started again (a replan, a failover) does not scan the same
// file for its largest id twice: the scan is remembered by the file's
// identity (device, inode, size, mtime, ctime). A file written since is
// scanned again.
TEST_F(TokenFileDataTest, TheLargestIdIsScannedOncePerVersionOfAFile) {
  std::vector<uint32_t> ids(64, 7);
  const std::string path = Write("memo.bin", Ids(ids, 2));
  const int64_t scans = TokenFileData::largest_id_scans();
  auto first = TokenFileData::Load({path, "", 0.5, 2}, 8, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->vocab_needed(), 8);
  EXPECT_EQ(TokenFileData::largest_id_scans(), scans + 1);
  auto again = TokenFileData::Load({path, "", 0.5, 2}, 8, 1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->vocab_needed(), 8);
  EXPECT_EQ(TokenFileData::largest_id_scans(), scans + 1) << "the same version: remembered";
  ids.push_back(900);
  Write("memo.bin", Ids(ids, 2));
  auto changed = TokenFileData::Load({path, "", 0.5, 2}, 8, 1);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ((*changed)->vocab_needed(), 901) << "written since: scanned";
  EXPECT_EQ(TokenFileData::largest_id_scans(), scans + 2);
}

TEST_F(TokenFileDataTest, TokenFilesThatDoNotFitGiveClearErrors) {
  auto odd = TokenFileData::Load({Write("odd.bin", Ids(std::vector<uint32_t>(100, 5), 2) + "x"), "", 0.1, 2}, 8, 1);
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(odd.status().message().find("has 201 bytes: not a whole number of 2-byte token ids"), std::string::npos)
      << odd.status();
  const std::string ok = Write("ok.bin", Ids(std::vector<uint32_t>(100, 5), 2));
  auto short_val = TokenFileData::Load({ok, Write("short-val.bin", Ids({1, 2, 3}, 2)), 0.1, 2}, 8, 1);
  EXPECT_EQ(short_val.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_val.status().message().find("data.val_path 3"), std::string::npos) << short_val.status();
  EXPECT_EQ(TokenFileData::Load({ok, "/nonexistent/val.bin", 0.1, 2}, 8, 1).status().code(),
            absl::StatusCode::kNotFound);
}

// The spec's model must hold every id the files use.
TEST_F(TokenFileDataTest, AVocabularyTooSmallForTheIdsIsRefused) {
  std::vector<uint32_t> ids(200, 3);
  ids[150] = 300;
  shardline::v1::JobSpec spec;
  spec.mutable_model()->set_vocab_size(256);
  spec.mutable_model()->set_context(8);
  spec.mutable_data()->set_kind("tokens");
  spec.mutable_data()->set_path(Write("big-id.bin", Ids(ids, 2)));
  spec.mutable_data()->set_val_fraction(0.1);
  spec.mutable_data()->set_token_bytes(2);
  auto source = CreateDataSource(spec);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(source.status().message().find("model.vocab_size is 256 but data.kind 'tokens' needs 301"),
            std::string::npos)
      << source.status();
  spec.mutable_model()->set_vocab_size(301);
  EXPECT_TRUE(CreateDataSource(spec).ok());
}

}  // namespace
}  // namespace shardline::worker::data
