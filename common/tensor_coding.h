// The one place that knows how a StageFrame (proto/shardline/v1/stage_link.proto)
// is laid out as bytes on a stage link, without copying tensor payloads:
//
//   EncodeFrame  writes the small header (every field but `payload`) into a
//                slice of its own and appends slices that alias the caller's
//                payload buffer; the buffer's owner is kept alive until gRPC
//                drops the last slice (the slice's destroy callback).
//   DecodeFrame  walks the received slices without joining them: the header
//                fields (which may straddle slices) are gathered into a
//                small string and parsed, the payload stays where gRPC put
//                it until CopyPayloadTo copies it once into its destination.
//
// The bytes are ordinary protobuf (payload last), so any protobuf tool can
// read a frame, and DecodeFrame accepts any valid encoding of StageFrame,
// whatever the field order.
#ifndef SHARDLINE_COMMON_TENSOR_CODING_H_
#define SHARDLINE_COMMON_TENSOR_CODING_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "shardline/v1/stage_link.pb.h"

namespace shardline::common {

// Header bytes a frame may carry: the targets of the largest micro-batch
// (kMaxMicroBatchTokens varints of at most 5 bytes) and the fixed fields.
inline constexpr size_t kMaxFrameHeaderBytes = size_t{21} << 20;

// `header` must not have a payload. `payload` (`bytes` long) stays owned by
// `owner`, which is released once the frame has been written or dropped.
grpc::ByteBuffer EncodeFrame(const shardline::v1::StageFrame& header, const void* payload, size_t bytes,
                             std::shared_ptr<const void> owner);
// A frame without payload.
grpc::ByteBuffer EncodeFrame(const shardline::v1::StageFrame& header);

class DecodedFrame {
 public:
  DecodedFrame() = default;
  DecodedFrame(DecodedFrame&&) = default;  // the payload spans survive a move, not a copy
  DecodedFrame& operator=(DecodedFrame&&) = default;

  const shardline::v1::StageFrame& header() const { return header_; }
  size_t payload_bytes() const { return payload_bytes_; }
  // Copies the payload to `destination` (payload_bytes() long).
  void CopyPayloadTo(void* destination) const;

 private:
  friend absl::StatusOr<DecodedFrame> DecodeFrame(const grpc::ByteBuffer& buffer);
  shardline::v1::StageFrame header_;
  std::vector<grpc::Slice> slices_;                    // keep the payload's memory alive
  std::vector<std::pair<const char*, size_t>> spans_;  // the payload, in order
  size_t payload_bytes_ = 0;
};

// INVALID_ARGUMENT when the bytes are not a StageFrame.
absl::StatusOr<DecodedFrame> DecodeFrame(const grpc::ByteBuffer& buffer);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_TENSOR_CODING_H_
