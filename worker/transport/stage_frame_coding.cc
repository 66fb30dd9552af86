#include "worker/transport/stage_frame_coding.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/int8_blocks.h"
#include "common/status_macros.h"

namespace shardline::worker::transport {
namespace {

using shardline::v1::StageFrame;

StageFrame::Kind ToWire(StageMessage::Kind kind) {
  switch (kind) {
    case StageMessage::Kind::kActivation:
      return StageFrame::ACTIVATION;
    case StageMessage::Kind::kGradient:
      return StageFrame::GRADIENT;
    case StageMessage::Kind::kNormPartial:
      return StageFrame::NORM_PARTIAL;
    case StageMessage::Kind::kNormTotal:
      return StageFrame::NORM_TOTAL;
    case StageMessage::Kind::kCollective:
      return StageFrame::COLLECTIVE;
  }
  return StageFrame::KIND_UNSPECIFIED;
}

absl::StatusOr<StageMessage::Kind> FromWire(int kind) {
  switch (kind) {
    case StageFrame::ACTIVATION:
      return StageMessage::Kind::kActivation;
    case StageFrame::GRADIENT:
      return StageMessage::Kind::kGradient;
    case StageFrame::NORM_PARTIAL:
      return StageMessage::Kind::kNormPartial;
    case StageFrame::NORM_TOTAL:
      return StageMessage::Kind::kNormTotal;
    case StageFrame::COLLECTIVE:
      return StageMessage::Kind::kCollective;
    default:
      return absl::InvalidArgumentError(absl::StrCat("frame of unknown kind ", kind));
  }
}

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed stage frame: ", what));
}

bool IsInt8(const StageFrame& f) { return f.dtype() == shardline::v1::DTYPE_I8_BLOCK64; }

// The payload bytes of a whole tensor of `f`'s elements, and the unit its
// chunks come in (a value, or an 8-bit block).
size_t TotalBytes(const StageFrame& f) {
  const auto n = static_cast<size_t>(f.elements());
  return IsInt8(f) ? common::Int8BlocksBytes(n) : n * (f.dtype() == shardline::v1::DTYPE_F32 ? 4 : 2);
}
size_t ChunkUnit(const StageFrame& f) {
  return IsInt8(f) ? common::kInt8BlockBytes : f.dtype() == shardline::v1::DTYPE_F32 ? 4 : 2;
}

// An f32 message's values as 8-bit blocks, kept alive with the message.
struct Int8Payload {
  std::shared_ptr<const StageMessage> message;
  std::vector<char> bytes;
};

}  // namespace

grpc::ByteBuffer MarkFollowed(const grpc::ByteBuffer& frame) {
  // A protobuf message's fields may come in any order: the mark goes first.
  static const grpc::Slice* const mark = [] {
    StageFrame f;
    f.set_followed(true);
    return new grpc::Slice(f.SerializeAsString());
  }();
  std::vector<grpc::Slice> slices{*mark};
  std::vector<grpc::Slice> rest;
  if (!frame.Dump(&rest).ok()) return frame;  // unmarked: the receiver just times less
  slices.insert(slices.end(), rest.begin(), rest.end());
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::vector<grpc::ByteBuffer> EncodeStageMessage(std::shared_ptr<const StageMessage> message,
                                                 size_t chunk_bytes, WireCodec codec) {
  const StageMessage& m = *message;
  size_t unit = common::DTypeSize(m.dtype);
  const char* data = reinterpret_cast<const char*>(m.values.data());
  size_t bytes = m.values.size() * unit;
  auto wire_dtype = static_cast<shardline::v1::DType>(common::DTypeToProto(m.dtype));
  std::shared_ptr<const void> owner = message;
  if (!m.int8_blocks.empty()) {
    // Encoded by the sender (a collective with error feedback); the
    // message keeps the bytes alive.
    data = m.int8_blocks.data();
    bytes = m.int8_blocks.size();
    unit = common::kInt8BlockBytes;
    wire_dtype = shardline::v1::DTYPE_I8_BLOCK64;
  } else if (codec == WireCodec::kInt8Blocks && m.dtype == common::DType::kF32 &&
      (m.kind == StageMessage::Kind::kActivation || m.kind == StageMessage::Kind::kGradient)) {
    auto payload = std::make_shared<Int8Payload>();
    payload->message = message;
    payload->bytes.resize(common::Int8BlocksBytes(m.values.size()));
    common::EncodeInt8Blocks(absl::Span<const float>(m.values.data(), m.values.size()),
                             absl::MakeSpan(payload->bytes));
    data = payload->bytes.data();
    bytes = payload->bytes.size();
    unit = common::kInt8BlockBytes;
    wire_dtype = shardline::v1::DTYPE_I8_BLOCK64;
    owner = std::move(payload);
  }
  if (bytes >= 2 * kMinTimedFrameBytes) chunk_bytes = std::min(chunk_bytes, (bytes + 1) / 2 + unit - 1);
  chunk_bytes = std::max<size_t>(chunk_bytes / unit * unit, unit);
  const uint32_t count = static_cast<uint32_t>(std::max<size_t>(1, (bytes + chunk_bytes - 1) / chunk_bytes));
  StageFrame header;
  header.set_kind(ToWire(m.kind));
  header.set_step(m.step);
  header.set_micro_batch(m.micro_batch);
  header.set_sequence(m.sequence);
  header.set_batch(m.batch);
  header.set_t(m.t);
  header.set_dtype(wire_dtype);
  header.set_elements(static_cast<int64_t>(m.values.size()));
  header.set_loss_scale(m.loss_scale);
  header.set_eval_batches(m.eval_batches);
  header.set_norm(m.norm);
  header.set_chunk_count(count);
  *header.mutable_targets() = {m.targets.begin(), m.targets.end()};
  std::vector<grpc::ByteBuffer> frames;
  frames.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    header.set_chunk_index(i);
    if (i == 1) header.clear_targets();
    const size_t begin = i * chunk_bytes, end = std::min(bytes, begin + chunk_bytes);
    frames.push_back(common::EncodeFrame(header, data + begin, end > begin ? end - begin : 0, owner));
  }
  return frames;
}

