// Launchers for Shardline's own CUDA kernels. Plain C++ over raw device
// pointers, so this header and the .cu files stay free of Abseil, glog and
// gRPC. Each launcher enqueues on `stream` and returns the launch error
// (cudaSuccess when the launch went in). Arguments are validated by Backend
// before they get here. Kernels that read ids or targets set bits in the
// device word `error_flag` (see kErrorFlag*) instead of reading out of bounds.
#ifndef SHARDLINE_WORKER_BACKEND_CUDA_CUDA_KERNELS_H_
#define SHARDLINE_WORKER_BACKEND_CUDA_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "worker/backend/backend_types.h"

namespace shardline::worker::cuda {

inline constexpr unsigned kErrorFlagEmbeddingForward = 1u;
inline constexpr unsigned kErrorFlagEmbeddingBackward = 2u;
inline constexpr unsigned kErrorFlagCrossEntropyForward = 4u;
inline constexpr unsigned kErrorFlagCrossEntropyBackward = 8u;
inline constexpr unsigned kErrorFlagCrossEntropyParts = 16u;

// Element-wise (cuda_elementwise.cu).
cudaError_t LaunchFill(float* x, size_t n, float value, cudaStream_t stream);
cudaError_t LaunchAxpy(float alpha, const float* x, float* y, size_t n, cudaStream_t stream);
cudaError_t LaunchScale(float* x, size_t n, float alpha, cudaStream_t stream);
cudaError_t LaunchAdd(const float* a, const float* b, float* out, size_t n, cudaStream_t stream);
cudaError_t LaunchBiasAdd(float* x, const float* bias, int64_t rows, int64_t cols,
                          cudaStream_t stream);
cudaError_t LaunchSumRows(const float* x, float* out, int64_t rows, int64_t cols,
                          cudaStream_t stream);
cudaError_t LaunchGeluForward(const float* x, float* y, size_t n, cudaStream_t stream);
cudaError_t LaunchGeluBackward(const float* x, const float* dy, float* dx, size_t n,
                               cudaStream_t stream);
cudaError_t LaunchF32ToBf16(const float* src, uint16_t* dst, size_t n, cudaStream_t stream);
cudaError_t LaunchF32ToF16(const float* src, uint16_t* dst, size_t n, cudaStream_t stream);
cudaError_t LaunchBf16ToF32(const uint16_t* src, float* dst, size_t n, cudaStream_t stream);
cudaError_t LaunchF16ToF32(const uint16_t* src, float* dst, size_t n, cudaStream_t stream);

// Normalisation and softmax (cuda_normalization.cu).
cudaError_t LaunchLayerNormForward(const LayerNormShape& shape, const float* x, const float* gamma,
                                   const float* beta, float* y, float* mean, float* rstd,
                                   cudaStream_t stream);
cudaError_t LaunchLayerNormBackward(const LayerNormShape& shape, const float* x,
                                    const float* gamma, const float* mean, const float* rstd,
                                    const float* dy, float* dx, float* dgamma, float* dbeta,
                                    cudaStream_t stream);
cudaError_t LaunchCausalSoftmaxForward(const SoftmaxShape& shape, const float* scores, float* probs,
                                       cudaStream_t stream);
cudaError_t LaunchCausalSoftmaxBackward(const SoftmaxShape& shape, const float* probs,
                                        const float* dprobs, float* dscores, cudaStream_t stream);

// Embedding and loss (cuda_lookup.cu).
cudaError_t LaunchEmbeddingForward(const EmbeddingShape& shape, const int32_t* ids,
                                   const float* table, float* out, bool accumulate,
                                   unsigned* error_flag, cudaStream_t stream);
cudaError_t LaunchEmbeddingBackward(const EmbeddingShape& shape, const int32_t* ids,
                                    const float* dout, float* dtable, unsigned* error_flag,
                                    cudaStream_t stream);
cudaError_t LaunchCrossEntropyForward(const CrossEntropyShape& shape, const float* logits,
                                      const int32_t* targets, float* losses, unsigned* error_flag,
                                      cudaStream_t stream);
cudaError_t LaunchCrossEntropyBackward(const CrossEntropyShape& shape, const float* logits,
                                       const int32_t* targets, const float* lse, float grad_scale,
                                       float* dlogits, unsigned* error_flag, cudaStream_t stream);
cudaError_t LaunchCrossEntropyParts(const CrossEntropyShape& shape, const float* logits, const int32_t* targets,
                                    float* parts, unsigned* error_flag, cudaStream_t stream);
cudaError_t LaunchCrossEntropyCombine(const LossPartsShape& shape, const float* parts, const int32_t* targets,
                                      float* losses, float* lse, cudaStream_t stream);

// Optimizers and reductions (cuda_optimizer.cu).
cudaError_t LaunchAdamW(const AdamWStep& step, float* params, const float* grads, float* m,
                        float* v, size_t n, cudaStream_t stream);
cudaError_t LaunchSgdMomentum(const SgdStep& step, float* params, const float* grads,
                              float* momentum, size_t n, cudaStream_t stream);
// Deterministic Σ x² in double: per-block partial sums into `partials`
// (kSumOfSquaresBlocks doubles), then one block adds them into *result.
inline constexpr int kSumOfSquaresBlocks = 256;
cudaError_t LaunchSumOfSquares(const float* x, size_t n, double* partials, double* result,
                               cudaStream_t stream);

}  // namespace shardline::worker::cuda

#endif  // SHARDLINE_WORKER_BACKEND_CUDA_CUDA_KERNELS_H_
