// Bytes as a worker's StageLink receives them: frames (each cut into gRPC
// slices at fuzzer-chosen points) decoded by common::DecodeFrame and put
// back together by a FrameAssembler with a job's limits, as ExchangeStream
// does. Nothing the peer sends may crash the reader, or make it allocate
// beyond the limits.
#include <fuzzer/FuzzedDataProvider.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/tensor_coding.h"
#include "worker/transport/stage_frame_coding.h"

using shardline::worker::transport::FrameAssembler;
using shardline::worker::transport::FrameLimits;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  FrameLimits limits;
  limits.max_elements = 1 << 16;  // a small job's micro-batch
  limits.max_targets = 1 << 10;
  FrameAssembler assembler(nullptr, limits);
  while (input.remaining_bytes() > 0) {
    const std::string frame = input.ConsumeRandomLengthString(1 << 18);
    // One frame as gRPC may hand it over: in up to three slices.
    std::vector<grpc::Slice> slices;
    size_t at = 0;
    for (int cut = 0; cut < 2 && at < frame.size(); ++cut) {
      const size_t length = input.ConsumeIntegralInRange<size_t>(0, frame.size() - at);
      slices.emplace_back(frame.data() + at, length);
      at += length;
    }
    slices.emplace_back(frame.data() + at, frame.size() - at);
    grpc::ByteBuffer buffer(slices.data(), slices.size());
    absl::StatusOr<shardline::common::DecodedFrame> decoded = shardline::common::DecodeFrame(buffer);
    if (!decoded.ok()) continue;
    absl::StatusOr<std::optional<shardline::worker::transport::StageMessage>> message = assembler.Add(*decoded);
    if (message.ok() && message->has_value() &&
        static_cast<int64_t>((*message)->values.size()) > limits.max_elements) {
      __builtin_trap();  // a message beyond the limits got through
    }
  }
  return 0;
}
