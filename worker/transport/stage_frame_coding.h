// How a StageMessage travels as StageFrames (proto/shardline/v1/stage_link.proto):
// split into chunks whose payloads alias the message's values (the bytes of
// one frame are common/tensor_coding's business), and put back together with
// every field checked, each payload copied once into the message it belongs to.
#ifndef SHARDLINE_WORKER_TRANSPORT_STAGE_FRAME_CODING_H_
#define SHARDLINE_WORKER_TRANSPORT_STAGE_FRAME_CODING_H_

#include <grpcpp/support/byte_buffer.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/input_limits.h"
#include "common/tensor_coding.h"
#include "shardline/v1/stage_link.pb.h"
#include "worker/transport/stage_link.h"
#include "worker/transport/staging_pool.h"

namespace shardline::worker::transport {

inline constexpr size_t kDefaultChunkBytes = 1 << 20;
inline constexpr size_t kMinChunkBytes = 256;
inline constexpr size_t kMaxChunkBytes = 16 << 20;
// A message of at least twice this goes as two frames or more, whatever the
// chunk size: the receiver times the wire by a frame that follows another
// at once (wire_pace.h), and a message of one frame shows it nothing (a
// collective's 800 KB halves on a link cut to 5 Mbit/s went unseen). Not
// smaller: a receiver short of CPU reads two small frames that arrived
// together as if they had not (32 KiB halves of 64 KiB activations read
// anything from 4 Mbit/s to 6 Gbit/s on one 48 Mbit/s link).
inline constexpr size_t kMinTimedFrameBytes = 256 << 10;
// No tensor on a stage link may exceed this (4 GiB of f32).
inline constexpr int64_t kMaxFrameElements = common::kMaxTensorElements;

// What a stream may carry, from the job: a frame announcing a larger tensor
// or more targets is refused before anything is allocated for it.
struct FrameLimits {
  int64_t max_elements = kMaxFrameElements;        // of one tensor
  int64_t max_targets = common::kMaxMicroBatchTokens;  // of one activation
};

// How a link sends f32 activations and gradients: as they are, or in 8-bit
// blocks (common/int8_blocks.h; parallel.wire_dtype "int8", or "auto" on a
// link the plan says is the bottleneck).
enum class WireCodec { kAsIs, kInt8Blocks };

// The payload is message->values as they are, message->dtype (f32, or the
// 16-bit values of a bf16 / f16 wire): the frames alias them, so the message
// stays alive until the last frame is written. With kInt8Blocks an f32
// activation or gradient goes as 8-bit blocks instead (encoded into a
// buffer the frames own; chunks of whole blocks); other messages (norms,
// collectives) and 16-bit values as they are. A message with int8_blocks
// goes as those blocks (DTYPE_I8_BLOCK64), whatever `codec`. Chunks of
// `chunk_bytes`, or of half the payload where that is smaller and at least
// kMinTimedFrameBytes.
std::vector<grpc::ByteBuffer> EncodeStageMessage(std::shared_ptr<const StageMessage> message,
                                                 size_t chunk_bytes = kDefaultChunkBytes,
                                                 WireCodec codec = WireCodec::kAsIs);

// `frame` (an encoded data frame) with StageFrame.followed set: the same
// slices behind three bytes that say so.
grpc::ByteBuffer MarkFollowed(const grpc::ByteBuffer& frame);

// Reassembles messages from data frames, one message at a time, each
// payload copied once into the message's tensor (an n-float buffer whatever
// the frames' dtype, which the message keeps; 8-bit blocks are decoded into
// it, and the message is f32): a slot of `pool` when one is free and large
// enough, the heap otherwise. Not thread-safe.
class FrameAssembler {
 public:
  explicit FrameAssembler(std::shared_ptr<StagingPool> pool = nullptr, FrameLimits limits = {})
      : pool_(std::move(pool)), limits_(limits) {}

  // The complete message once its last chunk arrives, nullopt before that.
  // INVALID_ARGUMENT for a malformed frame; the assembler is then reset.
  absl::StatusOr<std::optional<StageMessage>> Add(const common::DecodedFrame& frame);

 private:
  absl::Status Check(const common::DecodedFrame& frame);
  HostBuffer Destination(size_t elements);
  void Reset();
  const std::shared_ptr<StagingPool> pool_;
  const FrameLimits limits_;
  bool active_ = false;
  shardline::v1::StageFrame first_;  // header of the message being assembled
  uint32_t next_chunk_ = 0;
  StageMessage message_;
  size_t filled_bytes_ = 0;      // payload bytes received so far
  size_t filled_values_ = 0;     // values decoded so far (8-bit blocks)
};

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_WORKER_TRANSPORT_STAGE_FRAME_CODING_H_
