#include "common/half.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace shardline::common {
namespace {

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint32_t Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

TEST(HalfTest, EveryFiniteF16RoundTripsExactly) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    if ((h & 0x7c00u) == 0x7c00u) continue;  // Inf/NaN below
    ASSERT_EQ(FloatToFloat16Bits(Float16BitsToFloat(h)), h) << std::hex << bits;
  }
}

TEST(HalfTest, EveryFiniteBf16RoundTripsExactly) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    if ((h & 0x7f80u) == 0x7f80u) continue;
    ASSERT_EQ(FloatToBFloat16Bits(BFloat16BitsToFloat(h)), h) << std::hex << bits;
  }
}

TEST(HalfTest, F16RoundsToNearestEven) {
  // 1 + 2^-11 is half-way between 1 and 1 + 2^-10: ties go to the even 1.
  EXPECT_EQ(FloatToFloat16Bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3·2^-11 is half-way between 1 + 2^-10 (odd) and 1 + 2^-9: goes up.
  EXPECT_EQ(FloatToFloat16Bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToFloat16Bits(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
}

TEST(HalfTest, F16OverflowSubnormalsAndSpecials) {
  EXPECT_EQ(FloatToFloat16Bits(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFloat16Bits(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToFloat16Bits(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(FloatToFloat16Bits(-1e9f), 0xfc00);
  EXPECT_EQ(FloatToFloat16Bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToFloat16Bits(std::ldexp(1.0f, -26)), 0x0000);  // underflows to zero
  EXPECT_EQ(FloatToFloat16Bits(-0.0f), 0x8000);
  EXPECT_EQ(Float16BitsToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isnan(Float16BitsToFloat(FloatToFloat16Bits(std::nanf("")))));
  EXPECT_EQ(Float16BitsToFloat(0xfc00), -std::numeric_limits<float>::infinity());
}

TEST(HalfTest, Bf16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x3f818000u)), 0x3f82);  // tie, odd goes up
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(BFloat16BitsToFloat(FloatToBFloat16Bits(FromBits(0x7f800001u)))));
  EXPECT_EQ(FloatToBFloat16Bits(std::numeric_limits<float>::infinity()), 0x7f80);
}

// The array forms are separate code (F16C instructions where the CPU has
// them, else branch-free vectorised loops): bit for bit the scalar
// conversions, both paths, on every 16-bit pattern and on a sweep of float
// patterns that includes every threshold of the f16 rounding.
TEST(HalfTest, ArrayConversionsAgreeWithScalarOnesBitForBit) {
  std::vector<uint16_t> halves(65536);
  for (uint32_t i = 0; i < 65536; ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> widened(halves.size());
  for (auto convert : {&ConvertF16ToF32, &internal::F16ToF32Portable}) {
    convert(halves.data(), widened.data(), halves.size());
    for (uint32_t i = 0; i < 65536; ++i) {
      ASSERT_EQ(Bits(widened[i]), Bits(Float16BitsToFloat(halves[i]))) << "f16 " << i;
    }
  }
  ConvertBf16ToF32(halves.data(), widened.data(), halves.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(Bits(widened[i]), Bits(BFloat16BitsToFloat(halves[i]))) << "bf16 " << i;
  }

  std::vector<uint32_t> patterns;
  for (uint64_t x = 0; x <= 0xffffffffu; x += 4093) patterns.push_back(static_cast<uint32_t>(x));
  for (uint32_t edge : {0x00000000u, 0x00000001u, 0x007fffffu, 0x00800000u, 0x33000000u, 0x33000001u,
                        0x387fefffu, 0x387ff000u, 0x38800000u, 0x477fefffu, 0x477ff000u, 0x477ff001u,
                        0x7f7fffffu, 0x7f800000u, 0x7f800001u, 0x7fc00000u, 0x7fffffffu}) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      for (int d = -2; d <= 2; ++d) patterns.push_back((edge | sign) + static_cast<uint32_t>(d));
    }
  }
  std::vector<float> floats(patterns.size() + 3);  // a length no vector width divides
  for (size_t i = 0; i < patterns.size(); ++i) floats[i] = FromBits(patterns[i]);
  std::vector<uint16_t> f16(floats.size()), portable(floats.size()), bf16(floats.size());
  ConvertF32ToF16(floats.data(), f16.data(), floats.size());
  internal::F32ToF16Portable(floats.data(), portable.data(), floats.size());
  ConvertF32ToBf16(floats.data(), bf16.data(), floats.size());
  for (size_t i = 0; i < floats.size(); ++i) {
    ASSERT_EQ(f16[i], FloatToFloat16Bits(floats[i])) << std::hex << "f32 bits 0x" << Bits(floats[i]);
    ASSERT_EQ(portable[i], f16[i]) << std::hex << "f32 bits 0x" << Bits(floats[i]);
    ASSERT_EQ(bf16[i], FloatToBFloat16Bits(floats[i])) << std::hex << "f32 bits 0x" << Bits(floats[i]);
  }
}

}  // namespace
}  // namespace shardline::common
