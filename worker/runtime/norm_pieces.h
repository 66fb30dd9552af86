// The global grad norm is a sum of terms, one per *norm piece*: each
// parameter's gradient cut into pieces of kNormPieceElements (the last one
// shorter), each piece's Σ grad² summed on its own, the terms then added one
// by one in parameter order, piece order. The pieces are fixed by the
// parameter sizes alone, so a replica that owns only some pieces of a
// parameter (ZeRO-1: it holds only those pieces' summed gradients) computes
// exactly the terms every other layout computes, and the sum keeps its bits.
#ifndef SHARDLINE_WORKER_RUNTIME_NORM_PIECES_H_
#define SHARDLINE_WORKER_RUNTIME_NORM_PIECES_H_

#include <cstddef>

namespace shardline::worker::runtime {

inline constexpr size_t kNormPieceElements = size_t{1} << 16;

// The pieces of a parameter of `elements` (at least one, even when empty).
inline size_t NormPieceCount(size_t elements, size_t piece_elements = kNormPieceElements) {
  return elements == 0 ? 1 : (elements + piece_elements - 1) / piece_elements;
}

}  // namespace shardline::worker::runtime

#endif  // SHARDLINE_WORKER_RUNTIME_NORM_PIECES_H_
