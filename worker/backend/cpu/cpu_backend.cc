#include "worker/backend/cpu/cpu_backend.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/half.h"
#include "common/status_macros.h"
#include "worker/backend/cpu/cpu_gemm.h"
#include "worker/backend/cpu/cpu_kernels.h"

namespace shardline::worker {
namespace {

constexpr size_t kAlignment = 64;

// Items below which a part is not worth a thread's wake-up: about 10 µs of
// work for the cheapest kernels.
constexpr size_t kGrain = 16384;
// For the kernels with more arithmetic per item (GELU, the optimizers).
constexpr size_t kHeavyGrain = 4096;

// Rows (or columns) of `width` items that make a part of about `items`.
size_t RowGrain(int64_t width, size_t items) {
  return std::max<size_t>(1, items / static_cast<size_t>(std::max<int64_t>(width, 1)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(int threads) {
  if (threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be >= 0, got ", threads));
  }
  const int blas_default = cpu::TakeOverBlasThreads();
  return std::unique_ptr<CpuBackend>(new CpuBackend(threads > 0 ? threads : blas_default));
}

CpuBackend::CpuBackend() : CpuBackend(cpu::TakeOverBlasThreads()) {}

CpuBackend::CpuBackend(int threads) : pool_(std::make_unique<cpu::CpuThreadPool>(threads)) {}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::description() const {
  return absl::StrCat("cpu (", openblas_get_config(), ", ", pool_->threads(), " threads)");
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
  pool_->ParallelFor(n, kGrain, [&](size_t b, size_t e) { std::fill(x + b, x + e, value); });
  return absl::OkStatus();
}

absl::Status CpuBackend::GemmImpl(const GemmShape& s, const float* a, const float* b, float* c) {
  cpu::Gemm(*pool_, s, a, b, c);
  return absl::OkStatus();
}

absl::Status CpuBackend::GemmPairImpl(const GemmOperands& first, const GemmOperands& second) {
  cpu::GemmPair(*pool_, first, second);
  return absl::OkStatus();
}

absl::Status CpuBackend::AxpyImpl(float alpha, const float* x, float* y, size_t n) {
  pool_->ParallelFor(n, kGrain, [&](size_t b, size_t e) { cpu::Axpy(alpha, x + b, y + b, e - b); });
  return absl::OkStatus();
}

absl::Status CpuBackend::ScaleImpl(float* x, size_t n, float alpha) {
  pool_->ParallelFor(n, kGrain, [&](size_t b, size_t e) { cpu::Scale(x + b, e - b, alpha); });
  return absl::OkStatus();
}

absl::Status CpuBackend::AddImpl(const float* a, const float* b, float* out, size_t n) {
  pool_->ParallelFor(n, kGrain, [&](size_t i, size_t e) { cpu::Add(a + i, b + i, out + i, e - i); });
  return absl::OkStatus();
}

absl::Status CpuBackend::BiasAddImpl(float* x, const float* bias, int64_t rows, int64_t cols) {
  pool_->ParallelFor(static_cast<size_t>(rows), RowGrain(cols, kGrain), [&](size_t b, size_t e) {
    cpu::BiasAdd(x + b * cols, bias, static_cast<int64_t>(e - b), cols);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::SumRowsImpl(const float* x, float* out, int64_t rows, int64_t cols) {
  // By columns: each column's sum runs over the rows in order.
  pool_->ParallelFor(static_cast<size_t>(cols), RowGrain(rows, kGrain), [&](size_t b, size_t e) {
    cpu::SumRows(x + b, out + b, rows, static_cast<int64_t>(e - b), cols);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::GeluForwardImpl(const float* x, float* y, size_t n) {
  pool_->ParallelFor(n, kHeavyGrain, [&](size_t b, size_t e) { cpu::GeluForward(x + b, y + b, e - b); });
  return absl::OkStatus();
}

absl::Status CpuBackend::GeluBackwardImpl(const float* x, const float* dy, float* dx, size_t n) {
  pool_->ParallelFor(n, kHeavyGrain,
                     [&](size_t b, size_t e) { cpu::GeluBackward(x + b, dy + b, dx + b, e - b); });
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormForwardImpl(const LayerNormShape& shape, const float* x,
                                              const float* gamma, const float* beta, float* y,
                                              float* mean, float* rstd) {
  const int64_t cols = shape.cols;
  pool_->ParallelFor(static_cast<size_t>(shape.rows), RowGrain(cols, kHeavyGrain), [&](size_t b, size_t e) {
    const LayerNormShape part{static_cast<int64_t>(e - b), cols, shape.eps};
    cpu::LayerNormForward(part, x + b * cols, gamma, beta, y + b * cols, mean + b, rstd + b);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormBackwardImpl(const LayerNormShape& shape, const float* x,
                                               const float* gamma, const float* mean,
                                               const float* rstd, const float* dy, float* dx,
                                               float* dgamma, float* dbeta) {
  const int64_t cols = shape.cols;
  pool_->ParallelFor(static_cast<size_t>(shape.rows), RowGrain(cols, kHeavyGrain), [&](size_t b, size_t e) {
    const LayerNormShape part{static_cast<int64_t>(e - b), cols, shape.eps};
    cpu::LayerNormBackwardInput(part, x + b * cols, gamma, mean + b, rstd + b, dy + b * cols, dx + b * cols);
  });
  pool_->ParallelFor(static_cast<size_t>(cols), RowGrain(shape.rows, kHeavyGrain), [&](size_t b, size_t e) {
    cpu::LayerNormBackwardParams(shape, static_cast<int64_t>(b), static_cast<int64_t>(e), x, mean, rstd, dy,
                                 dgamma, dbeta);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::CausalSoftmaxForwardImpl(const SoftmaxShape& shape, const float* scores,
                                                  float* probs) {
  const int64_t tt = shape.t * shape.t;
  pool_->ParallelFor(static_cast<size_t>(shape.batch), RowGrain(tt, kHeavyGrain), [&](size_t b, size_t e) {
    const SoftmaxShape part{static_cast<int64_t>(e - b), shape.t, shape.scale};
    cpu::CausalSoftmaxForward(part, scores + b * tt, probs + b * tt);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::CausalSoftmaxBackwardImpl(const SoftmaxShape& shape, const float* probs,
                                                   const float* dprobs, float* dscores) {
  const int64_t tt = shape.t * shape.t;
  pool_->ParallelFor(static_cast<size_t>(shape.batch), RowGrain(tt, kHeavyGrain), [&](size_t b, size_t e) {
    const SoftmaxShape part{static_cast<int64_t>(e - b), shape.t, shape.scale};
    cpu::CausalSoftmaxBackward(part, probs + b * tt, dprobs + b * tt, dscores + b * tt);
  });
  return absl::OkStatus();
}

int64_t CpuBackend::AttentionKernelSavedFloats(const AttentionShape& shape) const {
  return cpu::CausalAttentionSavedFloats(shape);
}

absl::Status CpuBackend::AttentionForwardKernel(const AttentionShape& shape, const float* qkv, float* out,
                                               float* saved) {
  pool_->Run(shape.batch * shape.heads,
             [&](int64_t part) { cpu::CausalAttentionForward(shape, part, qkv, out, saved); });
  return absl::OkStatus();
}

absl::Status CpuBackend::AttentionBackwardKernel(const AttentionShape& shape, const float* qkv, const float* out,
                                                const float* saved, const float* dout, float* dqkv) {
  pool_->Run(shape.batch * shape.heads, [&](int64_t part) {
    cpu::CausalAttentionBackward(shape, part, qkv, out, saved, dout, dqkv);
  });
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

// Cross-entropy row by row over the pool, after checking every row's target
// (so an error leaves every output untouched). `part` runs rows [b, e).
absl::Status CpuBackend::CrossEntropyRows(const char* op, const CrossEntropyShape& shape, const int32_t* targets,
                                          int64_t classes,
                                          absl::FunctionRef<absl::Status(const CrossEntropyShape&, int64_t)> part) {
  RETURN_IF_ERROR(cpu::CheckTargets(op, targets, shape.rows, classes));
  absl::Mutex mu;
  absl::Status first_error;
  pool_->ParallelFor(static_cast<size_t>(shape.rows), RowGrain(shape.vocab, kHeavyGrain), [&](size_t b, size_t e) {
    CrossEntropyShape rows = shape;
    rows.rows = static_cast<int64_t>(e - b);
    absl::Status s = part(rows, static_cast<int64_t>(b));
    if (!s.ok()) {
      absl::MutexLock lock(&mu);
      if (first_error.ok()) first_error = std::move(s);
    }
  });
  return first_error;
}

absl::Status CpuBackend::CrossEntropyForwardImpl(const CrossEntropyShape& shape, const float* logits,
                                                 const int32_t* targets, float* losses) {
  return CrossEntropyRows("CrossEntropyForward", shape, targets, shape.vocab,
                          [&](const CrossEntropyShape& rows, int64_t r) {
                            return cpu::CrossEntropyForward(rows, logits + r * shape.vocab, targets + r, losses + r);
                          });
}

absl::Status CpuBackend::CrossEntropyBackwardImpl(const CrossEntropyShape& shape, const float* logits,
                                                  const int32_t* targets, const float* lse, float grad_scale,
                                                  float* dlogits) {
  return CrossEntropyRows("CrossEntropyBackward", shape, targets, shape.classes(),
                          [&](const CrossEntropyShape& rows, int64_t r) {
                            return cpu::CrossEntropyBackward(rows, logits + r * shape.vocab, targets + r,
                                                             lse == nullptr ? nullptr : lse + r, grad_scale,
                                                             dlogits + r * shape.vocab);
                          });
}

absl::Status CpuBackend::CrossEntropyPartsImpl(const CrossEntropyShape& shape, const float* logits,
                                               const int32_t* targets, float* parts) {
  return CrossEntropyRows("CrossEntropyParts", shape, targets, shape.classes(),
                          [&](const CrossEntropyShape& rows, int64_t r) {
                            return cpu::CrossEntropyParts(rows, logits + r * shape.vocab, targets + r, parts + 3 * r);
                          });
}

absl::Status CpuBackend::CrossEntropyCombineImpl(const LossPartsShape& shape, const float* parts,
                                                 const int32_t* targets, float* losses, float* lse) {
  cpu::CrossEntropyCombine(shape, parts, targets, losses, lse);
  return absl::OkStatus();
}

absl::Status CpuBackend::AdamWUpdateImpl(const AdamWStep& step, float* params, const float* grads,
                                         float* m, float* v, size_t n) {
  pool_->ParallelFor(n, kHeavyGrain, [&](size_t b, size_t e) {
    cpu::AdamWUpdate(step, params + b, grads + b, m + b, v + b, e - b);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::SgdMomentumUpdateImpl(const SgdStep& step, float* params,
                                               const float* grads, float* momentum, size_t n) {
  pool_->ParallelFor(n, kHeavyGrain, [&](size_t b, size_t e) {
    cpu::SgdMomentumUpdate(step, params + b, grads + b, momentum + b, e - b);
  });
  return absl::OkStatus();
}

absl::StatusOr<double> CpuBackend::SumOfSquaresImpl(const float* x, size_t n) {
  return cpu::SumOfSquares(x, n);
}

absl::StatusOr<std::vector<double>> CpuBackend::SumsOfSquaresImpl(
    absl::Span<const DeviceSpan<const float>> xs) {
  // One part per span: each sum in its own order, as SumOfSquares has it.
  std::vector<double> sums(xs.size(), 0.0);
  pool_->Run(static_cast<int64_t>(xs.size()),
             [&](int64_t i) { sums[i] = cpu::SumOfSquares(xs[i].data(), xs[i].size()); });
  return sums;
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
