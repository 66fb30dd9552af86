// BucketLayout: buckets take whole norm pieces, last parameters first, and
// close before passing their size; sharded, each rank owns a contiguous run
// of every parameter, its pieces fill the start of its own chunk of the
// bucket (so the collective's chunk r is exactly rank r's pieces), every
// element has one owner, and no chunk passes LargestChunkFloats.
#include "worker/runtime/bucket_layout.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/collective/collective.h"

namespace shardline::worker::runtime {
namespace {

// The pieces of each bucket as (parameter, offset, size).
std::vector<std::vector<std::vector<size_t>>> Pieces(const BucketLayout& layout) {
  std::vector<std::vector<std::vector<size_t>>> out;
  for (const auto& bucket : layout.buckets) {
    out.emplace_back();
    for (const auto& piece : bucket.pieces) out.back().push_back({piece.parameter, piece.offset, piece.size});
  }
  return out;
}

TEST(BucketLayoutTest, BucketsTakeWholePiecesLastParametersFirst) {
  // Parameters of 5, 17 and 3 floats in pieces of 4, buckets of 8.
  const BucketLayout layout = BucketLayout::Cut({5, 17, 3}, 8, 1, 4);
  using P = std::vector<std::vector<size_t>>;
  EXPECT_EQ(Pieces(layout), (std::vector<P>{{{2, 0, 3}, {1, 0, 4}},
                                            {{1, 4, 4}, {1, 8, 4}},
                                            {{1, 12, 4}, {1, 16, 1}},
                                            {{0, 0, 4}, {0, 4, 1}}}));
  EXPECT_EQ(layout.buckets[0].lowest_parameter, 1u);
  EXPECT_EQ(layout.buckets[3].lowest_parameter, 0u);
  EXPECT_EQ(layout.norm_pieces, 2u + 5u + 1u);
  EXPECT_EQ(layout.buckets[0].pieces[0].norm_piece, 7u) << "norm pieces count in parameter order";
  EXPECT_EQ(layout.buckets[0].pieces[1].norm_piece, 2u);
  // Unsharded: end to end, every rank owns every piece.
  EXPECT_EQ(layout.host_floats, 25u);
  size_t at = 0;
  for (const auto& bucket : layout.buckets) {
    for (const auto& piece : bucket.pieces) {
      EXPECT_EQ(piece.host_offset, at);
      EXPECT_EQ(piece.owner, -1);
      at += piece.size;
    }
  }
  // A piece larger than a bucket is a bucket of its own.
  EXPECT_EQ(BucketLayout::Cut({10}, 3, 1, 10).buckets.size(), 1u);
  // An empty parameter still has its (zero) norm term but no piece.
  const BucketLayout empty = BucketLayout::Cut({0, 2}, 8, 1, 4);
  EXPECT_EQ(empty.norm_pieces, 2u);
  EXPECT_EQ(Pieces(empty), (std::vector<P>{{{1, 0, 2}}}));
}

TEST(BucketLayoutTest, ShardedRanksOwnTheirChunkOfEveryBucket) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const int ranks = 2 + static_cast<int>(rng() % 4);
    const size_t piece = 1 + rng() % 9, bucket_floats = 1 + rng() % 40;
    std::vector<size_t> sizes(1 + rng() % 6);
    for (size_t& s : sizes) s = rng() % 30;
    const BucketLayout layout = BucketLayout::Cut(sizes, bucket_floats, ranks, piece);
    SCOPED_TRACE(testing::Message() << "trial " << trial << ": " << ranks << " ranks, pieces of " << piece
                                    << ", buckets of " << bucket_floats);
    std::vector<std::vector<int>> owner_of(sizes.size());  // by element
    for (size_t p = 0; p < sizes.size(); ++p) owner_of[p].assign(sizes[p], -2);
    size_t host = 0;
    for (const auto& bucket : layout.buckets) {
      EXPECT_EQ(bucket.host_begin, host);
      EXPECT_EQ(bucket.host_size, bucket.chunk * ranks);
      EXPECT_LE(bucket.chunk, BucketLayout::LargestChunkFloats(bucket_floats, ranks, true, piece));
      host += bucket.host_size;
      size_t floats = 0;
      for (const auto& pc : bucket.pieces) floats += pc.size;
      EXPECT_TRUE(floats <= bucket_floats || bucket.pieces.size() == 1) << floats << " floats";
      std::vector<size_t> filled(ranks, 0);
      int last_owner = 0;
      for (const auto& pc : bucket.pieces) {
        ASSERT_GE(pc.owner, last_owner) << "owners run in rank order";
        last_owner = pc.owner;
        // Within the owner's chunk, one after the other from its start.
        const collective::Chunk chunk = collective::ChunkOf(bucket.host_size, ranks, pc.owner);
        EXPECT_EQ(pc.host_offset, bucket.host_begin + chunk.begin + filled[pc.owner]);
        filled[pc.owner] += pc.size;
        EXPECT_LE(filled[pc.owner], chunk.size());
        for (size_t i = pc.offset; i < pc.offset + pc.size; ++i) {
          EXPECT_EQ(owner_of[pc.parameter][i], -2) << "element covered twice";
          owner_of[pc.parameter][i] = pc.owner;
        }
      }
    }
    EXPECT_EQ(layout.host_floats, host);
    // Every element has one owner.
    for (size_t p = 0; p < sizes.size(); ++p) {
      for (size_t i = 0; i < sizes[p]; ++i) {
        ASSERT_GE(owner_of[p][i], 0) << "parameter " << p << " element " << i << " has no owner";
      }
    }
  }
}

TEST(BucketLayoutTest, ShardedChunksSplitABucketEvenly) {
  // One bucket of 8 pieces of 4 over 2 ranks: 4 pieces each, no padding.
  const BucketLayout layout = BucketLayout::Cut({32}, 1000, 2, 4);
  ASSERT_EQ(layout.buckets.size(), 1u);
  EXPECT_EQ(layout.buckets[0].chunk, 16u);
  EXPECT_EQ(layout.host_floats, 32u);
  // 3 pieces over 2 ranks: 2 and 1, the second chunk padded.
  const BucketLayout odd = BucketLayout::Cut({12}, 1000, 2, 4);
  EXPECT_EQ(odd.buckets[0].chunk, 8u);
  EXPECT_EQ(odd.buckets[0].pieces[2].owner, 1);
  EXPECT_EQ(odd.buckets[0].pieces[2].host_offset, 8u);
}

TEST(BucketLayoutTest, LargestChunkFloats) {
  EXPECT_EQ(BucketLayout::LargestChunkFloats(100, 3, false, 10), 34u);
  EXPECT_EQ(BucketLayout::LargestChunkFloats(100, 1, false, 10), 100u);
  EXPECT_EQ(BucketLayout::LargestChunkFloats(5, 2, false, 10), 5u) << "one piece larger than the bucket";
  EXPECT_EQ(BucketLayout::LargestChunkFloats(100, 3, true, 10), 44u);
  EXPECT_EQ(BucketLayout::LargestChunkFloats(100, 1, true, 10), 100u);
}

}  // namespace
}  // namespace shardline::worker::runtime
