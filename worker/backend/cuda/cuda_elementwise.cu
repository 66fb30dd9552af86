#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "worker/backend/cuda/cuda_kernels.h"
#include "worker/backend/cuda/cuda_launch.cuh"

namespace shardline::worker::cuda {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/π)
constexpr float kGeluCubic = 0.044715f;

__global__ void FillKernel(float* x, size_t n, float value) {
  SHARDLINE_GRID_STRIDE(i, n) x[i] = value;
}

__global__ void AxpyKernel(float alpha, const float* x, float* y, size_t n) {
  SHARDLINE_GRID_STRIDE(i, n) y[i] += alpha * x[i];
}

__global__ void ScaleKernel(float* x, size_t n, float alpha) {
  SHARDLINE_GRID_STRIDE(i, n) x[i] *= alpha;
}

__global__ void AddKernel(const float* a, const float* b, float* out, size_t n) {
  SHARDLINE_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void BiasAddKernel(float* x, const float* bias, size_t n, int64_t cols) {
  SHARDLINE_GRID_STRIDE(i, n) x[i] += bias[static_cast<int64_t>(i) % cols];
}

// One thread per column, rows in order: deterministic, and coalesced across
// the threads of a warp.
__global__ void SumRowsKernel(const float* x, float* out, int64_t rows, int64_t cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float sum = 0.0f;
  for (int64_t r = 0; r < rows; ++r) sum += x[r * cols + c];
  out[c] += sum;
}

__global__ void GeluForwardKernel(const float* x, float* y, size_t n) {
  SHARDLINE_GRID_STRIDE(i, n) {
    const float v = x[i];
    const float u = kGeluScale * (v + kGeluCubic * v * v * v);
    y[i] = 0.5f * v * (1.0f + tanhf(u));
  }
}

__global__ void GeluBackwardKernel(const float* x, const float* dy, float* dx, size_t n) {
  SHARDLINE_GRID_STRIDE(i, n) {
    const float v = x[i];
    const float u = kGeluScale * (v + kGeluCubic * v * v * v);
    const float th = tanhf(u);
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] += dy[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
  }
}

__global__ void F32ToBf16Kernel(const float* src, uint16_t* dst, size_t n) {
  SHARDLINE_GRID_STRIDE(i, n) dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(src[i]));
}

__global__ void F32ToF16Kernel(const float* src, uint16_t* dst, size_t n) {
  SHARDLINE_GRID_STRIDE(i, n) dst[i] = __half_as_ushort(__float2half_rn(src[i]));
}

__global__ void Bf16ToF32Kernel(const uint16_t* src, float* dst, size_t n) {
  SHARDLINE_GRID_STRIDE(i, n) dst[i] = __bfloat162float(__ushort_as_bfloat16(src[i]));
}

__global__ void F16ToF32Kernel(const uint16_t* src, float* dst, size_t n) {
  SHARDLINE_GRID_STRIDE(i, n) dst[i] = __half2float(__ushort_as_half(src[i]));
}

}  // namespace

cudaError_t LaunchFill(float* x, size_t n, float value, cudaStream_t stream) {
  FillKernel<<<GridFor(n), kThreads, 0, stream>>>(x, n, value);
  return cudaGetLastError();
}

cudaError_t LaunchAxpy(float alpha, const float* x, float* y, size_t n, cudaStream_t stream) {
  AxpyKernel<<<GridFor(n), kThreads, 0, stream>>>(alpha, x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchScale(float* x, size_t n, float alpha, cudaStream_t stream) {
  ScaleKernel<<<GridFor(n), kThreads, 0, stream>>>(x, n, alpha);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const float* a, const float* b, float* out, size_t n, cudaStream_t stream) {
  AddKernel<<<GridFor(n), kThreads, 0, stream>>>(a, b, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchBiasAdd(float* x, const float* bias, int64_t rows, int64_t cols,
                          cudaStream_t stream) {
  const size_t n = static_cast<size_t>(rows * cols);
  BiasAddKernel<<<GridFor(n), kThreads, 0, stream>>>(x, bias, n, cols);
  return cudaGetLastError();
}

cudaError_t LaunchSumRows(const float* x, float* out, int64_t rows, int64_t cols,
                          cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((cols + kThreads - 1) / kThreads);
  SumRowsKernel<<<blocks, kThreads, 0, stream>>>(x, out, rows, cols);
  return cudaGetLastError();
}

cudaError_t LaunchGeluForward(const float* x, float* y, size_t n, cudaStream_t stream) {
  GeluForwardKernel<<<GridFor(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchGeluBackward(const float* x, const float* dy, float* dx, size_t n,
                               cudaStream_t stream) {
  GeluBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(x, dy, dx, n);
  return cudaGetLastError();
}

cudaError_t LaunchF32ToBf16(const float* src, uint16_t* dst, size_t n, cudaStream_t stream) {
  F32ToBf16Kernel<<<GridFor(n), kThreads, 0, stream>>>(src, dst, n);
  return cudaGetLastError();
}

cudaError_t LaunchF32ToF16(const float* src, uint16_t* dst, size_t n, cudaStream_t stream) {
  F32ToF16Kernel<<<GridFor(n), kThreads, 0, stream>>>(src, dst, n);
  return cudaGetLastError();
}

cudaError_t LaunchBf16ToF32(const uint16_t* src, float* dst, size_t n, cudaStream_t stream) {
  Bf16ToF32Kernel<<<GridFor(n), kThreads, 0, stream>>>(src, dst, n);
  return cudaGetLastError();
}

cudaError_t LaunchF16ToF32(const uint16_t* src, float* dst, size_t n, cudaStream_t stream) {
  F16ToF32Kernel<<<GridFor(n), kThreads, 0, stream>>>(src, dst, n);
  return cudaGetLastError();
}

}  // namespace shardline::worker::cuda
