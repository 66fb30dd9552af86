// Argument checks shared by Backend's implementation files (backend.cc,
// backend_gemm.cc): INVALID_ARGUMENT statuses that name the operation.
#ifndef SHARDLINE_WORKER_BACKEND_BACKEND_CHECKS_H_
#define SHARDLINE_WORKER_BACKEND_BACKEND_CHECKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "worker/backend/device_span.h"

namespace shardline::worker::backend_checks {

inline absl::Status Invalid(absl::string_view op, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", message));
}

// `needed` elements must be addressable through `span`.
template <typename T>
absl::Status CheckSpan(absl::string_view op, absl::string_view name, DeviceSpan<T> span,
                       uint64_t needed) {
  if (needed == 0) return absl::OkStatus();
  if (span.data() == nullptr) return Invalid(op, absl::StrCat(name, " is null"));
  if (span.size() < needed) {
    return Invalid(op, absl::StrCat(name, " has ", span.size(), " elements, needs ", needed));
  }
  return absl::OkStatus();
}

}  // namespace shardline::worker::backend_checks

#endif  // SHARDLINE_WORKER_BACKEND_BACKEND_CHECKS_H_
