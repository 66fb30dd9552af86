#include "common/half.h"

#include <cstring>

namespace shardline::common {
namespace {

uint32_t FloatBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  return x;
}

float BitsFloat(uint32_t x) {
  float f;
  std::memcpy(&f, &x, sizeof(f));
  return f;
}

}  // namespace

uint16_t FloatToBFloat16Bits(float value) {
  uint32_t x = FloatBits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  }
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(x >> 16);
}

float BFloat16BitsToFloat(uint16_t bits) {
  return BitsFloat(static_cast<uint32_t>(bits) << 16);
}

uint16_t FloatToFloat16Bits(float value) {
  uint32_t x = FloatBits(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    const uint32_t nan_bits = abs > 0x7f800000u ? (0x200u | ((abs >> 13) & 0x3ffu)) : 0u;
    return static_cast<uint16_t>(sign | 0x7c00u | nan_bits);
  }
  if (abs >= 0x477ff000u) {  // >= 65520 rounds to infinity
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below 2^-14: a subnormal half or zero
    // Adding 0.5f puts the value's 2^-24 units in the low mantissa bits, and
    // the FPU rounds to nearest even on the way.
    const float shifted = BitsFloat(abs) + 0.5f;
    return static_cast<uint16_t>(sign | (FloatBits(shifted) - 0x3f000000u));
  }
  const uint32_t mantissa_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mantissa_odd;  // rebias exponent by -112, round
  return static_cast<uint16_t>(sign | (abs >> 13));
}

float Float16BitsToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

void ConvertF32ToBf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToBFloat16Bits(src[i]);
}

void ConvertBf16ToF32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = BFloat16BitsToFloat(src[i]);
}

void ConvertF32ToF16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToFloat16Bits(src[i]);
}

void ConvertF16ToF32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Float16BitsToFloat(src[i]);
}

void RoundThroughBf16(float* values, size_t n) {
  for (size_t i = 0; i < n; ++i) values[i] = BFloat16BitsToFloat(FloatToBFloat16Bits(values[i]));
}

void RoundThroughF16(float* values, size_t n) {
  for (size_t i = 0; i < n; ++i) values[i] = Float16BitsToFloat(FloatToFloat16Bits(values[i]));
}

}  // namespace shardline::common
