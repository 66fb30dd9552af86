#include "worker/backend/cpu/cpu_backend.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "worker/backend/cpu/cpu_kernels.h"

namespace shardline::worker {
namespace {

constexpr size_t kAlignment = 64;

CBLAS_TRANSPOSE Trans(bool t) { return t ? CblasTrans : CblasNoTrans; }

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(int threads) {
  if (threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be >= 0, got ", threads));
  }
  if (threads > 0) openblas_set_num_threads(threads);
  return std::unique_ptr<CpuBackend>(new CpuBackend());
}

std::string CpuBackend::description() const {
  return absl::StrCat("cpu (", openblas_get_config(), ", ", openblas_get_num_threads(),
                      " BLAS threads)");
}

absl::StatusOr<int64_t> CpuBackend::MemoryAvailable() {
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return absl::UnavailableError("cannot read the available memory");
  return static_cast<int64_t>(pages) * page;
}

absl::StatusOr<DeviceBuffer> CpuBackend::Allocate(size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded < bytes) return absl::InvalidArgumentError("allocation size overflows");
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cpu: out of memory allocating ", bytes,
                                                     " bytes"));
  }
  return DeviceBuffer(p, bytes, [](void* q) { std::free(q); });
}

absl::Status CpuBackend::CopyToDeviceImpl(const void* src, void* dst, size_t bytes) {
  std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToHostImpl(const void* src, void* dst, size_t bytes) {
  std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyOnDeviceImpl(const void* src, void* dst, size_t bytes) {
  std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::FillImpl(float* x, size_t n, float value) {
  std::fill(x, x + n, value);
  return absl::OkStatus();
}

absl::Status CpuBackend::GemmImpl(const GemmShape& s, const float* a, const float* b, float* c) {
  for (int64_t i = 0; i < s.batch; ++i) {
    float* ci = c + i * s.stride_c;
    if (s.k == 0) {  // C = beta · C; BLAS libraries differ on k = 0
      for (int64_t r = 0; r < s.m; ++r) {
        float* row = ci + r * s.ldc;
        for (int64_t col = 0; col < s.n; ++col) row[col] = s.beta == 0.0f ? 0.0f : s.beta * row[col];
      }
      continue;
    }
    cblas_sgemm(CblasRowMajor, Trans(s.trans_a), Trans(s.trans_b), static_cast<blasint>(s.m),
                static_cast<blasint>(s.n), static_cast<blasint>(s.k), s.alpha, a + i * s.stride_a,
                static_cast<blasint>(s.lda), b + i * s.stride_b, static_cast<blasint>(s.ldb),
                s.beta, ci, static_cast<blasint>(s.ldc));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::AxpyImpl(float alpha, const float* x, float* y, size_t n) {
  cpu::Axpy(alpha, x, y, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::ScaleImpl(float* x, size_t n, float alpha) {
  cpu::Scale(x, n, alpha);
  return absl::OkStatus();
}

absl::Status CpuBackend::AddImpl(const float* a, const float* b, float* out, size_t n) {
  cpu::Add(a, b, out, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::BiasAddImpl(float* x, const float* bias, int64_t rows, int64_t cols) {
  cpu::BiasAdd(x, bias, rows, cols);
  return absl::OkStatus();
}

absl::Status CpuBackend::SumRowsImpl(const float* x, float* out, int64_t rows, int64_t cols) {
  cpu::SumRows(x, out, rows, cols);
  return absl::OkStatus();
}

absl::Status CpuBackend::GeluForwardImpl(const float* x, float* y, size_t n) {
  cpu::GeluForward(x, y, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::GeluBackwardImpl(const float* x, const float* dy, float* dx, size_t n) {
  cpu::GeluBackward(x, dy, dx, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormForwardImpl(const LayerNormShape& shape, const float* x,
                                              const float* gamma, const float* beta, float* y,
                                              float* mean, float* rstd) {
  cpu::LayerNormForward(shape, x, gamma, beta, y, mean, rstd);
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormBackwardImpl(const LayerNormShape& shape, const float* x,
                                               const float* gamma, const float* mean,
                                               const float* rstd, const float* dy, float* dx,
                                               float* dgamma, float* dbeta) {
  cpu::LayerNormBackward(shape, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
  return absl::OkStatus();
}

absl::Status CpuBackend::CausalSoftmaxForwardImpl(const SoftmaxShape& shape, const float* scores,
                                                  float* probs) {
  cpu::CausalSoftmaxForward(shape, scores, probs);
  return absl::OkStatus();
}

absl::Status CpuBackend::CausalSoftmaxBackwardImpl(const SoftmaxShape& shape, const float* probs,
                                                   const float* dprobs, float* dscores) {
  cpu::CausalSoftmaxBackward(shape, probs, dprobs, dscores);
  return absl::OkStatus();
}

absl::Status CpuBackend::EmbeddingForwardImpl(const EmbeddingShape& shape, const int32_t* ids,
                                              const float* table, float* out, bool accumulate) {
  return cpu::EmbeddingForward(shape, ids, table, out, accumulate);
}

absl::Status CpuBackend::EmbeddingBackwardImpl(const EmbeddingShape& shape, const int32_t* ids,
                                               const float* dout, float* dtable) {
  return cpu::EmbeddingBackward(shape, ids, dout, dtable);
}

absl::Status CpuBackend::CrossEntropyForwardImpl(const CrossEntropyShape& shape,
                                                 const float* logits, const int32_t* targets,
                                                 float* losses) {
  return cpu::CrossEntropyForward(shape, logits, targets, losses);
}

absl::Status CpuBackend::CrossEntropyBackwardImpl(const CrossEntropyShape& shape,
                                                  const float* logits, const int32_t* targets,
                                                  const float* lse, float grad_scale, float* dlogits) {
  return cpu::CrossEntropyBackward(shape, logits, targets, lse, grad_scale, dlogits);
}

absl::Status CpuBackend::CrossEntropyPartsImpl(const CrossEntropyShape& shape, const float* logits,
                                               const int32_t* targets, float* parts) {
  return cpu::CrossEntropyParts(shape, logits, targets, parts);
}

absl::Status CpuBackend::CrossEntropyCombineImpl(const LossPartsShape& shape, const float* parts,
                                                 const int32_t* targets, float* losses, float* lse) {
  cpu::CrossEntropyCombine(shape, parts, targets, losses, lse);
  return absl::OkStatus();
}

absl::Status CpuBackend::AdamWUpdateImpl(const AdamWStep& step, float* params, const float* grads,
                                         float* m, float* v, size_t n) {
  cpu::AdamWUpdate(step, params, grads, m, v, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::SgdMomentumUpdateImpl(const SgdStep& step, float* params,
                                               const float* grads, float* momentum, size_t n) {
  cpu::SgdMomentumUpdate(step, params, grads, momentum, n);
  return absl::OkStatus();
}

absl::StatusOr<double> CpuBackend::SumOfSquaresImpl(const float* x, size_t n) {
  return cpu::SumOfSquares(x, n);
}

absl::Status CpuBackend::ConvertFromF32Impl(const float* src, common::DType dtype, uint16_t* dst,
                                            size_t n) {
  if (dtype == common::DType::kBF16) {
    common::ConvertF32ToBf16(src, dst, n);
  } else {
    common::ConvertF32ToF16(src, dst, n);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::ConvertToF32Impl(const uint16_t* src, common::DType dtype, float* dst,
                                          size_t n) {
  if (dtype == common::DType::kBF16) {
    common::ConvertBf16ToF32(src, dst, n);
  } else {
    common::ConvertF16ToF32(src, dst, n);
  }
  return absl::OkStatus();
}

}  // namespace shardline::worker
