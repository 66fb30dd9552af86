// The 8-bit blockwise wire codec (parallel.wire_dtype "int8"): f32 values
// in blocks of kInt8BlockValues, each block a little-endian f32 scale (its
// largest magnitude / 127) followed by one int8 per value, round to
// nearest: value ≈ q · scale. The last block may be shorter. About 3.8×
// fewer bytes than f32, for activations and gradients on slow links.
//
// Error bound: |x − decoded| ≤ scale / 2 · (1 + 2⁻¹⁶) per value, where
// scale = max |x| over its block / 127: relative to the block's largest
// value, at most 1/254. A block holding a NaN or an infinity has a NaN
// scale and decodes as NaN throughout (the loss scaler and the gradient
// norm see it, as they would the f32 values). Zero blocks decode to zero.
#ifndef SHARDLINE_COMMON_INT8_BLOCKS_H_
#define SHARDLINE_COMMON_INT8_BLOCKS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace shardline::common {

inline constexpr size_t kInt8BlockValues = 64;
inline constexpr size_t kInt8BlockBytes = 4 + kInt8BlockValues;

// Bytes of `values` values encoded.
size_t Int8BlocksBytes(size_t values);

// Encodes `in` into `out`, which must hold Int8BlocksBytes(in.size()) bytes.
void EncodeInt8Blocks(absl::Span<const float> in, absl::Span<char> out);

// Decodes `in` (Int8BlocksBytes(out.size()) bytes) into `out`.
// INVALID_ARGUMENT for another size or a scale that is negative or
// infinite (an encoder writes neither); out is then unspecified.
absl::Status DecodeInt8Blocks(absl::Span<const char> in, absl::Span<float> out);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_INT8_BLOCKS_H_
