#include "worker/backend/cuda/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace shardline::worker::cuda {

absl::Status CudaError(cudaError_t error, const char* expr, const char* file, int line) {
  cudaGetLastError();
  const std::string message = absl::StrCat(file, ":", line, ": ", expr, ": ",
                                           cudaGetErrorName(error), " (",
                                           cudaGetErrorString(error), ")");
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::Status CublasError(cublasStatus_t status, const char* expr, const char* file, int line) {
  const std::string message =
      absl::StrCat(file, ":", line, ": ", expr, ": ", cublasGetStatusName(status), " (",
                   cublasGetStatusString(status), ")");
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace shardline::worker::cuda
