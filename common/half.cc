#include "common/half.h"

#include <cpuid.h>
#include <immintrin.h>

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
  if (exponent == 31) {  // infinity, or NaN made quiet as IEEE (and x86's F16C) would
    return BitsFloat(sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u));
  }
  return BitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// The array forms are what stage links run on every bf16/f16 tensor, so they
// must keep up with the wire: they compute every case for every element and
// select, with no branches, so that the compiler vectorises them (an AVX2
// clone where the CPU has it), and f16 uses the CPU's F16C instructions where
// it has them: 2-5x the scalar loops (5-8 GB/s of f32 here). Same results,
// bit for bit (tests/common/half_test.cc: every 16-bit pattern, both f16
// paths, a sweep of floats through every rounding threshold).

__attribute__((target_clones("avx2", "default"))) void ConvertF32ToBf16(const float* src, uint16_t* dst,
                                                                         size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = FloatBits(src[i]);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (x >> 16) | 0x0040u;
    dst[i] = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

__attribute__((target_clones("avx2", "default"))) void ConvertBf16ToF32(const uint16_t* src, float* dst,
                                                                         size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = BitsFloat(static_cast<uint32_t>(src[i]) << 16);
}

namespace {

// Where the CPU converts in hardware (F16C: IEEE, round to nearest even,
// the same NaN payloads), 8 values at a time; the rest goes through the
// portable loops below.
__attribute__((target("avx2,f16c"))) size_t F32ToF16Hardware(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  return i;
}

__attribute__((target("avx2,f16c"))) size_t F16ToF32Hardware(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  return i;
}

// From CPUID (clang's __builtin_cpu_supports knows no "f16c"): F16C is leaf
// 1 ECX bit 29, AVX2 leaf 7 EBX bit 5, and the OS must save the AVX state.
bool HasF16c() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const bool f16c = (c >> 29) & 1, osxsave = (c >> 27) & 1;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return f16c && osxsave && ((b >> 5) & 1) && __builtin_cpu_supports("avx2");
  }();
  return has;
}

}  // namespace

namespace internal {

__attribute__((target_clones("avx2", "default"))) void F32ToF16Portable(const float* src, uint16_t* dst,
                                                                         size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = FloatBits(src[i]);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t abs = x & 0x7fffffffu;
    const uint32_t normal = (abs + 0xc8000fffu + ((abs >> 13) & 1u)) >> 13;
    const uint32_t subnormal = FloatBits(BitsFloat(abs) + 0.5f) - 0x3f000000u;
    const uint32_t nan = 0x7c00u | 0x200u | ((abs >> 13) & 0x3ffu);
    uint32_t bits = abs < 0x38800000u ? subnormal : normal;
    bits = abs >= 0x477ff000u ? 0x7c00u : bits;  // overflow and infinity
    bits = abs > 0x7f800000u ? nan : bits;
    dst[i] = static_cast<uint16_t>(sign | bits);
  }
}

__attribute__((target_clones("avx2", "default"))) void F16ToF32Portable(const uint16_t* src, float* dst,
                                                                         size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t h = src[i];
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu;
    const uint32_t mantissa = h & 0x3ffu;
    const uint32_t normal = ((exponent + 112u) << 23) | (mantissa << 13);
    const uint32_t special = 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u);
    const uint32_t subnormal = FloatBits(static_cast<float>(mantissa) * 5.9604644775390625e-8f);  // 2^-24
    uint32_t bits = exponent == 0 ? subnormal : normal;
    bits = exponent == 31 ? special : bits;
    dst[i] = BitsFloat(sign | bits);
  }
}

}  // namespace internal

void ConvertF32ToF16(const float* src, uint16_t* dst, size_t n) {
  const size_t done = HasF16c() ? F32ToF16Hardware(src, dst, n) : 0;
  internal::F32ToF16Portable(src + done, dst + done, n - done);
}

void ConvertF16ToF32(const uint16_t* src, float* dst, size_t n) {
  const size_t done = HasF16c() ? F16ToF32Hardware(src, dst, n) : 0;
  internal::F16ToF32Portable(src + done, dst + done, n - done);
}

void RoundThroughBf16(float* values, size_t n) {
  for (size_t i = 0; i < n; ++i) values[i] = BFloat16BitsToFloat(FloatToBFloat16Bits(values[i]));
}

void RoundThroughF16(float* values, size_t n) {
  for (size_t i = 0; i < n; ++i) values[i] = Float16BitsToFloat(FloatToFloat16Bits(values[i]));
}

}  // namespace shardline::common
