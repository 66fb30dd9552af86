// CpuBackend runs every Backend operation on the host: GEMMs through the CBLAS
// interface of OpenBLAS, everything else through the loops in cpu_kernels.h.
// It is the reference oracle the CUDA backend is tested against. Work runs
// synchronously on the calling thread (plus the pool's), so
// Synchronize() has nothing to wait for. Not thread-safe. Tests derive from
// it to emulate a device whose copies finish later
// (tests/testing/deferred_copy_backend.h).
//
// Each backend has its own CpuThreadPool of `threads` threads (0 = OpenBLAS'
// default: OPENBLAS_NUM_THREADS or the cores), on which everything runs, its
// GEMMs included: OpenBLAS is set to one thread for the whole process and
// each pool thread runs its own part of a GEMM (cpu_gemm.h), so backends in
// one process do not share or fight over a process-wide BLAS thread count.
#ifndef SHARDLINE_WORKER_BACKEND_CPU_CPU_BACKEND_H_
#define SHARDLINE_WORKER_BACKEND_CPU_CPU_BACKEND_H_

#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/backend/cpu/cpu_thread_pool.h"

namespace shardline::worker {

class CpuBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(int threads);

  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  std::string description() const override;
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::StatusOr<int64_t> MemoryAvailable() override;
  bool has_attention_kernel() const override { return true; }
  int64_t AttentionKernelSavedFloats(const AttentionShape& shape) const override;
  absl::Status AttentionForwardKernel(const AttentionShape& shape, const float* qkv, float* out,
                                      float* saved) override;
  absl::Status AttentionBackwardKernel(const AttentionShape& shape, const float* qkv, const float* out,
                                       const float* saved, const float* dout, float* dqkv) override;

 protected:
  absl::Status CopyToDeviceImpl(const void* src, void* dst, size_t bytes) override;
  absl::Status CopyToHostImpl(const void* src, void* dst, size_t bytes) override;
  absl::Status CopyOnDeviceImpl(const void* src, void* dst, size_t bytes) override;
  absl::Status FillImpl(float* x, size_t n, float value) override;
  absl::Status GemmImpl(const GemmShape& shape, const float* a, const float* b, float* c) override;
  absl::Status GemmPairImpl(const GemmOperands& first, const GemmOperands& second) override;
  absl::Status AxpyImpl(float alpha, const float* x, float* y, size_t n) override;
  absl::Status ScaleImpl(float* x, size_t n, float alpha) override;
  absl::Status AddImpl(const float* a, const float* b, float* out, size_t n) override;
  absl::Status BiasAddImpl(float* x, const float* bias, int64_t rows, int64_t cols) override;
  absl::Status SumRowsImpl(const float* x, float* out, int64_t rows, int64_t cols) override;
  absl::Status GeluForwardImpl(const float* x, float* y, size_t n) override;
  absl::Status GeluBackwardImpl(const float* x, const float* dy, float* dx, size_t n) override;
  absl::Status LayerNormForwardImpl(const LayerNormShape& shape, const float* x, const float* gamma,
                                    const float* beta, float* y, float* mean,
                                    float* rstd) override;
  absl::Status LayerNormBackwardImpl(const LayerNormShape& shape, const float* x,
                                     const float* gamma, const float* mean, const float* rstd,
                                     const float* dy, float* dx, float* dgamma,
                                     float* dbeta) override;
  absl::Status CausalSoftmaxForwardImpl(const SoftmaxShape& shape, const float* scores,
                                        float* probs) override;
  absl::Status CausalSoftmaxBackwardImpl(const SoftmaxShape& shape, const float* probs,
                                         const float* dprobs, float* dscores) override;
  absl::Status EmbeddingForwardImpl(const EmbeddingShape& shape, const int32_t* ids,
                                    const float* table, float* out, bool accumulate) override;
  absl::Status EmbeddingBackwardImpl(const EmbeddingShape& shape, const int32_t* ids,
                                     const float* dout, float* dtable) override;
  absl::Status CrossEntropyForwardImpl(const CrossEntropyShape& shape, const float* logits,
                                       const int32_t* targets, float* losses) override;
  absl::Status CrossEntropyBackwardImpl(const CrossEntropyShape& shape, const float* logits,
                                        const int32_t* targets, const float* lse, float grad_scale,
                                        float* dlogits) override;
  absl::Status CrossEntropyPartsImpl(const CrossEntropyShape& shape, const float* logits,
                                     const int32_t* targets, float* parts) override;
  absl::Status CrossEntropyCombineImpl(const LossPartsShape& shape, const float* parts,
                                       const int32_t* targets, float* losses, float* lse) override;
  absl::Status AdamWUpdateImpl(const AdamWStep& step, float* params, const float* grads, float* m,
                               float* v, size_t n) override;
  absl::Status SgdMomentumUpdateImpl(const SgdStep& step, float* params, const float* grads,
                                     float* momentum, size_t n) override;
  absl::StatusOr<double> SumOfSquaresImpl(const float* x, size_t n) override;
  absl::StatusOr<std::vector<double>> SumsOfSquaresImpl(
      absl::Span<const DeviceSpan<const float>> xs) override;
  absl::Status ConvertFromF32Impl(const float* src, common::DType dtype, uint16_t* dst,
                                  size_t n) override;
  absl::Status ConvertToF32Impl(const uint16_t* src, common::DType dtype, float* dst,
                                size_t n) override;

  // As many threads as OpenBLAS would use by default (TakeOverBlasThreads).
  CpuBackend();

 private:
  explicit CpuBackend(int threads);

  absl::Status CrossEntropyRows(const char* op, const CrossEntropyShape& shape, const int32_t* targets,
                                int64_t classes,
                                absl::FunctionRef<absl::Status(const CrossEntropyShape&, int64_t)> part);

  std::unique_ptr<cpu::CpuThreadPool> pool_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_BACKEND_CPU_CPU_BACKEND_H_
