#include "common/tensor.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace shardline::common {
namespace {

TEST(TensorTest, ZerosIsAlignedAndZeroed) {
  auto t = Tensor::Zeros(DType::kF32, {3, 5});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->num_elements(), 15);
  EXPECT_EQ(t->byte_size(), 60u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->raw_data()) % Tensor::kAlignment, 0u);
  for (float v : t->values<float>()) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(t->DebugString(), "f32[3, 5]");
}

TEST(TensorTest, BadShapesAreRejectedWithoutAllocating) {
  EXPECT_EQ(Tensor::Zeros(DType::kF32, {4, -2}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tensor::Zeros(DType::kF32, {int64_t{1} << 30, int64_t{1} << 30}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorTest, FromValuesChecksTheCount) {
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  auto t = Tensor::FromValues<float>({2, 3}, values);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->values<float>()[4], 5.0f);
  EXPECT_EQ(Tensor::FromValues<float>({4, 2}, values).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorTest, CopiesAreDeepAndMovesAreCheap) {
  const std::vector<int32_t> values = {7, 8, 9};
  auto t = Tensor::FromValues<int32_t>({3}, values);
  ASSERT_TRUE(t.ok());
  Tensor copy = *t;
  copy.values<int32_t>()[0] = 100;
  EXPECT_EQ(t->values<int32_t>()[0], 7);
  const void* data = copy.raw_data();
  Tensor moved = std::move(copy);
  EXPECT_EQ(moved.raw_data(), data);
  EXPECT_EQ(moved.values<int32_t>()[0], 100);
}

TEST(TensorTest, ReshapeKeepsTheElementCount) {
  auto t = Tensor::Zeros(DType::kF16, {4, 6});
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->Reshape({2, 12}).ok());
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(t->Reshape({5, 5}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{2, 12}));
}

std::vector<uint16_t> Bits(const Tensor& t) {
  const auto* p = static_cast<const uint16_t*>(t.raw_data());
  return std::vector<uint16_t>(p, p + t.num_elements());
}

std::vector<float> Floats(const Tensor& t) {
  const auto values = t.values<float>();
  return std::vector<float>(values.begin(), values.end());
}

// The values worked out by hand, rounding to nearest even:
//  -0.333333f is 0xBEAAAA9F: bf16 keeps 0xBEAA and rounds up (0xAA9F > 0x8000)
//    to 0xBEAB = -171/512 = -0.333984375; f16 (10 fraction bits) has
//    1.333332 × 2^-2 → fraction 341.33/1024 → 341: 0xB555 = -1365/4096.
//  1000.5 is 1.1111010001b × 2^9: bf16's 7 fraction bits drop 001b (under a
//    half) → 1000 (0x447A); f16 holds it exactly (0x63D1, steps of 0.5 there).
//  1000 and -171/512 are exact in f16, so bf16 → f16 → f32 changes nothing.
TEST(TensorTest, ConvertsBetweenFloatTypes) {
  const std::vector<float> values = {1.0f, -0.333333f, 1000.5f};
  auto t = Tensor::FromValues<float>({3}, values);
  ASSERT_TRUE(t.ok());
  auto bf16 = t->ConvertTo(DType::kBF16);
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->byte_size(), 6u);
  EXPECT_EQ(Bits(*bf16), (std::vector<uint16_t>{0x3F80, 0xBEAB, 0x447A}));
  auto f16 = bf16->ConvertTo(DType::kF16);
  ASSERT_TRUE(f16.ok());
  EXPECT_EQ(Bits(*f16), (std::vector<uint16_t>{0x3C00, 0xB558, 0x63D0}));
  auto back = f16->ConvertTo(DType::kF32);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(Floats(*back), (std::vector<float>{1.0f, -0.333984375f, 1000.0f}));
  auto direct = t->ConvertTo(DType::kF16);
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(Bits(*direct), (std::vector<uint16_t>{0x3C00, 0xB555, 0x63D1}));
  EXPECT_EQ(Floats(*direct->ConvertTo(DType::kF32)),
            (std::vector<float>{1.0f, -0.333251953125f, 1000.5f}));
  EXPECT_EQ(t->ConvertTo(DType::kI32).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorDeathTest, WrongElementTypeIsAProgrammingError) {
  auto t = Tensor::Zeros(DType::kF32, {2});
  ASSERT_TRUE(t.ok());
  EXPECT_DEATH(t->values<int32_t>(), "tensor holds f32");
}

}  // namespace
}  // namespace shardline::common