absl::Status FrameAssembler::Check(const common::DecodedFrame& frame) {
  const StageFrame& f = frame.header();
  if (f.has_hello()) return Bad("hello after the stream started");
  if (f.dtype() != shardline::v1::DTYPE_F32 && f.dtype() != shardline::v1::DTYPE_BF16 &&
      f.dtype() != shardline::v1::DTYPE_F16 && !IsInt8(f)) {
    return Bad(absl::StrCat("dtype ", f.dtype(), " is not f32, bf16, f16 or 8-bit blocks"));
  }
  if (IsInt8(f) && f.kind() != StageFrame::ACTIVATION && f.kind() != StageFrame::GRADIENT &&
      f.kind() != StageFrame::COLLECTIVE) {
    return Bad(absl::StrCat("8-bit blocks on a frame of kind ", f.kind(),
                            " (activations, gradients and collective sums only)"));
  }
  if (f.elements() < 0 || f.elements() > limits_.max_elements) {
    return Bad(absl::StrCat(f.elements(), " elements, where this link carries at most ", limits_.max_elements));
  }
  if (f.targets_size() > limits_.max_targets ||
      (f.targets_size() > 0 && f.kind() != StageFrame::ACTIVATION)) {
    return Bad(absl::StrCat(f.targets_size(), " targets on a frame of kind ", f.kind(),
                            " (activations carry at most ", limits_.max_targets, ")"));
  }  if (f.eval_batches() < 0 || (f.eval_batches() > 0 && (f.kind() != StageFrame::ACTIVATION || f.step() >= 0))) {
    return Bad(absl::StrCat("eval_batches ", f.eval_batches(), " on a frame of kind ", f.kind(), " at step ", f.step()));
  }

  if (f.chunk_count() < 1 || f.chunk_index() >= f.chunk_count()) {
    return Bad(absl::StrCat("chunk ", f.chunk_index(), " of ", f.chunk_count()));
  }
  if (f.chunk_count() > static_cast<uint64_t>(f.elements()) + 1) return Bad("more chunks than elements");
  if (f.batch() < 0 || f.t() < 0 || f.batch() > (int64_t{1} << 24) || f.t() > (int64_t{1} << 24)) {
    return Bad(absl::StrCat("batch ", f.batch(), " × t ", f.t()));
  }
  // Chunks before the last hold whole values (whole 8-bit blocks); the
  // last holds the rest.
  if (f.chunk_index() + 1 < f.chunk_count() ? frame.payload_bytes() % ChunkUnit(f) != 0
                                            : !IsInt8(f) && frame.payload_bytes() % ChunkUnit(f) != 0) {
    return Bad("payload is not whole values");
  }
  if (f.chunk_index() != next_chunk_) {
    return Bad(absl::StrCat("chunk ", f.chunk_index(), " arrived where ", next_chunk_, " was due"));
  }
  if (active_ && (f.kind() != first_.kind() || f.step() != first_.step() || f.dtype() != first_.dtype() ||
                  f.micro_batch() != first_.micro_batch() || f.elements() != first_.elements() ||
                  f.chunk_count() != first_.chunk_count() || f.sequence() != first_.sequence())) {
    return Bad("chunks of one tensor disagree on its header");
  }
  if (f.chunk_index() > 0 && f.targets_size() > 0) return Bad("targets outside chunk 0");
  const size_t total = TotalBytes(f);
  if (filled_bytes_ + frame.payload_bytes() > total) return Bad("payload larger than the tensor");
  // Chunks before the last are all full and of one size, so the first one
  // says how many there must be: a header announcing a large tensor comes
  // with its share of the bytes, or nothing is allocated for it.
  if (f.chunk_index() == 0 && f.chunk_count() > 1) {
    const uint64_t chunk = frame.payload_bytes();
    if (chunk == 0 || (f.chunk_count() - 1) * chunk >= total || f.chunk_count() * chunk < total) {
      return Bad(absl::StrCat("chunk 0 of ", f.chunk_count(), " carries ", chunk, " bytes of a ", total,
                              "-byte tensor"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<StageMessage>> FrameAssembler::Add(const common::DecodedFrame& frame) {
  const StageFrame& f = frame.header();
  if (absl::Status s = Check(frame); !s.ok()) {
    Reset();
    return s;
  }
  if (!active_) {
    ASSIGN_OR_RETURN(message_.kind, FromWire(f.kind()));
    // f32, bf16 or f16 (Check saw to it), or 8-bit blocks decoded to f32.
    if (IsInt8(f)) {
      message_.dtype = common::DType::kF32;
    } else {
      ASSIGN_OR_RETURN(message_.dtype, common::DTypeFromProto(f.dtype()));
    }
    active_ = true;
    first_ = f;
    message_.step = f.step();
    message_.micro_batch = f.micro_batch();
    message_.sequence = f.sequence();
    message_.batch = f.batch();
    message_.t = f.t();
    message_.loss_scale = f.loss_scale();
    message_.eval_batches = f.eval_batches();
    message_.norm = f.norm();
    message_.targets.assign(f.targets().begin(), f.targets().end());
    message_.values = Destination(static_cast<size_t>(f.elements()));
  }
  if (IsInt8(f)) {
    // Decoded into the tensor: whole blocks, the last one maybe shorter.
    const size_t blocks = (frame.payload_bytes() + common::kInt8BlockBytes - 1) / common::kInt8BlockBytes;
    const size_t values = std::min(blocks * common::kInt8BlockValues, message_.values.size() - filled_values_);
    std::vector<char> payload(frame.payload_bytes());
    frame.CopyPayloadTo(payload.data());
    if (absl::Status s = common::DecodeInt8Blocks(
            payload, absl::MakeSpan(message_.values.data() + filled_values_, values));
        !s.ok()) {
      Reset();
      return Bad(s.message());
    }
    filled_values_ += values;
  } else {
    // The one copy on the receiving side: straight into the tensor, 16-bit
    // values as they are (the stage's device widens them).
    frame.CopyPayloadTo(reinterpret_cast<char*>(message_.values.data()) + filled_bytes_);
  }
  filled_bytes_ += frame.payload_bytes();
  if (++next_chunk_ < f.chunk_count()) return std::optional<StageMessage>();
  if (filled_bytes_ != TotalBytes(first_)) {
    Reset();
    return Bad("payload shorter than the tensor");
  }
  StageMessage done = std::move(message_);
  Reset();
  return std::optional<StageMessage>(std::move(done));
}

HostBuffer FrameAssembler::Destination(size_t elements) {
  if (pool_ != nullptr && elements * sizeof(float) <= pool_->slot_bytes()) {
    // Never waits: the reactor's thread must not block. A full pool means
    // the stage holds many messages; the heap takes the rest.
    if (std::optional<StagingSlot> slot = pool_->TryAcquire()) return HostBuffer(std::move(*slot), elements);
  }
  return HostBuffer::Zeros(elements);
}

void FrameAssembler::Reset() {
  active_ = false;
  first_.Clear();
  next_chunk_ = 0;
  message_ = StageMessage();
  filled_bytes_ = 0;
  filled_values_ = 0;
}

}  // namespace shardline::worker::transport
