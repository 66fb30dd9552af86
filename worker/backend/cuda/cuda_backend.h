// CudaBackend runs every Backend operation on one NVIDIA GPU: GEMMs through
// cuBLAS (FP32, no TF32, so results track the CPU oracle), everything else
// through the kernels in cuda_kernels.h. All work is queued on one stream the
// backend owns; copies to the host and Synchronize() wait for it. The
// asynchronous host copies use a second stream (a copy engine) and events:
// a copy to the host waits on the device for the work before it and runs
// alongside the work after it. Errors carry the CUDA error name and the
// file:line that saw them.
//
// This header keeps CUDA's own headers out of its includers (the stream and
// handle are forward-declared), so only worker/backend/cuda/ compiles against
// CUDA. Not thread-safe: use it from one thread at a time, any thread (each
// entry point makes the backend's device current for the calling thread).
#ifndef SHARDLINE_WORKER_BACKEND_CUDA_CUDA_BACKEND_H_
#define SHARDLINE_WORKER_BACKEND_CUDA_CUDA_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"

struct CUstream_st;
struct CUevent_st;
struct cublasContext;

namespace shardline::worker {

class CudaBackend final : public Backend {
 public:
  // FAILED_PRECONDITION when there is no usable CUDA device at all, NOT_FOUND
  // when `device` is past the last one.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device);
  // Devices this process can use; 0 when there is no driver or device.
  static int DeviceCount();

  ~CudaBackend() override;

  std::string name() const override;
  std::string description() const override { return description_; }
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override;
  absl::Status Synchronize() override;
  absl::StatusOr<int64_t> MemoryAvailable() override;
  absl::StatusOr<void*> AllocateHostStaging(size_t bytes) override;
  void FreeHostStaging(void* memory) override;
  bool host_staging_pinned() const override { return true; }
  absl::Status AwaitOnDevice(const HostTransfer& transfer) override;
  // Two timing events on the compute stream.
  absl::StatusOr<std::unique_ptr<WorkTimer>> StartTimer() override;

 protected:
  absl::Status CopyToDeviceImpl(const void* src, void* dst, size_t bytes) override;
  absl::Status CopyToHostImpl(const void* src, void* dst, size_t bytes) override;
  absl::Status CopyOnDeviceImpl(const void* src, void* dst, size_t bytes) override;
  absl::StatusOr<HostTransfer> CopyToHostAsyncImpl(const void* src, void* dst, size_t bytes) override;
  absl::StatusOr<HostTransfer> CopyToDeviceAsyncImpl(const void* src, void* dst, size_t bytes,
                                                      const HostTransfer* after) override;
  absl::StatusOr<HostTransfer> MarkQueued() override;
  absl::Status FillImpl(float* x, size_t n, float value) override;
  absl::Status GemmImpl(const GemmShape& shape, const float* a, const float* b, float* c) override;
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
  // Every reduction queued, one copy of the results, one wait.
  absl::StatusOr<std::vector<double>> SumsOfSquaresImpl(
      absl::Span<const DeviceSpan<const float>> xs) override;
  absl::Status ConvertFromF32Impl(const float* src, common::DType dtype, uint16_t* dst,
                                  size_t n) override;
  absl::Status ConvertToF32Impl(const uint16_t* src, common::DType dtype, float* dst,
                                size_t n) override;

 private:
  explicit CudaBackend(int device) : device_(device) {}
  // CUDA's current device belongs to the calling thread, and a backend is
  // driven from threads other than its creator (a worker's job thread):
  // kernels, cuBLAS calls, allocations and event records all need this
  // backend's device current, or they fail or land on another GPU.
  absl::Status MakeCurrent() const;
  // Reads and clears the kernels' error word; INVALID_ARGUMENT naming the
  // operations that met a bad id or target. Waits for the stream.
  absl::Status CheckKernelErrors();

  struct StreamDeleter {
    void operator()(CUstream_st* stream) const;
  };
  struct CublasDeleter {
    void operator()(cublasContext* handle) const;
  };
  struct EventDeleter {
    void operator()(CUevent_st* event) const;
  };
  // A fresh event recorded on `stream`, as a transfer's completion.
  absl::StatusOr<HostTransfer> RecordTransfer(CUstream_st* stream);

  const int device_;
  std::string description_;
  // Declared before the buffers, so destroyed after them. The destructor
  // drains the stream before anything is released.
  std::unique_ptr<CUstream_st, StreamDeleter> stream_owner_;
  std::unique_ptr<cublasContext, CublasDeleter> cublas_owner_;
  std::unique_ptr<CUstream_st, StreamDeleter> copy_stream_owner_;  // copies to the host
  std::unique_ptr<CUstream_st, StreamDeleter> upload_stream_owner_;  // copies to the device
  // Recorded on stream_ before each copy to the host; the copy stream waits
  // on it (a wait sees the record made before it, so one event serves all).
  std::unique_ptr<CUevent_st, EventDeleter> queued_owner_;
  CUstream_st* stream_ = nullptr;       // == stream_owner_.get()
  CUstream_st* copy_stream_ = nullptr;    // == copy_stream_owner_.get()
  CUstream_st* upload_stream_ = nullptr;  // == upload_stream_owner_.get()
  cublasContext* cublas_ = nullptr;  // == cublas_owner_.get()
  // Device scratch allocated once: the kernels' error word and the partial
  // sums of SumOfSquares.
  DeviceBuffer error_flag_;
  DeviceBuffer reduce_scratch_;
  DeviceBuffer sums_;  // SumsOfSquares' results, grown on demand
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_BACKEND_CUDA_CUDA_BACKEND_H_
