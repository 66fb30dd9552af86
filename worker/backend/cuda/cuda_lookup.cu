#include "worker/backend/cuda/cuda_kernels.h"
#include "worker/backend/cuda/cuda_launch.cuh"

namespace shardline::worker::cuda {
namespace {

__global__ void EmbeddingForwardKernel(EmbeddingShape shape, const int32_t* ids,
                                       const float* table, float* out, bool accumulate,
                                       unsigned* error_flag) {
  const size_t n = static_cast<size_t>(shape.rows * shape.dim);
  SHARDLINE_GRID_STRIDE(i, n) {
    const int64_t r = static_cast<int64_t>(i) / shape.dim, c = static_cast<int64_t>(i) % shape.dim;
    const int32_t id = ids[r];
    if (id < 0 || id >= shape.vocab) {
      if (c == 0) atomicOr(error_flag, kErrorFlagEmbeddingForward);
      continue;
    }
    const float value = table[static_cast<int64_t>(id) * shape.dim + c];
    out[i] = accumulate ? out[i] + value : value;
  }
}

// One thread per column walks the rows in order: no atomics, so the sums are
// the same on every run.
__global__ void EmbeddingBackwardKernel(EmbeddingShape shape, const int32_t* ids, const float* dout,
                                        float* dtable, unsigned* error_flag) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= shape.dim) return;
  for (int64_t r = 0; r < shape.rows; ++r) {
    const int32_t id = ids[r];
    if (id < 0 || id >= shape.vocab) {
      if (c == 0) atomicOr(error_flag, kErrorFlagEmbeddingBackward);
      continue;
    }
    dtable[static_cast<int64_t>(id) * shape.dim + c] += dout[r * shape.dim + c];
  }
}

// log Σ exp over one row, by one warp.
__device__ float WarpLogSumExp(const float* row, int64_t vocab, int lane) {
  float max = -INFINITY;
  for (int64_t j = lane; j < vocab; j += 32) max = fmaxf(max, row[j]);
  max = WarpMax(max);
  float sum = 0.0f;
  for (int64_t j = lane; j < vocab; j += 32) sum += expf(row[j] - max);
  return max + logf(WarpSum(sum));
}

__global__ void CrossEntropyForwardKernel(CrossEntropyShape shape, const float* logits,
                                          const int32_t* targets, float* losses,
                                          unsigned* error_flag) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= shape.rows) return;
  const int32_t target = targets[row];
  if (target >= shape.vocab) {
    if (lane == 0) atomicOr(error_flag, kErrorFlagCrossEntropyForward);
    return;
  }
  if (target < 0) {
    if (lane == 0) losses[row] = 0.0f;
    return;
  }
  const float* r = logits + row * shape.vocab;
  const float lse = WarpLogSumExp(r, shape.vocab, lane);
  if (lane == 0) losses[row] = lse - r[target];
}

__global__ void CrossEntropyBackwardKernel(CrossEntropyShape shape, const float* logits,
                                           const int32_t* targets, float grad_scale,
                                           float* dlogits, unsigned* error_flag) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= shape.rows) return;
  const int32_t target = targets[row];
  if (target >= shape.vocab) {
    if (lane == 0) atomicOr(error_flag, kErrorFlagCrossEntropyBackward);
    return;
  }
  if (target < 0) return;
  const float* r = logits + row * shape.vocab;
  float* d = dlogits + row * shape.vocab;
  const float lse = WarpLogSumExp(r, shape.vocab, lane);
  for (int64_t j = lane; j < shape.vocab; j += 32) {
    d[j] += grad_scale * (expf(r[j] - lse) - (j == target ? 1.0f : 0.0f));
  }
}

}  // namespace

cudaError_t LaunchEmbeddingForward(const EmbeddingShape& shape, const int32_t* ids,
                                   const float* table, float* out, bool accumulate,
                                   unsigned* error_flag, cudaStream_t stream) {
  EmbeddingForwardKernel<<<GridFor(static_cast<size_t>(shape.rows * shape.dim)), kThreads, 0,
                           stream>>>(shape, ids, table, out, accumulate, error_flag);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingBackward(const EmbeddingShape& shape, const int32_t* ids,
                                    const float* dout, float* dtable, unsigned* error_flag,
                                    cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((shape.dim + kThreads - 1) / kThreads);
  EmbeddingBackwardKernel<<<blocks, kThreads, 0, stream>>>(shape, ids, dout, dtable, error_flag);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyForward(const CrossEntropyShape& shape, const float* logits,
                                      const int32_t* targets, float* losses, unsigned* error_flag,
                                      cudaStream_t stream) {
  CrossEntropyForwardKernel<<<GridForRows(shape.rows), kThreads, 0, stream>>>(
      shape, logits, targets, losses, error_flag);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyBackward(const CrossEntropyShape& shape, const float* logits,
                                       const int32_t* targets, float grad_scale, float* dlogits,
                                       unsigned* error_flag, cudaStream_t stream) {
  CrossEntropyBackwardKernel<<<GridForRows(shape.rows), kThreads, 0, stream>>>(
      shape, logits, targets, grad_scale, dlogits, error_flag);
  return cudaGetLastError();
}

}  // namespace shardline::worker::cuda
