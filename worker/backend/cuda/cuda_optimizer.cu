#include <cmath>

#include "worker/backend/cuda/cuda_kernels.h"
#include "worker/backend/cuda/cuda_launch.cuh"

namespace shardline::worker::cuda {
namespace {

__global__ void AdamWKernel(AdamWStep step, float bias1, float bias2, float* params,
                            const float* grads, float* m, float* v, size_t n) {
  const float b1 = step.beta1, b2 = step.beta2;
  SHARDLINE_GRID_STRIDE(i, n) {
    const float g = grads[i];
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi / bias1;
    const float v_hat = vi / bias2;
    params[i] -= step.lr * (m_hat / (sqrtf(v_hat) + step.eps) + step.weight_decay * params[i]);
  }
}

__global__ void SgdMomentumKernel(SgdStep step, float* params, const float* grads,
                                  float* momentum, size_t n) {
  SHARDLINE_GRID_STRIDE(i, n) {
    const float g = grads[i] + step.weight_decay * params[i];
    const float buf = step.momentum * momentum[i] + g;
    momentum[i] = buf;
    params[i] -= step.lr * buf;
  }
}

// Each block folds its grid-stride share into one double, in a fixed order.
__global__ void SumOfSquaresPartialKernel(const float* x, size_t n, double* partials) {
  __shared__ double warp_sums[kWarpsPerBlock];
  double sum = 0.0;
  SHARDLINE_GRID_STRIDE(i, n) sum += static_cast<double>(x[i]) * x[i];
  sum = WarpSum(sum);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double block = 0.0;
    for (int w = 0; w < kWarpsPerBlock; ++w) block += warp_sums[w];
    partials[blockIdx.x] = block;
  }
}

__global__ void SumPartialsKernel(const double* partials, int count, double* result) {
  double sum = 0.0;
  for (int i = 0; i < count; ++i) sum += partials[i];
  *result = sum;
}

}  // namespace

cudaError_t LaunchAdamW(const AdamWStep& step, float* params, const float* grads, float* m,
                        float* v, size_t n, cudaStream_t stream) {
  const float bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(step.beta1), step.step));
  const float bias2 = static_cast<float>(1.0 - std::pow(static_cast<double>(step.beta2), step.step));
  AdamWKernel<<<GridFor(n), kThreads, 0, stream>>>(step, bias1, bias2, params, grads, m, v, n);
  return cudaGetLastError();
}

cudaError_t LaunchSgdMomentum(const SgdStep& step, float* params, const float* grads,
                              float* momentum, size_t n, cudaStream_t stream) {
  SgdMomentumKernel<<<GridFor(n), kThreads, 0, stream>>>(step, params, grads, momentum, n);
  return cudaGetLastError();
}

cudaError_t LaunchSumOfSquares(const float* x, size_t n, double* partials, double* result,
                               cudaStream_t stream) {
  SumOfSquaresPartialKernel<<<kSumOfSquaresBlocks, kThreads, 0, stream>>>(x, n, partials);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  SumPartialsKernel<<<1, 1, 0, stream>>>(partials, kSumOfSquaresBlocks, result);
  return cudaGetLastError();
}

}  // namespace shardline::worker::cuda
