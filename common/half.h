// IEEE binary16 (f16) and bfloat16 (bf16) storage types and their conversion
// to and from float. Conversion to the narrow types rounds to nearest, ties to
// even, as the CUDA intrinsics __float2half_rn / __float2bfloat16_rn do, so the
// CPU and CUDA backends agree bit for bit on finite values. NaN stays NaN
// (a signalling f16 NaN widens to a quiet one, as IEEE and F16C have it).
#ifndef SHARDLINE_COMMON_HALF_H_
#define SHARDLINE_COMMON_HALF_H_

#include <cstddef>
#include <cstdint>

namespace shardline::common {

struct BFloat16 {
  uint16_t bits = 0;
};
struct Float16 {
  uint16_t bits = 0;
};
static_assert(sizeof(BFloat16) == 2 && sizeof(Float16) == 2);

uint16_t FloatToBFloat16Bits(float value);
float BFloat16BitsToFloat(uint16_t bits);
uint16_t FloatToFloat16Bits(float value);
float Float16BitsToFloat(uint16_t bits);

// Array forms; `n` elements, buffers must not overlap.
void ConvertF32ToBf16(const float* src, uint16_t* dst, size_t n);
void ConvertBf16ToF32(const uint16_t* src, float* dst, size_t n);
void ConvertF32ToF16(const float* src, uint16_t* dst, size_t n);
void ConvertF16ToF32(const uint16_t* src, float* dst, size_t n);

namespace internal {
// The portable f16 loops that Convert*F16* fall back on where the CPU lacks
// F16C (and use for the last few values); for tests.
void F32ToF16Portable(const float* src, uint16_t* dst, size_t n);
void F16ToF32Portable(const uint16_t* src, float* dst, size_t n);
}  // namespace internal

// In place, what each value becomes after a trip through bf16 / f16.
void RoundThroughBf16(float* values, size_t n);
void RoundThroughF16(float* values, size_t n);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_HALF_H_
