#include "worker/backend/cuda/cuda_kernels.h"
#include "worker/backend/cuda/cuda_launch.cuh"

namespace shardline::worker::cuda {
namespace {

// One warp per row.
__global__ void LayerNormForwardKernel(LayerNormShape shape, const float* x, const float* gamma,
                                       const float* beta, float* y, float* mean, float* rstd) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= shape.rows) return;
  const int64_t cols = shape.cols;
  const float* xr = x + row * cols;
  float sum = 0.0f;
  for (int64_t c = lane; c < cols; c += 32) sum += xr[c];
  const float mu = WarpSum(sum) / static_cast<float>(cols);
  float sq = 0.0f;
  for (int64_t c = lane; c < cols; c += 32) {
    const float d = xr[c] - mu;
    sq += d * d;
  }
  const float s = rsqrtf(WarpSum(sq) / static_cast<float>(cols) + shape.eps);
  float* yr = y + row * cols;
  for (int64_t c = lane; c < cols; c += 32) yr[c] = (xr[c] - mu) * s * gamma[c] + beta[c];
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = s;
  }
}

// dx, one warp per row.
__global__ void LayerNormBackwardInputKernel(LayerNormShape shape, const float* x,
                                             const float* gamma, const float* mean,
                                             const float* rstd, const float* dy, float* dx) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= shape.rows) return;
  const int64_t cols = shape.cols;
  const float* xr = x + row * cols;
  const float* dyr = dy + row * cols;
  const float m = mean[row], s = rstd[row];
  float dn_sum = 0.0f, dn_xhat_sum = 0.0f;
  for (int64_t c = lane; c < cols; c += 32) {
    const float dn = dyr[c] * gamma[c];
    dn_sum += dn;
    dn_xhat_sum += dn * (xr[c] - m) * s;
  }
  const float dn_mean = WarpSum(dn_sum) / static_cast<float>(cols);
  const float dn_xhat_mean = WarpSum(dn_xhat_sum) / static_cast<float>(cols);
  float* dxr = dx + row * cols;
  for (int64_t c = lane; c < cols; c += 32) {
    const float xhat = (xr[c] - m) * s;
    dxr[c] += (dyr[c] * gamma[c] - dn_mean - xhat * dn_xhat_mean) * s;
  }
}

// dgamma, dbeta: one thread per column, rows in order (deterministic).
__global__ void LayerNormBackwardParamsKernel(LayerNormShape shape, const float* x,
                                              const float* mean, const float* rstd,
                                              const float* dy, float* dgamma, float* dbeta) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= shape.cols) return;
  float g = 0.0f, b = 0.0f;
  for (int64_t r = 0; r < shape.rows; ++r) {
    const float d = dy[r * shape.cols + c];
    g += d * (x[r * shape.cols + c] - mean[r]) * rstd[r];
    b += d;
  }
  dgamma[c] += g;
  dbeta[c] += b;
}

// One warp per row of [batch·t, t]; row i of each matrix sees keys 0..i.
__global__ void CausalSoftmaxForwardKernel(SoftmaxShape shape, const float* scores, float* probs) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= shape.batch * shape.t) return;
  const int64_t t = shape.t, i = row % t;
  const float* s = scores + row * t;
  float* p = probs + row * t;
  float max = -INFINITY;
  for (int64_t j = lane; j <= i; j += 32) max = fmaxf(max, shape.scale * s[j]);
  max = WarpMax(max);
  float sum = 0.0f;
  for (int64_t j = lane; j <= i; j += 32) {
    const float e = expf(shape.scale * s[j] - max);
    p[j] = e;
    sum += e;
  }
  const float inv = 1.0f / WarpSum(sum);
  for (int64_t j = lane; j < t; j += 32) p[j] = j <= i ? p[j] * inv : 0.0f;
}

__global__ void CausalSoftmaxBackwardKernel(SoftmaxShape shape, const float* probs,
                                            const float* dprobs, float* dscores) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= shape.batch * shape.t) return;
  const int64_t t = shape.t, i = row % t;
  const float* p = probs + row * t;
  const float* dp = dprobs + row * t;
  float* ds = dscores + row * t;
  float dot = 0.0f;
  for (int64_t j = lane; j <= i; j += 32) dot += dp[j] * p[j];
  dot = WarpSum(dot);
  for (int64_t j = lane; j < t; j += 32) ds[j] = j <= i ? shape.scale * p[j] * (dp[j] - dot) : 0.0f;
}

}  // namespace

cudaError_t LaunchLayerNormForward(const LayerNormShape& shape, const float* x, const float* gamma,
                                   const float* beta, float* y, float* mean, float* rstd,
                                   cudaStream_t stream) {
  LayerNormForwardKernel<<<GridForRows(shape.rows), kThreads, 0, stream>>>(shape, x, gamma, beta,
                                                                           y, mean, rstd);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormBackward(const LayerNormShape& shape, const float* x,
                                    const float* gamma, const float* mean, const float* rstd,
                                    const float* dy, float* dx, float* dgamma, float* dbeta,
                                    cudaStream_t stream) {
  LayerNormBackwardInputKernel<<<GridForRows(shape.rows), kThreads, 0, stream>>>(
      shape, x, gamma, mean, rstd, dy, dx);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  const unsigned blocks = static_cast<unsigned>((shape.cols + kThreads - 1) / kThreads);
  LayerNormBackwardParamsKernel<<<blocks, kThreads, 0, stream>>>(shape, x, mean, rstd, dy, dgamma,
                                                                 dbeta);
  return cudaGetLastError();
}

cudaError_t LaunchCausalSoftmaxForward(const SoftmaxShape& shape, const float* scores, float* probs,
                                       cudaStream_t stream) {
  CausalSoftmaxForwardKernel<<<GridForRows(shape.batch * shape.t), kThreads, 0, stream>>>(
      shape, scores, probs);
  return cudaGetLastError();
}

cudaError_t LaunchCausalSoftmaxBackward(const SoftmaxShape& shape, const float* probs,
                                        const float* dprobs, float* dscores, cudaStream_t stream) {
  CausalSoftmaxBackwardKernel<<<GridForRows(shape.batch * shape.t), kThreads, 0, stream>>>(
      shape, probs, dprobs, dscores);
  return cudaGetLastError();
}

}  // namespace shardline::worker::cuda
