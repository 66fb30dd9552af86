#include "worker/runtime/bucket_layout.h"

#include <algorithm>

namespace shardline::worker::runtime {
namespace {

// Sharded: owners by where each piece starts, chunks padded to the largest
// rank's share; unsharded: end to end.
void PlaceOnHost(BucketLayout::Bucket& bucket, int shard_ranks, size_t host_begin) {
  bucket.host_begin = host_begin;
  size_t n = 0;
  for (const BucketLayout::Piece& piece : bucket.pieces) n += piece.size;
  if (shard_ranks <= 1) {
    size_t at = host_begin;
    for (BucketLayout::Piece& piece : bucket.pieces) {
      piece.host_offset = at;
      at += piece.size;
    }
    bucket.host_size = n;
    return;
  }
  const size_t d = static_cast<size_t>(shard_ranks);
  std::vector<size_t> owned(d, 0);
  size_t start = 0;
  for (BucketLayout::Piece& piece : bucket.pieces) {
    piece.owner = static_cast<int>(std::min(d - 1, start * d / n));
    owned[piece.owner] += piece.size;
    start += piece.size;
  }
  bucket.chunk = *std::max_element(owned.begin(), owned.end());
  bucket.host_size = d * bucket.chunk;
  std::vector<size_t> next(d, 0);  // within each rank's chunk
  for (BucketLayout::Piece& piece : bucket.pieces) {
    piece.host_offset = host_begin + piece.owner * bucket.chunk + next[piece.owner];
    next[piece.owner] += piece.size;
  }
}

}  // namespace

BucketLayout BucketLayout::Cut(absl::Span<const size_t> parameter_sizes, size_t bucket_floats, int shard_ranks,
                               size_t piece_elements) {
  BucketLayout layout;
  std::vector<size_t> first_piece(parameter_sizes.size(), 0);
  for (size_t p = 0; p < parameter_sizes.size(); ++p) {
    first_piece[p] = layout.norm_pieces;
    layout.norm_pieces += NormPieceCount(parameter_sizes[p], piece_elements);
  }
  size_t open = 0;  // floats in the last bucket
  for (size_t p = parameter_sizes.size(); p-- > 0;) {
    const size_t size = parameter_sizes[p];
    for (size_t k = 0; k * piece_elements < size; ++k) {
      Piece piece;
      piece.parameter = p;
      piece.offset = k * piece_elements;
      piece.size = std::min(piece_elements, size - piece.offset);
      piece.norm_piece = first_piece[p] + k;
      if (layout.buckets.empty() || (open > 0 && open + piece.size > bucket_floats)) {
        layout.buckets.emplace_back();
        open = 0;
      }
      layout.buckets.back().pieces.push_back(piece);
      layout.buckets.back().lowest_parameter = p;
      open += piece.size;
    }
  }
  for (Bucket& bucket : layout.buckets) {
    PlaceOnHost(bucket, shard_ranks, layout.host_floats);
    layout.host_floats += bucket.host_size;
  }
  return layout;
}

size_t BucketLayout::LargestChunkFloats(size_t bucket_floats, int ranks, bool sharded, size_t piece_elements) {
  // A bucket passes bucket_floats only when it is one piece.
  const size_t largest = std::max({bucket_floats, piece_elements, size_t{1}});
  const size_t d = static_cast<size_t>(std::max(1, ranks));
  const size_t even = (largest + d - 1) / d;
  // Sharded, a rank's run of pieces may reach one piece past its d-th.
  return sharded && d > 1 ? std::min(largest, even + piece_elements) : even;
}

}  // namespace shardline::worker::runtime
