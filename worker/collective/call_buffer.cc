#include "worker/collective/call_buffer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardline::worker::collective {
namespace {

absl::Status CheckRange(size_t begin, size_t count, size_t size) {
  if (begin > size || count > size - begin) {
    return absl::InternalError(absl::StrCat("collective buffer range [", begin, ", ", begin + count,
                                            ") outside its ", size, " floats"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CallBuffer::Read(size_t begin, absl::Span<float> out) const {
  if (absl::Status s = CheckRange(begin, out.size(), size()); !s.ok()) return s;
  if (backend_ != nullptr) {
    return backend_->CopyToHost(DeviceSpan<const float>(device_.subspan(begin, out.size())), out);
  }
  std::copy_n(host_.data() + begin, out.size(), out.data());
  return absl::OkStatus();
}

absl::Status CallBuffer::Write(size_t begin, absl::Span<const float> values) const {
  if (absl::Status s = CheckRange(begin, values.size(), size()); !s.ok()) return s;
  if (backend_ != nullptr) return backend_->CopyToDevice(values, device_.subspan(begin, values.size()));
  std::copy_n(values.data(), values.size(), host_.data() + begin);
  return absl::OkStatus();
}

}  // namespace shardline::worker::collective
