#include "worker/runtime/stage_frame_coding.h"

#include <cmath>

#include "gtest/gtest.h"

namespace shardline::worker::runtime {
namespace {

StageMessage Message(size_t n) {
  StageMessage m;
  m.kind = StageMessage::Kind::kActivation;
  m.step = 7;
  m.micro_batch = 3;
  m.batch = 2;
  m.t = 5;
  m.targets = {1, -1, 4};
  m.loss_scale = 0.25f;
  for (size_t i = 0; i < n; ++i) m.values.push_back(std::sin(static_cast<float>(i)) * 1000.0f + 1e-3f * i);
  return m;
}

StageMessage RoundTrip(const StageMessage& m, size_t chunk_bytes, common::DType wire, size_t* frames = nullptr) {
  FrameAssembler assembler;
  const auto encoded = EncodeStageMessage(m, chunk_bytes, wire);
  if (frames != nullptr) *frames = encoded.size();
  std::optional<StageMessage> out;
  for (size_t i = 0; i < encoded.size(); ++i) {
    auto added = assembler.Add(encoded[i]);
    EXPECT_TRUE(added.ok()) << added.status();
    EXPECT_EQ(added->has_value(), i + 1 == encoded.size());
    if (added->has_value()) out = std::move(**added);
  }
  EXPECT_TRUE(out.has_value());
  return *out;
}

TEST(StageFrameCodingTest, F32RoundTripsExactlyInChunks) {
  const StageMessage m = Message(1000);
  size_t frames = 0;
  const StageMessage back = RoundTrip(m, 256, common::DType::kF32, &frames);
  EXPECT_EQ(frames, 16u);  // 4000 bytes in 256-byte chunks
  EXPECT_EQ(back.values, m.values);
  EXPECT_EQ(back.targets, m.targets);
  EXPECT_EQ(back.step, 7);
  EXPECT_EQ(back.micro_batch, 3);
  EXPECT_EQ(back.loss_scale, 0.25f);
  EXPECT_TRUE(RoundTrip(Message(0), 256, common::DType::kF32).values.empty());
}

TEST(StageFrameCodingTest, HalfPrecisionWiresHalveTheBytesAndRoundLikeTheLocalLinks) {
  for (common::DType wire : {common::DType::kBF16, common::DType::kF16}) {
    SCOPED_TRACE(common::DTypeName(wire));
    const StageMessage m = Message(1000);
    size_t frames = 0;
    const StageMessage back = RoundTrip(m, 256, wire, &frames);
    EXPECT_EQ(frames, 8u) << "2000 bytes";
    std::vector<float> expected = m.values;
    RoundToWirePrecision(expected, wire);
    EXPECT_EQ(back.values, expected);
    EXPECT_NE(back.values, m.values) << "the values really were rounded";
    for (size_t i = 0; i < m.values.size(); ++i) {
      EXPECT_NEAR(back.values[i], m.values[i], std::fabs(m.values[i]) / 128 + 1e-3);
    }
  }
}

TEST(StageFrameCodingTest, InconsistentChunksAreRejected) {
  auto frames = EncodeStageMessage(Message(100), 64, common::DType::kF32);
  ASSERT_GT(frames.size(), 2u);
  FrameAssembler assembler;
  ASSERT_TRUE(assembler.Add(frames[0]).ok());
  frames[1].set_dtype(shardline::v1::DTYPE_BF16);
  EXPECT_EQ(assembler.Add(frames[1]).status().code(), absl::StatusCode::kInvalidArgument)
      << "a tensor's chunks must share one dtype";
  // The assembler starts over cleanly after an error.
  auto again = EncodeStageMessage(Message(10), 1 << 20, common::DType::kF32);
  auto added = assembler.Add(again[0]);
  ASSERT_TRUE(added.ok());
  EXPECT_TRUE(added->has_value());
  shardline::v1::StageFrame odd = again[0];
  odd.set_payload(std::string(7, '\0'));
  odd.set_elements(2);
  EXPECT_FALSE(assembler.Add(odd).ok()) << "payload not whole values";
}

}  // namespace
}  // namespace shardline::worker::runtime
