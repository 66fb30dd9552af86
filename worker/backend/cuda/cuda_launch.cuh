// Launch geometry and warp reductions shared by the .cu files.
#ifndef SHARDLINE_WORKER_BACKEND_CUDA_CUDA_LAUNCH_CUH_
#define SHARDLINE_WORKER_BACKEND_CUDA_CUDA_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace shardline::worker::cuda {

inline constexpr int kThreads = 256;
inline constexpr int kWarpsPerBlock = kThreads / 32;

// Blocks for a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned GridFor(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<size_t>(std::max<size_t>(blocks, 1), 65535 * 8));
}

// Blocks for one warp per row.
inline unsigned GridForRows(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

template <typename T>
__device__ inline T WarpSum(T value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

__device__ inline float WarpMax(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

#define SHARDLINE_GRID_STRIDE(i, n)                                                    \
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

}  // namespace shardline::worker::cuda

#endif  // SHARDLINE_WORKER_BACKEND_CUDA_CUDA_LAUNCH_CUH_
