#include "worker/shard_snapshot.h"

#include "common/shard_digest.h"
#include "gtest/gtest.h"

namespace shardline::worker {
namespace {

TEST(ShardSnapshotTest, ItsPiecesAreTheSerializedFile) {
  common::SafetensorsContents c;
  c.tensors.emplace("b", *common::Tensor::FromValues<float>({5}, std::vector<float>{1, 2, 3, 4, 5}));
  c.tensors.emplace("a", *common::Tensor::FromValues<int32_t>({3}, std::vector<int32_t>{7, 8, 9}));
  c.tensors.emplace("empty", *common::Tensor::Zeros(common::DType::kF32, {0}));
  c.metadata["step"] = "3";
  const std::string file = *common::SerializeSafetensors(c);
  shardline::v1::ShardHeader h;
  h.set_step(3);
  auto snapshot = ShardSnapshot::Create(h, c);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ((*snapshot)->size(), static_cast<int64_t>(file.size()));
  EXPECT_EQ((*snapshot)->header().total_bytes(), static_cast<int64_t>(file.size()));
  EXPECT_EQ((*snapshot)->Bytes(), file);
  std::string piece;
  for (int64_t offset = 0; offset < static_cast<int64_t>(file.size()); ++offset) {
    for (size_t n : {1, 3, 13, 64}) {
      (*snapshot)->Read(offset, n, &piece);
      ASSERT_EQ(piece, file.substr(offset, n)) << offset << " " << n;
    }
  }
  (*snapshot)->Read(static_cast<int64_t>(file.size()), 8, &piece);
  EXPECT_TRUE(piece.empty());
  EXPECT_EQ((*snapshot)->ComputeDigest(), common::ShardDigest::Of(file));
  EXPECT_EQ((*snapshot)->header().digest(), common::ShardDigest::Of(file));
}

}  // namespace
}  // namespace shardline::worker
