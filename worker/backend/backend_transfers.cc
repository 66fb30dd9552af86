// Backend's host memory and copies between the host and the device: the
// checks before each copy, and the defaults for backends that run work as it
// is queued (the CPU). The compute operations' checks are in backend.cc
// (GEMMs: backend_gemm.cc).
#include "worker/backend/backend.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::worker {

absl::StatusOr<void*> Backend::AllocatePlainHost(size_t bytes) {
  void* memory = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  if (memory == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " host bytes"));
  return memory;
}

void Backend::FreePlainHost(void* memory) { std::free(memory); }

namespace {

// OK when a copy of src_bytes may proceed; the caller skips empty copies.
absl::Status CheckCopy(absl::string_view op, const void* src, size_t src_bytes, const void* dst,
                       size_t dst_bytes) {
  if (src == nullptr || dst == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": null buffer"));
  if (dst_bytes < src_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": destination holds ", dst_bytes, " bytes, source ", src_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Backend::CopyToDeviceBytes(const void* src, size_t src_bytes, void* dst,
                                        size_t dst_bytes) {
  if (src_bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckCopy("CopyToDevice", src, src_bytes, dst, dst_bytes));
  return CopyToDeviceImpl(src, dst, src_bytes);
}

absl::Status Backend::CopyToHostBytes(const void* src, size_t src_bytes, void* dst,
                                      size_t dst_bytes) {
  if (src_bytes == 0) return Synchronize();
  RETURN_IF_ERROR(CheckCopy("CopyToHost", src, src_bytes, dst, dst_bytes));
  return CopyToHostImpl(src, dst, src_bytes);
}

absl::StatusOr<std::unique_ptr<WorkTimer>> Backend::StartTimer() {
  return std::unique_ptr<WorkTimer>(std::make_unique<WallTimer>());
}

absl::StatusOr<HostTransfer> Backend::CopyToHostAsyncBytes(const void* src, size_t src_bytes,
                                                           void* dst, size_t dst_bytes) {
  if (src_bytes == 0) return HostTransfer();
  RETURN_IF_ERROR(CheckCopy("CopyToHostAsync", src, src_bytes, dst, dst_bytes));
  return CopyToHostAsyncImpl(src, dst, src_bytes);
}

absl::StatusOr<HostTransfer> Backend::CopyToDeviceAsyncBytes(const void* src, size_t src_bytes,
                                                             void* dst, size_t dst_bytes,
                                                             const HostTransfer* after) {
  if (src_bytes == 0) return HostTransfer();
  RETURN_IF_ERROR(CheckCopy("CopyToDeviceAsync", src, src_bytes, dst, dst_bytes));
  return CopyToDeviceAsyncImpl(src, dst, src_bytes, after);
}

absl::StatusOr<HostTransfer> Backend::CopyToHostAsyncImpl(const void* src, void* dst, size_t bytes) {
  RETURN_IF_ERROR(CopyToHostImpl(src, dst, bytes));
  return HostTransfer();
}

absl::StatusOr<HostTransfer> Backend::CopyToDeviceAsyncImpl(const void* src, void* dst,
                                                            size_t bytes, const HostTransfer* after) {
  // Work runs as it is queued: whatever `after` marks has run already.
  if (after != nullptr) RETURN_IF_ERROR(after->Wait());
  RETURN_IF_ERROR(CopyToDeviceImpl(src, dst, bytes));
  return HostTransfer();
}

absl::Status Backend::CopyOnDeviceBytes(const void* src, size_t src_bytes, void* dst,
                                        size_t dst_bytes) {
  if (src_bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckCopy("CopyOnDevice", src, src_bytes, dst, dst_bytes));
  return CopyOnDeviceImpl(src, dst, src_bytes);
}

}  // namespace shardline::worker
