// Errors of the CUDA runtime and cuBLAS as absl::Status: the error's name and
// text, the expression and the file:line that saw it; RESOURCE_EXHAUSTED for
// allocation failures, INTERNAL otherwise. Only worker/backend/cuda/ includes
// this (it pulls in CUDA's headers).
#ifndef SHARDLINE_WORKER_BACKEND_CUDA_CUDA_STATUS_H_
#define SHARDLINE_WORKER_BACKEND_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace shardline::worker::cuda {

// Also clears a non-sticky CUDA error, so the next call starts clean.
absl::Status CudaError(cudaError_t error, const char* expr, const char* file, int line);
absl::Status CublasError(cublasStatus_t status, const char* expr, const char* file, int line);

}  // namespace shardline::worker::cuda

#define CUDA_RETURN_IF_ERROR(expr)                                                        \
  do {                                                                                    \
    const cudaError_t cuda_error_ = (expr);                                               \
    if (cuda_error_ != cudaSuccess) {                                                     \
      return ::shardline::worker::cuda::CudaError(cuda_error_, #expr, __FILE__, __LINE__); \
    }                                                                                     \
  } while (false)

#define CUBLAS_RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                        \
    const cublasStatus_t cublas_status_ = (expr);                                             \
    if (cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                            \
      return ::shardline::worker::cuda::CublasError(cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                                         \
  } while (false)

#endif  // SHARDLINE_WORKER_BACKEND_CUDA_CUDA_STATUS_H_
