#include "worker/backend/backend_factory.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/backend/cpu/cpu_backend.h"

#ifdef SHARDLINE_HAVE_CUDA
#include "worker/backend/cuda/cuda_backend.h"
#endif

namespace shardline::worker {

bool CudaCompiledIn() {
#ifdef SHARDLINE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int CudaDeviceCount() {
#ifdef SHARDLINE_HAVE_CUDA
  return CudaBackend::DeviceCount();
#else
  return 0;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(absl::string_view device,
                                                       const BackendOptions& options) {
  if (device == "cpu") {
    absl::StatusOr<std::unique_ptr<CpuBackend>> cpu = CpuBackend::Create(options.threads);
    if (!cpu.ok()) return cpu.status();
    return std::unique_ptr<Backend>(std::move(*cpu));
  }
  if (device == "cuda" || absl::StartsWith(device, "cuda:")) {
    int index = 0;
    if (device != "cuda" && (!absl::SimpleAtoi(device.substr(5), &index) || index < 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad CUDA device '", device, "': expected cuda:N with N >= 0"));
    }
#ifdef SHARDLINE_HAVE_CUDA
    absl::StatusOr<std::unique_ptr<CudaBackend>> cuda = CudaBackend::Create(index);
    if (!cuda.ok()) return cuda.status();
    return std::unique_ptr<Backend>(std::move(*cuda));
#else
    return absl::UnimplementedError(
        "this build has no CUDA backend (configure with SHARDLINE_CUDA=ON where nvcc exists)");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", device, "': expected cpu, cuda or cuda:N"));
}

}  // namespace shardline::worker
