#include "common/half.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

namespace shardline::common {
namespace {

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
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

TEST(HalfTest, ArrayConversionsAgreeWithScalarOnes) {
  const float src[] = {0.1f, -2.5f, 1e-5f, 3e4f, -7.0f};
  uint16_t h[5], b[5];
  float back[5];
  ConvertF32ToF16(src, h, 5);
  ConvertF32ToBf16(src, b, 5);
  ConvertF16ToF32(h, back, 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(h[i], FloatToFloat16Bits(src[i]));
    EXPECT_EQ(b[i], FloatToBFloat16Bits(src[i]));
    EXPECT_EQ(back[i], Float16BitsToFloat(h[i]));
  }
  ConvertBf16ToF32(b, back, 5);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(back[i], src[i], std::fabs(src[i]) / 128);
}

}  // namespace
}  // namespace shardline::common
