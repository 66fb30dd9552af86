#include "worker/backend/cuda/cuda_kernels.h"
#include "worker/backend/cuda/cuda_launch.cuh"

namespace shardline::worker::cuda {
namespace {

// The ids a table of shape `shape` is indexed by (its rows may be a slice of them).
__device__ inline int64_t IdCount(const EmbeddingShape& shape) {
  return shape.total > 0 ? shape.total : shape.vocab;
}

__global__ void EmbeddingForwardKernel(EmbeddingShape shape, const int32_t* ids,
                                       const float* table, float* out, bool accumulate,
                                       unsigned* error_flag) {
  const size_t n = static_cast<size_t>(shape.rows * shape.dim);
  SHARDLINE_GRID_STRIDE(i, n) {
    const int64_t r = static_cast<int64_t>(i) / shape.dim, c = static_cast<int64_t>(i) % shape.dim;
    const int32_t id = ids[r];
    if (id < 0 || id >= IdCount(shape)) {
      if (c == 0) atomicOr(error_flag, kErrorFlagEmbeddingForward);
      continue;
    }
    const int64_t row = id - shape.first;
    if (row < 0 || row >= shape.vocab) {  // held by another rank
      if (!accumulate) out[i] = 0.0f;
      continue;
    }
    const float value = table[row * shape.dim + c];
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
    if (id < 0 || id >= IdCount(shape)) {
      if (c == 0) atomicOr(error_flag, kErrorFlagEmbeddingBackward);
      continue;
    }
    const int64_t row = id - shape.first;
    if (row < 0 || row >= shape.vocab) continue;  // held by another rank
    dtable[row * shape.dim + c] += dout[r * shape.dim + c];
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

// `row_lse` null: whole rows, whose log-sum-exp the warp computes.
__global__ void CrossEntropyBackwardKernel(CrossEntropyShape shape, const float* logits,
                                           const int32_t* targets, const float* row_lse, float grad_scale,
                                           float* dlogits, unsigned* error_flag) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= shape.rows) return;
  const int32_t target = targets[row];
  if (target >= (shape.total > 0 ? shape.total : shape.vocab)) {
    if (lane == 0) atomicOr(error_flag, kErrorFlagCrossEntropyBackward);
    return;
  }
  if (target < 0) return;
  const float* r = logits + row * shape.vocab;
  float* d = dlogits + row * shape.vocab;
  const float lse = row_lse != nullptr ? row_lse[row] : WarpLogSumExp(r, shape.vocab, lane);
  const int64_t held = target - shape.first;  // outside [0, vocab): another rank's class
  for (int64_t j = lane; j < shape.vocab; j += 32) {
    d[j] += grad_scale * (expf(r[j] - lse) - (j == held ? 1.0f : 0.0f));
  }
}

// One warp per row: (max, Σ exp(x − max), the target's logit or 0).
__global__ void CrossEntropyPartsKernel(CrossEntropyShape shape, const float* logits, const int32_t* targets,
                                        float* parts, unsigned* error_flag) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= shape.rows) return;
  const int32_t target = targets[row];
  if (target >= (shape.total > 0 ? shape.total : shape.vocab)) {
    if (lane == 0) atomicOr(error_flag, kErrorFlagCrossEntropyParts);
    return;
  }
  const float* r = logits + row * shape.vocab;
  float max = -INFINITY;
  for (int64_t j = lane; j < shape.vocab; j += 32) max = fmaxf(max, r[j]);
  max = WarpMax(max);
  float sum = 0.0f;
  for (int64_t j = lane; j < shape.vocab; j += 32) sum += expf(r[j] - max);
  sum = WarpSum(sum);
  if (lane == 0) {
    const int64_t held = target - shape.first;
    parts[3 * row] = max;
    parts[3 * row + 1] = sum;
    parts[3 * row + 2] = target >= 0 && held >= 0 && held < shape.vocab ? r[held] : 0.0f;
  }
}

// One thread per row, the slices in order.
__global__ void CrossEntropyCombineKernel(LossPartsShape shape, const float* parts, const int32_t* targets,
                                          float* losses, float* lse) {
  const int64_t rows = shape.rows;
  SHARDLINE_GRID_STRIDE(i, static_cast<size_t>(rows)) {
    const int64_t r = static_cast<int64_t>(i);
    float max = parts[3 * r];
    for (int64_t k = 1; k < shape.slices; ++k) max = fmaxf(max, parts[3 * (k * rows + r)]);
    double sum = 0.0, target = 0.0;
    for (int64_t k = 0; k < shape.slices; ++k) {
      const float* part = parts + 3 * (k * rows + r);
      sum += static_cast<double>(part[1]) * exp(static_cast<double>(part[0]) - max);
      target += part[2];
    }
    const double row_lse = max + log(sum);
    lse[r] = static_cast<float>(row_lse);
    losses[r] = targets[r] < 0 ? 0.0f : static_cast<float>(row_lse - target);
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
                                       const int32_t* targets, const float* lse, float grad_scale,
                                       float* dlogits, unsigned* error_flag, cudaStream_t stream) {
  CrossEntropyBackwardKernel<<<GridForRows(shape.rows), kThreads, 0, stream>>>(
      shape, logits, targets, lse, grad_scale, dlogits, error_flag);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyParts(const CrossEntropyShape& shape, const float* logits, const int32_t* targets,
                                    float* parts, unsigned* error_flag, cudaStream_t stream) {
  CrossEntropyPartsKernel<<<GridForRows(shape.rows), kThreads, 0, stream>>>(shape, logits, targets, parts,
                                                                           error_flag);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyCombine(const LossPartsShape& shape, const float* parts, const int32_t* targets,
                                      float* losses, float* lse, cudaStream_t stream) {
  CrossEntropyCombineKernel<<<GridFor(static_cast<size_t>(shape.rows)), kThreads, 0, stream>>>(
      shape, parts, targets, losses, lse);
  return cudaGetLastError();
}

}  // namespace shardline::worker::cuda
