#include "common/tensor_coding.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace shardline::common {
namespace {

using shardline::v1::StageFrame;

constexpr int kPayloadField = StageFrame::kPayloadFieldNumber;
constexpr uint8_t kPayloadTag = (kPayloadField << 3) | 2;  // length-delimited
static_assert(kPayloadTag < 0x80, "the payload tag is one byte");

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// Reads a message's bytes across its slices, front to back.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) { SkipEmpty(); }

  bool done() const { return index_ == slices_.size(); }

  bool ReadByte(uint8_t* byte) {
    if (done()) return false;
    *byte = slices_[index_].begin()[offset_];
    Advance(1);
    return true;
  }

  bool ReadVarint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte = 0;
      if (!ReadByte(&byte)) return false;
      *value |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;  // longer than ten bytes
  }

  // Passes over `n` bytes, handing each contiguous piece to `piece`.
  template <typename F>
  bool Take(uint64_t n, F piece) {
    while (n > 0) {
      if (done()) return false;
      const size_t available = slices_[index_].size() - offset_;
      const size_t take = static_cast<size_t>(std::min<uint64_t>(n, available));
      piece(reinterpret_cast<const char*>(slices_[index_].begin()) + offset_, take);
      Advance(take);
      n -= take;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    offset_ += n;
    if (offset_ == slices_[index_].size()) {
      ++index_;
      offset_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (index_ < slices_.size() && slices_[index_].size() == 0) ++index_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t offset_ = 0;
};

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed stage frame: ", what));
}

void ReleaseOwner(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

}  // namespace

grpc::ByteBuffer EncodeFrame(const StageFrame& header, const void* payload, size_t bytes,
                             std::shared_ptr<const void> owner) {
  DCHECK(header.payload().empty()) << "the payload travels beside the header";
  std::string head = header.SerializeAsString();
  if (bytes == 0) {
    grpc::Slice only(head);
    return grpc::ByteBuffer(&only, 1);
  }
  head.push_back(static_cast<char>(kPayloadTag));
  AppendVarint(bytes, &head);
  // gRPC only reads an aliased slice; the destroy callback lets go of the owner.
  grpc::Slice slices[2] = {
      grpc::Slice(head),
      grpc::Slice(const_cast<void*>(payload), bytes, &ReleaseOwner,
                  new std::shared_ptr<const void>(std::move(owner)))};
  return grpc::ByteBuffer(slices, 2);
}

grpc::ByteBuffer EncodeFrame(const StageFrame& header) { return EncodeFrame(header, nullptr, 0, nullptr); }

absl::StatusOr<DecodedFrame> DecodeFrame(const grpc::ByteBuffer& buffer) {
  DecodedFrame frame;
  if (grpc::Status s = buffer.Dump(&frame.slices_); !s.ok()) return Malformed("unreadable buffer");
  SliceCursor cursor(frame.slices_);
  std::string head;  // every field but the payload, re-encoded as it came
  auto append = [&head](const char* data, size_t n) { head.append(data, n); };
  bool have_payload = false;
  while (!cursor.done()) {
    uint64_t tag = 0;
    if (!cursor.ReadVarint(&tag)) return Malformed("truncated field tag");
    const uint64_t field = tag >> 3, wire_type = tag & 7;
    if (field == 0) return Malformed("field number 0");
    if (field == kPayloadField) {
      uint64_t n = 0;
      if (wire_type != 2 || !cursor.ReadVarint(&n)) return Malformed("bad payload field");
      if (have_payload) return Malformed("two payloads");
      have_payload = true;
      frame.payload_bytes_ = static_cast<size_t>(n);
      auto keep = [&frame](const char* data, size_t len) { frame.spans_.emplace_back(data, len); };
      if (!cursor.Take(n, keep)) return Malformed("payload shorter than its length");
      continue;
    }
    AppendVarint(tag, &head);
    uint64_t n = 0;
    switch (wire_type) {
      case 0:  // varint
        if (!cursor.ReadVarint(&n)) return Malformed("truncated varint");
        AppendVarint(n, &head);
        break;
      case 1:  // fixed64
        if (!cursor.Take(8, append)) return Malformed("truncated fixed64");
        break;
      case 5:  // fixed32
        if (!cursor.Take(4, append)) return Malformed("truncated fixed32");
        break;
      case 2:  // length-delimited
        if (!cursor.ReadVarint(&n) || n > kMaxFrameHeaderBytes) return Malformed("bad field length");
        AppendVarint(n, &head);
        if (!cursor.Take(n, append)) return Malformed("field shorter than its length");
        break;
      default:
        return Malformed(absl::StrCat("wire type ", wire_type));
    }
    if (head.size() > kMaxFrameHeaderBytes) return Malformed("header too large");
  }
  if (!frame.header_.ParseFromString(head)) return Malformed("header does not parse");
  return frame;
}

void DecodedFrame::CopyPayloadTo(void* destination) const {
  char* out = static_cast<char*>(destination);
  for (const auto& [data, n] : spans_) {
    std::memcpy(out, data, n);
    out += n;
  }
}

}  // namespace shardline::common
