// The one way to get a Backend.
#ifndef SHARDLINE_WORKER_BACKEND_BACKEND_FACTORY_H_
#define SHARDLINE_WORKER_BACKEND_BACKEND_FACTORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/backend/backend.h"

namespace shardline::worker {

struct BackendOptions {
  // Compute threads for the CPU backend (BLAS); 0 keeps the library default.
  int threads = 0;
};

// device: "cpu", "cuda" (= "cuda:0") or "cuda:N".
// INVALID_ARGUMENT for any other string; UNIMPLEMENTED for "cuda" in a build
// without the CUDA backend; FAILED_PRECONDITION when no CUDA device is found;
// NOT_FOUND when device N does not exist.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(absl::string_view device,
                                                       const BackendOptions& options = {});

// Whether this build has the CUDA backend.
bool CudaCompiledIn();
// Number of CUDA devices this process can use: 0 when there is no driver, no
// device, or no CUDA backend in this build.
int CudaDeviceCount();

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_BACKEND_BACKEND_FACTORY_H_
