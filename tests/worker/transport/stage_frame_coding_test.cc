#include "worker/transport/stage_frame_coding.h"

#include <cmath>
#include <cstring>

#include "common/half.h"
#include "common/int8_blocks.h"
#include "gtest/gtest.h"

namespace shardline::worker::transport {
namespace {

using shardline::v1::StageFrame;

StageMessage Message(size_t n) {
  StageMessage m;
  m.kind = StageMessage::Kind::kActivation;
  m.step = 7;
  m.micro_batch = 3;
  m.batch = 2;
  m.t = 5;
  m.targets = {1, -1, 4};
  m.loss_scale = 0.25f;
  std::vector<float> values;
  for (size_t i = 0; i < n; ++i) values.push_back(std::sin(static_cast<float>(i)) * 1000.0f + 1e-3f * i);
  m.values = std::move(values);
  return m;
}

absl::StatusOr<std::optional<StageMessage>> Add(FrameAssembler& assembler, const grpc::ByteBuffer& frame) {
  absl::StatusOr<common::DecodedFrame> decoded = common::DecodeFrame(frame);
  if (!decoded.ok()) return decoded.status();
  return assembler.Add(*decoded);
}

StageMessage RoundTrip(const StageMessage& m, size_t chunk_bytes, size_t* frames = nullptr,
                       WireCodec codec = WireCodec::kAsIs) {
  FrameAssembler assembler;
  const auto encoded = EncodeStageMessage(std::make_shared<StageMessage>(m), chunk_bytes, codec);
  if (frames != nullptr) *frames = encoded.size();
  std::optional<StageMessage> out;
  for (size_t i = 0; i < encoded.size(); ++i) {
    auto added = Add(assembler, encoded[i]);
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
  const StageMessage back = RoundTrip(m, 256, &frames);
  EXPECT_EQ(frames, 16u);  // 4000 bytes in 256-byte chunks
  EXPECT_EQ(back.values, m.values);
  EXPECT_EQ(back.targets, m.targets);
  EXPECT_EQ(back.step, 7);
  EXPECT_EQ(back.micro_batch, 3);
  EXPECT_EQ(back.loss_scale, 0.25f);
  EXPECT_EQ(back.dtype, common::DType::kF32);
  EXPECT_TRUE(RoundTrip(Message(0), 256).values.empty());
}

TEST(StageFrameCodingTest, AMessageOfTwoTimedFramesOrMoreGoesAsTwoAtLeast) {
  // The receiver times the wire by a frame that follows another at once
  // (wire_pace.h): a message under the chunk size still goes as two halves.
  constexpr size_t kTimed = kMinTimedFrameBytes / sizeof(float);
  size_t frames = 0;
  const StageMessage m = Message(2 * kTimed);
  EXPECT_EQ(RoundTrip(m, kDefaultChunkBytes, &frames).values, m.values);
  EXPECT_EQ(frames, 2u);
  const StageMessage odd = Message(2 * kTimed + 1);  // halves of whole floats, the second shorter
  EXPECT_EQ(RoundTrip(odd, kDefaultChunkBytes, &frames).values, odd.values);
  EXPECT_EQ(frames, 2u);
  RoundTrip(Message(2 * kTimed - 1), kDefaultChunkBytes, &frames);
  EXPECT_EQ(frames, 1u);  // too small to time: as it was
  RoundTrip(Message(3 * (kDefaultChunkBytes / sizeof(float))), kDefaultChunkBytes, &frames);
  EXPECT_EQ(frames, 3u);  // larger than two chunks: chunks as before
  const StageMessage blocks = Message(kDefaultChunkBytes / sizeof(float) * 3);  // 8-bit blocks: ~800 KiB
  const StageMessage back = RoundTrip(blocks, kDefaultChunkBytes, &frames, WireCodec::kInt8Blocks);
  EXPECT_EQ(frames, 2u);
  ASSERT_EQ(back.values.size(), blocks.values.size());
}

TEST(StageFrameCodingTest, F32FramesAliasTheMessageUntilTheyAreDropped) {
  auto m = std::make_shared<StageMessage>(Message(1000));
  std::weak_ptr<StageMessage> watch = m;
  const float* values = m->values.data();
  auto frames = EncodeStageMessage(std::move(m), 1024);
  ASSERT_EQ(frames.size(), 4u);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(frames[1].Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(static_cast<const void*>(slices[1].begin()), static_cast<const void*>(values + 256));
  slices.clear();
  frames.pop_back();
  EXPECT_FALSE(watch.expired());
  frames.clear();
  EXPECT_TRUE(watch.expired());
}

// 16-bit tensors (narrowed by the sending stage's device) travel as they
// are: half the bytes, every bit kept, the dtype with them.
TEST(StageFrameCodingTest, HalfPrecisionTensorsTravelAsTheyAre) {
  for (common::DType wire : {common::DType::kBF16, common::DType::kF16}) {
    SCOPED_TRACE(common::DTypeName(wire));
    StageMessage m = Message(1001);  // odd: the last value fills half a float
    std::vector<uint16_t> halves(m.values.size());
    if (wire == common::DType::kBF16) {
      common::ConvertF32ToBf16(m.values.data(), halves.data(), halves.size());
    } else {
      common::ConvertF32ToF16(m.values.data(), halves.data(), halves.size());
    }
    std::memcpy(m.values.data(), halves.data(), halves.size() * 2);
    m.dtype = wire;
    size_t frames = 0;
    const StageMessage back = RoundTrip(m, 256, &frames);
    EXPECT_EQ(frames, 8u) << "2002 bytes";
    EXPECT_EQ(back.dtype, wire);
    ASSERT_EQ(back.values.size(), m.values.size());
    std::vector<uint16_t> got(halves.size());
    std::memcpy(got.data(), back.values.data(), got.size() * 2);
    EXPECT_EQ(got, halves);
  }
}

grpc::ByteBuffer Frame(StageFrame header, size_t payload_bytes) {
  auto payload = std::make_shared<std::string>(payload_bytes, '\0');
  return common::EncodeFrame(header, payload->data(), payload->size(), payload);
}

StageFrame Header(uint32_t index, uint32_t count, int64_t elements) {
  StageFrame f;
  f.set_kind(StageFrame::GRADIENT);
  f.set_dtype(shardline::v1::DTYPE_F32);
  f.set_elements(elements);
  f.set_chunk_index(index);
  f.set_chunk_count(count);
  return f;
}

// 8-bit blocks: an f32 activation or gradient crosses in whole-block
// chunks at about a quarter of the bytes and arrives as f32 within the
// codec's bound; norms and 16-bit values are not touched.
TEST(StageFrameCodingTest, Int8BlocksCrossInWholeBlocksAndArriveAsF32WithinTheBound) {
  for (StageMessage::Kind kind : {StageMessage::Kind::kActivation, StageMessage::Kind::kGradient}) {
    StageMessage m = Message(1000);
    m.kind = kind;
    if (kind == StageMessage::Kind::kGradient) m.targets.clear();
    size_t frames = 0;
    const StageMessage back = RoundTrip(m, 300, &frames, WireCodec::kInt8Blocks);
    EXPECT_EQ(frames, 4u) << "16 blocks (1088 bytes) in chunks of 4 blocks (272 bytes)";
    EXPECT_EQ(back.dtype, common::DType::kF32);
    EXPECT_EQ(back.targets, m.targets);
    ASSERT_EQ(back.values.size(), m.values.size());
    for (size_t b = 0; b < 1000; b += common::kInt8BlockValues) {
      float largest = 0;
      const size_t end = std::min<size_t>(1000, b + common::kInt8BlockValues);
      for (size_t i = b; i < end; ++i) largest = std::max(largest, std::fabs(m.values[i]));
      for (size_t i = b; i < end; ++i) {
        ASSERT_LE(std::fabs(back.values[i] - m.values[i]), largest / 254 * 1.0001f) << i;
      }
    }
  }
  auto encoded = EncodeStageMessage(std::make_shared<StageMessage>(Message(1000)), 1 << 20, WireCodec::kInt8Blocks);
  ASSERT_EQ(encoded.size(), 1u);
  EXPECT_LT(encoded[0].Length(), 1200u) << "4000 bytes of f32 as 1088 of blocks and a header";
  StageMessage norm = Message(3);
  norm.kind = StageMessage::Kind::kNormPartial;
  norm.targets.clear();
  EXPECT_EQ(RoundTrip(norm, 256, nullptr, WireCodec::kInt8Blocks).values, norm.values) << "norms stay exact";
}

// A collective's sum encoded by its sender (error feedback needs the
// blocks it sends): the blocks go as they are, whatever the link's codec,
// and decode to the f32 values the message carries.
TEST(StageFrameCodingTest, PreEncodedCollectiveBlocksGoAsTheyAre) {
  StageMessage m = Message(200);
  m.kind = StageMessage::Kind::kCollective;
  m.targets.clear();
  m.sequence = 12;
  m.int8_blocks.resize(common::Int8BlocksBytes(200));
  common::EncodeInt8Blocks(absl::Span<const float>(m.values.data(), 200), absl::MakeSpan(m.int8_blocks));
  std::vector<float> decoded(200);
  ASSERT_TRUE(common::DecodeInt8Blocks(m.int8_blocks, absl::MakeSpan(decoded)).ok());
  m.values = decoded;
  size_t frames = 0;
  const StageMessage back = RoundTrip(m, 136, &frames);
  EXPECT_EQ(frames, 2u) << "4 blocks (212 bytes) in chunks of 2 blocks";
  EXPECT_EQ(back.kind, StageMessage::Kind::kCollective);
  EXPECT_EQ(back.dtype, common::DType::kF32);
  EXPECT_EQ(back.sequence, 12u);
  EXPECT_EQ(back.values.ToVector(), decoded) << "the receiver decodes what the sender kept";
  m.int8_blocks.clear();
  EXPECT_EQ(RoundTrip(m, 1 << 20, nullptr, WireCodec::kInt8Blocks).values, m.values)
      << "a link's codec does not quantize a collective's f32 values";
}

TEST(StageFrameCodingTest, MalformedInt8FramesAreRefused) {
  FrameAssembler assembler;
  StageFrame h = Header(0, 1, 100);
  h.set_dtype(shardline::v1::DTYPE_I8_BLOCK64);
  EXPECT_FALSE(Add(assembler, Frame(h, 100 + 8 - 1)).ok()) << "a byte short";
  EXPECT_FALSE(Add(assembler, Frame(h, 100 + 8 + 1)).ok()) << "a byte over";
  auto whole = Add(assembler, Frame(h, 100 + 8));  // zero scales: zeros
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE(whole->has_value());
  EXPECT_EQ((*whole)->values[99], 0.0f);
  StageFrame first = Header(0, 2, 100);
  first.set_dtype(shardline::v1::DTYPE_I8_BLOCK64);
  EXPECT_FALSE(Add(assembler, Frame(first, 60)).ok()) << "a first chunk of part of a block";
  EXPECT_TRUE(Add(assembler, Frame(first, 68)).ok());
  StageFrame second = Header(1, 2, 100);
  second.set_dtype(shardline::v1::DTYPE_I8_BLOCK64);
  EXPECT_TRUE(Add(assembler, Frame(second, 40))->has_value()) << "36 values and their scale";
  StageFrame norm = Header(0, 1, 1);
  norm.set_kind(StageFrame::NORM_PARTIAL);
  norm.set_dtype(shardline::v1::DTYPE_I8_BLOCK64);
  EXPECT_FALSE(Add(assembler, Frame(norm, 5)).ok()) << "8-bit blocks carry activations and gradients only";
  // A negative scale: no encoder writes one.
  auto payload = std::make_shared<std::string>(68, '\0');
  const float negative = -1;
  std::memcpy(payload->data(), &negative, 4);
  StageFrame one = Header(0, 1, 64);
  one.set_dtype(shardline::v1::DTYPE_I8_BLOCK64);
  EXPECT_FALSE(Add(assembler, common::EncodeFrame(one, payload->data(), payload->size(), payload)).ok());
}

TEST(StageFrameCodingTest, InconsistentChunksAreRejectedAndTheAssemblerStartsOver) {
  FrameAssembler assembler;
  ASSERT_TRUE(Add(assembler, Frame(Header(0, 2, 4), 8)).ok());
  StageFrame other_dtype = Header(1, 2, 4);
  other_dtype.set_dtype(shardline::v1::DTYPE_BF16);
  EXPECT_EQ(Add(assembler, Frame(other_dtype, 4)).status().code(), absl::StatusCode::kInvalidArgument)
      << "a tensor's chunks must share one dtype";
  auto whole = Add(assembler, Frame(Header(0, 1, 2), 8));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(whole->has_value());
  EXPECT_FALSE(Add(assembler, Frame(Header(0, 1, 2), 7)).ok()) << "payload not whole values";
  EXPECT_FALSE(Add(assembler, Frame(Header(0, 1, 2), 12)).ok()) << "payload larger than the tensor";
  EXPECT_FALSE(Add(assembler, Frame(Header(0, 1, 2), 4)).ok()) << "payload shorter than the tensor";
  EXPECT_FALSE(Add(assembler, Frame(Header(1, 2, 4), 8)).ok()) << "chunk 1 before chunk 0";
  StageFrame late_targets = Header(1, 2, 4);
  ASSERT_TRUE(Add(assembler, Frame(Header(0, 2, 4), 8)).ok());
  late_targets.add_targets(1);
  EXPECT_FALSE(Add(assembler, Frame(late_targets, 8)).ok()) << "targets outside chunk 0";
}

// A validation pass's activations (step −N) carry its batch count; no
// other frame may.
TEST(StageFrameCodingTest, ValidationActivationsCarryTheirBatchCountAndNothingElseDoes) {
  StageMessage m = Message(100);
  m.step = -4;
  m.eval_batches = 9;
  const StageMessage back = RoundTrip(m, 128);
  EXPECT_EQ(back.step, -4);
  EXPECT_EQ(back.eval_batches, 9);
  EXPECT_EQ(RoundTrip(Message(100), 128).eval_batches, 0);
  FrameAssembler assembler;
  StageFrame on_gradient = Header(0, 1, 2);
  on_gradient.set_step(-4);
  on_gradient.set_eval_batches(3);
  EXPECT_EQ(Add(assembler, Frame(on_gradient, 8)).status().code(), absl::StatusCode::kInvalidArgument);
  StageFrame on_training = Header(0, 1, 2);
  on_training.set_kind(StageFrame::ACTIVATION);
  on_training.set_step(4);
  on_training.set_eval_batches(3);
  EXPECT_EQ(Add(assembler, Frame(on_training, 8)).status().code(), absl::StatusCode::kInvalidArgument);
  StageFrame negative = Header(0, 1, 2);
  negative.set_kind(StageFrame::ACTIVATION);
  negative.set_step(-4);
  negative.set_eval_batches(-1);
  EXPECT_EQ(Add(assembler, Frame(negative, 8)).status().code(), absl::StatusCode::kInvalidArgument);
}

// The hostile-client probe: a 20-byte frame announcing 2^30 values in two
// chunks and carrying none made the receiver allocate 4 GiB.
TEST(StageFrameCodingTest, AHeaderAnnouncingMoreThanTheLinkCarriesIsRefusedBeforeAllocating) {
  FrameLimits limits;
  limits.max_elements = 1 << 12;  // the job's largest micro-batch tensor
  FrameAssembler assembler(nullptr, limits);
  const grpc::ByteBuffer probe = Frame(Header(0, 2, int64_t{1} << 30), 0);
  EXPECT_LE(probe.Length(), 32u);
  auto refused = Add(assembler, probe);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("at most 4096"), std::string::npos) << refused.status();
  EXPECT_EQ(Add(assembler, Frame(Header(0, 1, (1 << 12) + 1), 4 * ((1 << 12) + 1))).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto fits = Add(assembler, Frame(Header(0, 1, 1 << 12), 4 << 12));
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_TRUE(fits->has_value());
}

TEST(StageFrameCodingTest, TheFirstChunkMustCarryItsShareOfTheTensor) {
  FrameAssembler assembler;
  EXPECT_FALSE(Add(assembler, Frame(Header(0, 2, 1 << 20), 0)).ok()) << "no payload";
  EXPECT_FALSE(Add(assembler, Frame(Header(0, 4, 1 << 20), 4096)).ok()) << "4 chunks of 4 KiB are not 4 MiB";
  EXPECT_FALSE(Add(assembler, Frame(Header(0, 2, 16), 64)).ok()) << "one full chunk would need no second";
  EXPECT_TRUE(Add(assembler, Frame(Header(0, 2, 16), 40)).ok()) << "40 + 24 bytes";
}

TEST(StageFrameCodingTest, TargetsComeOnlyOnActivationsAndNoMoreThanAMicroBatchHolds) {
  FrameLimits limits;
  limits.max_targets = 4;
  FrameAssembler assembler(nullptr, limits);
  StageFrame gradient = Header(0, 1, 2);
  gradient.add_targets(1);
  EXPECT_EQ(Add(assembler, Frame(gradient, 8)).status().code(), absl::StatusCode::kInvalidArgument);
  StageFrame activation = Header(0, 1, 2);
  activation.set_kind(StageFrame::ACTIVATION);
  for (int i = 0; i < 5; ++i) activation.add_targets(i);
  EXPECT_EQ(Add(assembler, Frame(activation, 8)).status().code(), absl::StatusCode::kInvalidArgument);
  activation.mutable_targets()->RemoveLast();
  EXPECT_TRUE(Add(assembler, Frame(activation, 8)).ok());
}

}  // namespace
}  // namespace shardline::worker::transport
