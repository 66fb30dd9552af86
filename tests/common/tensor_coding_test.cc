#include "common/tensor_coding.h"

#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardline::common {
namespace {

using shardline::v1::StageFrame;

StageFrame Header() {
  StageFrame h;
  h.set_kind(StageFrame::ACTIVATION);
  h.set_step(12);
  h.set_micro_batch(3);
  h.set_elements(1000);
  h.set_norm(2.5);
  h.set_loss_scale(0.125f);
  h.add_targets(-1);
  h.add_targets(300);
  h.set_credit(9);
  return h;
}

std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// The same bytes cut into slices of `piece` bytes (what the network may hand us).
grpc::ByteBuffer Resliced(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i < bytes.size(); i += piece) {
    slices.emplace_back(bytes.data() + i, std::min(piece, bytes.size() - i));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST(TensorCodingTest, FramesAliasThePayloadAndReleaseItWhenDropped) {
  auto payload = std::make_shared<std::vector<float>>(1000);
  std::iota(payload->begin(), payload->end(), 0.0f);
  std::weak_ptr<std::vector<float>> watch = payload;
  {
    grpc::ByteBuffer frame = EncodeFrame(Header(), payload->data(), payload->size() * 4, payload);
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(frame.Dump(&slices).ok());
    ASSERT_EQ(slices.size(), 2u);
    EXPECT_EQ(static_cast<const void*>(slices[1].begin()), static_cast<const void*>(payload->data()))
        << "the payload slice is the caller's buffer, not a copy";
    payload.reset();
    EXPECT_FALSE(watch.expired()) << "the frame keeps the payload alive";
  }
  EXPECT_TRUE(watch.expired()) << "dropping the frame releases the payload";
}

TEST(TensorCodingTest, EncodedFramesAreOrdinaryProtobuf) {
  std::vector<float> values(1000);
  std::iota(values.begin(), values.end(), 1.0f);
  const grpc::ByteBuffer frame = EncodeFrame(Header(), values.data(), values.size() * 4, nullptr);
  StageFrame parsed;
  ASSERT_TRUE(parsed.ParseFromString(Bytes(frame)));
  StageFrame want = Header();
  want.set_payload(values.data(), values.size() * 4);
  EXPECT_EQ(parsed.SerializeAsString(), want.SerializeAsString());
}

TEST(TensorCodingTest, DecodesAnySlicingAndFieldOrderAndCopiesThePayloadOnce) {
  std::vector<float> values(257);
  std::iota(values.begin(), values.end(), -3.0f);
  StageFrame full = Header();
  full.set_payload(values.data(), values.size() * 4);
  const std::string ordinary = full.SerializeAsString();                       // payload in field order
  const std::string ours = Bytes(EncodeFrame(Header(), values.data(), values.size() * 4, nullptr));
  StageFrame payload_first;
  payload_first.set_payload(values.data(), values.size() * 4);
  const std::string reordered = payload_first.SerializeAsString() + Header().SerializeAsString();
  for (const std::string* bytes : {&ordinary, &ours, &reordered}) {
    for (size_t piece : {size_t{1}, size_t{3}, size_t{7}, size_t{64}, bytes->size()}) {
      SCOPED_TRACE(piece);
      absl::StatusOr<DecodedFrame> frame = DecodeFrame(Resliced(*bytes, piece));
      ASSERT_TRUE(frame.ok()) << frame.status();
      EXPECT_EQ(frame->header().SerializeAsString(), Header().SerializeAsString());
      ASSERT_EQ(frame->payload_bytes(), values.size() * 4);
      std::vector<float> out(values.size());
      frame->CopyPayloadTo(out.data());
      EXPECT_EQ(out, values);
    }
  }
}

TEST(TensorCodingTest, FramesWithoutPayloadRoundTrip) {
  absl::StatusOr<DecodedFrame> frame = DecodeFrame(EncodeFrame(Header()));
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->payload_bytes(), 0u);
  EXPECT_EQ(frame->header().credit(), 9u);
  grpc::Slice nothing;
  absl::StatusOr<DecodedFrame> empty = DecodeFrame(grpc::ByteBuffer(&nothing, 1));
  ASSERT_TRUE(empty.ok()) << "an all-defaults frame is zero bytes";
  EXPECT_FALSE(empty->header().has_hello());
}

TEST(TensorCodingTest, MalformedBytesAreInvalidArgument) {
  StageFrame full = Header();
  full.set_payload(std::string(100, 'x'));
  const std::string good = full.SerializeAsString();
  const std::vector<std::string> bad = {
      good.substr(0, good.size() - 1),                 // payload cut short
      std::string("\x08\xff\xff", 3),                  // varint cut short
      std::string("\x0b"),                             // a group (wire type 3)
      std::string("\x00\x01", 2),                      // field number 0
      std::string("\x7a\x01x\x7a\x01y", 6),            // two payloads
      std::string("\x79\x01\x02", 3),                  // payload with the wrong wire type
      std::string("\x0a\x05\x01", 3),                  // hello longer than the frame
      std::string("\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12),  // varint over ten bytes
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(DecodeFrame(Resliced(bad[i], 2)).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace shardline::common
