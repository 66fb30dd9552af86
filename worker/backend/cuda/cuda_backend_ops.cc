// CudaBackend's compute operations: GEMMs through cuBLAS, everything else
// through our kernels (cuda_kernels.h), all queued on the compute stream
// with the backend's device current (cuda_backend.cc has the device, its
// memory, streams and copies).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_kernels.h"
#include "worker/backend/cuda/cuda_status.h"

namespace shardline::worker {
namespace {

cublasOperation_t Op(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

absl::Status CudaBackend::FillImpl(float* x, size_t n, float value) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchFill(x, n, value, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::GemmImpl(const GemmShape& s, const float* a, const float* b, float* c) {
  RETURN_IF_ERROR(MakeCurrent());
  if (s.k == 0) {  // C = beta · C
    for (int64_t i = 0; i < s.batch; ++i) {
      float* ci = c + i * s.stride_c;
      if (s.beta == 0.0f) {
        CUDA_RETURN_IF_ERROR(cudaMemset2DAsync(ci, s.ldc * sizeof(float), 0, s.n * sizeof(float),
                                               s.m, stream_));
      } else {
        const float zero = 0.0f;
        CUBLAS_RETURN_IF_ERROR(cublasSgeam(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, s.n, s.m, &s.beta,
                                           ci, s.ldc, &zero, ci, s.ldc, ci, s.ldc));
      }
    }
    return absl::OkStatus();
  }
  // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, and a
  // row-major matrix read column-major is its transpose: swap the operands.
  CUBLAS_RETURN_IF_ERROR(cublasSgemmStridedBatched(
      cublas_, Op(s.trans_b), Op(s.trans_a), static_cast<int>(s.n), static_cast<int>(s.m),
      static_cast<int>(s.k), &s.alpha, b, static_cast<int>(s.ldb), s.stride_b, a,
      static_cast<int>(s.lda), s.stride_a, &s.beta, c, static_cast<int>(s.ldc), s.stride_c,
      static_cast<int>(s.batch)));
  return absl::OkStatus();
}

absl::Status CudaBackend::AxpyImpl(float alpha, const float* x, float* y, size_t n) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchAxpy(alpha, x, y, n, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::ScaleImpl(float* x, size_t n, float alpha) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchScale(x, n, alpha, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::AddImpl(const float* a, const float* b, float* out, size_t n) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchAdd(a, b, out, n, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::BiasAddImpl(float* x, const float* bias, int64_t rows, int64_t cols) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchBiasAdd(x, bias, rows, cols, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::SumRowsImpl(const float* x, float* out, int64_t rows, int64_t cols) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchSumRows(x, out, rows, cols, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::GeluForwardImpl(const float* x, float* y, size_t n) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchGeluForward(x, y, n, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::GeluBackwardImpl(const float* x, const float* dy, float* dx, size_t n) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchGeluBackward(x, dy, dx, n, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::LayerNormForwardImpl(const LayerNormShape& shape, const float* x,
                                               const float* gamma, const float* beta, float* y,
                                               float* mean, float* rstd) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(
      cuda::LaunchLayerNormForward(shape, x, gamma, beta, y, mean, rstd, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::LayerNormBackwardImpl(const LayerNormShape& shape, const float* x,
                                                const float* gamma, const float* mean,
                                                const float* rstd, const float* dy, float* dx,
                                                float* dgamma, float* dbeta) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchLayerNormBackward(shape, x, gamma, mean, rstd, dy, dx, dgamma,
                                                     dbeta, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CausalSoftmaxForwardImpl(const SoftmaxShape& shape, const float* scores,
                                                   float* probs) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchCausalSoftmaxForward(shape, scores, probs, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CausalSoftmaxBackwardImpl(const SoftmaxShape& shape, const float* probs,
                                                    const float* dprobs, float* dscores) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchCausalSoftmaxBackward(shape, probs, dprobs, dscores, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::EmbeddingForwardImpl(const EmbeddingShape& shape, const int32_t* ids,
                                               const float* table, float* out, bool accumulate) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchEmbeddingForward(
      shape, ids, table, out, accumulate, static_cast<unsigned*>(error_flag_.data()), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::EmbeddingBackwardImpl(const EmbeddingShape& shape, const int32_t* ids,
                                                const float* dout, float* dtable) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchEmbeddingBackward(
      shape, ids, dout, dtable, static_cast<unsigned*>(error_flag_.data()), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CrossEntropyForwardImpl(const CrossEntropyShape& shape,
                                                  const float* logits, const int32_t* targets,
                                                  float* losses) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchCrossEntropyForward(
      shape, logits, targets, losses, static_cast<unsigned*>(error_flag_.data()), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CrossEntropyBackwardImpl(const CrossEntropyShape& shape,
                                                   const float* logits, const int32_t* targets,
                                                   const float* lse, float grad_scale, float* dlogits) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchCrossEntropyBackward(shape, logits, targets, lse, grad_scale, dlogits,
                                                        static_cast<unsigned*>(error_flag_.data()),
                                                        stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CrossEntropyPartsImpl(const CrossEntropyShape& shape, const float* logits,
                                                const int32_t* targets, float* parts) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchCrossEntropyParts(shape, logits, targets, parts,
                                                     static_cast<unsigned*>(error_flag_.data()), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CrossEntropyCombineImpl(const LossPartsShape& shape, const float* parts,
                                                  const int32_t* targets, float* losses, float* lse) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchCrossEntropyCombine(shape, parts, targets, losses, lse, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::AdamWUpdateImpl(const AdamWStep& step, float* params,
                                          const float* grads, float* m, float* v, size_t n) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchAdamW(step, params, grads, m, v, n, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::SgdMomentumUpdateImpl(const SgdStep& step, float* params,
                                                const float* grads, float* momentum, size_t n) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cuda::LaunchSgdMomentum(step, params, grads, momentum, n, stream_));
  return absl::OkStatus();
}

absl::StatusOr<double> CudaBackend::SumOfSquaresImpl(const float* x, size_t n) {
  RETURN_IF_ERROR(MakeCurrent());
  auto* partials = static_cast<double*>(reduce_scratch_.data());
  double* result = partials + cuda::kSumOfSquaresBlocks;
  CUDA_RETURN_IF_ERROR(cuda::LaunchSumOfSquares(x, n, partials, result, stream_));
  double host = 0.0;
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&host, result, sizeof(host), cudaMemcpyDeviceToHost, stream_));
  RETURN_IF_ERROR(Synchronize());
  return host;
}

absl::StatusOr<std::vector<double>> CudaBackend::SumsOfSquaresImpl(
    absl::Span<const DeviceSpan<const float>> xs) {
  RETURN_IF_ERROR(MakeCurrent());
  std::vector<double> host(xs.size());
  if (!xs.empty()) {
    if (sums_.bytes() < host.size() * sizeof(double)) {
      ASSIGN_OR_RETURN(sums_, Allocate(host.size() * sizeof(double)));
    }
    auto* partials = static_cast<double*>(reduce_scratch_.data());  // reused in stream order
    auto* results = static_cast<double*>(sums_.data());
    for (size_t i = 0; i < xs.size(); ++i) {
      CUDA_RETURN_IF_ERROR(
          cuda::LaunchSumOfSquares(xs[i].data(), xs[i].size(), partials, results + i, stream_));
    }
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host.data(), results, host.size() * sizeof(double),
                                         cudaMemcpyDeviceToHost, stream_));
  }
  RETURN_IF_ERROR(Synchronize());
  return host;
}

absl::Status CudaBackend::ConvertFromF32Impl(const float* src, common::DType dtype, uint16_t* dst,
                                             size_t n) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(dtype == common::DType::kBF16 ? cuda::LaunchF32ToBf16(src, dst, n, stream_)
                                                     : cuda::LaunchF32ToF16(src, dst, n, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::ConvertToF32Impl(const uint16_t* src, common::DType dtype, float* dst,
                                           size_t n) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(dtype == common::DType::kBF16 ? cuda::LaunchBf16ToF32(src, dst, n, stream_)
                                                     : cuda::LaunchF16ToF32(src, dst, n, stream_));
  return absl::OkStatus();
}

}  // namespace shardline::worker
