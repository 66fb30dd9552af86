// BucketLayout cuts a shard's gradients into the buckets its data-parallel
// group sums, one collective call each, and places them in one host buffer.
// Buckets take whole norm pieces (norm_pieces.h), last parameters first (the
// backward pass finishes them first), until the next piece would pass
// `bucket_floats` (a bucket holds at least one piece).
//
// Sharded (ZeRO-1, `shard_ranks` > 1), each of a bucket's pieces has an
// owner: the ranks take consecutive runs of pieces, rank r those starting in
// the r-th d-th of the bucket. The bucket's host span is d equal chunks of `chunk` floats,
// rank r's pieces at the start of chunk r and zeros after them, so that a
// reduce-scatter or all-gather of the span (Collective::ChunkOf) moves
// exactly each rank's pieces. A parameter in several buckets has a run of
// pieces per bucket on a rank. Unsharded, the pieces lie end to end and
// every rank owns them all.
#ifndef SHARDLINE_WORKER_RUNTIME_BUCKET_LAYOUT_H_
#define SHARDLINE_WORKER_RUNTIME_BUCKET_LAYOUT_H_

#include <cstddef>
#include <vector>

#include "absl/types/span.h"
#include "worker/runtime/norm_pieces.h"

namespace shardline::worker::runtime {

struct BucketLayout {
  // One norm piece in a bucket.
  struct Piece {
    size_t parameter = 0;    // index in parameter order
    size_t offset = 0;       // first element within the parameter
    size_t size = 0;
    size_t norm_piece = 0;   // index among all the shard's pieces, parameter order
    size_t host_offset = 0;  // in the host buffer
    int owner = -1;          // the rank that updates it; -1 unsharded (every rank)
  };
  struct Bucket {
    std::vector<Piece> pieces;
    size_t lowest_parameter = 0;  // complete once gradients from here on are final
    size_t host_begin = 0;        // its span of the host buffer
    size_t host_size = 0;         // shard_ranks · chunk when sharded
    size_t chunk = 0;             // sharded: floats per rank's chunk
  };

  std::vector<Bucket> buckets;
  size_t host_floats = 0;   // the host buffer's size
  size_t norm_pieces = 0;   // all the shard's pieces

  static BucketLayout Cut(absl::Span<const size_t> parameter_sizes, size_t bucket_floats, int shard_ranks,
                          size_t piece_elements = kNormPieceElements);

  // The largest chunk (floats) one rank of `ranks` moves for any bucket cut
  // with `bucket_floats`: what a collective's staging slots must hold.
  static size_t LargestChunkFloats(size_t bucket_floats, int ranks, bool sharded,
                                   size_t piece_elements = kNormPieceElements);
};

}  // namespace shardline::worker::runtime

#endif  // SHARDLINE_WORKER_RUNTIME_BUCKET_LAYOUT_H_
