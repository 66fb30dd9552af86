#include "worker/backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/backend/cuda/cuda_events.h"
#include "worker/backend/cuda/cuda_kernels.h"
#include "worker/backend/cuda/cuda_status.h"

namespace shardline::worker {

int CudaBackend::DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device) {
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  if (probe != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device found (", cudaGetErrorString(probe), ")"));
  }
  if (device < 0 || device >= count) {
    return absl::NotFoundError(
        absl::StrCat("CUDA device ", device, " does not exist; this machine has ", count));
  }
  std::unique_ptr<CudaBackend> backend(new CudaBackend(device));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  int driver = 0, runtime = 0, cublas_version = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  backend->stream_owner_.reset(stream);
  backend->stream_ = stream;
  cublasHandle_t handle = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
  backend->cublas_owner_.reset(handle);
  backend->cublas_ = handle;
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream));
  cudaStream_t copy_stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
  backend->copy_stream_owner_.reset(copy_stream);
  backend->copy_stream_ = copy_stream;
  // A stream of its own: uploads must not queue behind copies to the host,
  // which wait for compute.
  cudaStream_t upload_stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&upload_stream, cudaStreamNonBlocking));
  backend->upload_stream_owner_.reset(upload_stream);
  backend->upload_stream_ = upload_stream;
  cudaEvent_t queued = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming));
  backend->queued_owner_.reset(queued);
  // Plain FP32 GEMMs (no TF32): the CPU oracle is the reference.
  CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
  CUBLAS_RETURN_IF_ERROR(cublasGetVersion(handle, &cublas_version));
  backend->description_ = absl::StrCat(
      "cuda:", device, " (", prop.name, ", sm_", prop.major, prop.minor, ", ",
      prop.totalGlobalMem >> 20, " MiB, driver ", driver / 1000, ".", (driver % 1000) / 10,
      ", runtime ", runtime / 1000, ".", (runtime % 1000) / 10, ", cuBLAS ", cublas_version, ")");
  ASSIGN_OR_RETURN(backend->error_flag_, backend->Allocate(sizeof(unsigned)));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(backend->error_flag_.data(), 0, sizeof(unsigned), stream));
  ASSIGN_OR_RETURN(backend->reduce_scratch_,
                   backend->Allocate((cuda::kSumOfSquaresBlocks + 1) * sizeof(double)));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return backend;
}

void CudaBackend::StreamDeleter::operator()(CUstream_st* stream) const {
  cudaStreamDestroy(stream);
}

void CudaBackend::CublasDeleter::operator()(cublasContext* handle) const { cublasDestroy(handle); }

void CudaBackend::EventDeleter::operator()(CUevent_st* event) const { cudaEventDestroy(event); }

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  // Queued kernels and copies may still use the buffers the members free.
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
  if (upload_stream_ != nullptr) cudaStreamSynchronize(upload_stream_);
}

std::string CudaBackend::name() const { return absl::StrCat("cuda:", device_); }

absl::Status CudaBackend::MakeCurrent() const {
  int current = -1;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
  if (current != device_) CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  return absl::OkStatus();
}

absl::StatusOr<HostTransfer> CudaBackend::MarkQueued() {
  RETURN_IF_ERROR(MakeCurrent());
  return RecordTransfer(stream_);
}

absl::StatusOr<DeviceBuffer> CudaBackend::Allocate(size_t bytes) {
  RETURN_IF_ERROR(MakeCurrent());
  if (bytes == 0) return DeviceBuffer();
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  return DeviceBuffer(p, bytes, [device = device_](void* q) {
    cudaSetDevice(device);
    cudaFree(q);
  });
}

absl::Status CudaBackend::CheckKernelErrors() {
  unsigned flag = 0;
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&flag, error_flag_.data(), sizeof(flag), cudaMemcpyDeviceToHost, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (flag == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(error_flag_.data(), 0, sizeof(unsigned), stream_));
  std::vector<std::string> ops;
  if (flag & cuda::kErrorFlagEmbeddingForward) ops.push_back("EmbeddingForward");
  if (flag & cuda::kErrorFlagEmbeddingBackward) ops.push_back("EmbeddingBackward");
  if (flag & cuda::kErrorFlagCrossEntropyForward) ops.push_back("CrossEntropyForward");
  if (flag & cuda::kErrorFlagCrossEntropyBackward) ops.push_back("CrossEntropyBackward");
  if (flag & cuda::kErrorFlagCrossEntropyParts) ops.push_back("CrossEntropyParts");
  return absl::InvalidArgumentError(absl::StrCat(
      "an id or target outside [0, vocab) reached ", absl::StrJoin(ops, ", "),
      " since the last synchronisation; the rows holding it were skipped"));
}

absl::StatusOr<int64_t> CudaBackend::MemoryAvailable() {
  RETURN_IF_ERROR(MakeCurrent());
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}

absl::StatusOr<void*> CudaBackend::AllocateHostStaging(size_t bytes) {
  // Also keeps the allocation from creating a context on device 0.
  RETURN_IF_ERROR(MakeCurrent());
  void* memory = nullptr;
  // Portable: pinned for every device and context of this process.
  CUDA_RETURN_IF_ERROR(cudaHostAlloc(&memory, std::max<size_t>(bytes, 1), cudaHostAllocPortable));
  return memory;
}

void CudaBackend::FreeHostStaging(void* memory) {
  cudaSetDevice(device_);
  if (cudaError_t e = cudaFreeHost(memory); e != cudaSuccess) {
    LOG(WARNING) << "cudaFreeHost: " << cudaGetErrorString(e);
  }
}

absl::Status CudaBackend::Synchronize() {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return CheckKernelErrors();
}

absl::Status CudaBackend::CopyToDeviceImpl(const void* src, void* dst, size_t bytes) {
  RETURN_IF_ERROR(MakeCurrent());
  // Synchronous, so the caller may reuse `src` at once whatever memory it is
  // (from a pinned staging slot the copy runs at the bus's speed).
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToHostImpl(const void* src, void* dst, size_t bytes) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return CheckKernelErrors();
}

absl::StatusOr<HostTransfer> CudaBackend::RecordTransfer(CUstream_st* stream) {
  cudaEvent_t event = nullptr;
  // Blocking: the thread that waits for a transfer (a stage's sender) sleeps
  // instead of spinning on a core the host's networking needs.
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync));
  auto completion = std::make_shared<cuda::EventCompletion>(event, device_);
  CUDA_RETURN_IF_ERROR(cudaEventRecord(event, stream));
  return HostTransfer(std::move(completion));
}

absl::StatusOr<HostTransfer> CudaBackend::CopyToHostAsyncImpl(const void* src, void* dst,
                                                              size_t bytes) {
  RETURN_IF_ERROR(MakeCurrent());
  // The copy stream starts after the work queued so far; the compute stream
  // goes on with what is queued next.
  CUDA_RETURN_IF_ERROR(cudaEventRecord(queued_owner_.get(), stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, queued_owner_.get(), 0));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, copy_stream_));
  return RecordTransfer(copy_stream_);
}

absl::StatusOr<HostTransfer> CudaBackend::CopyToDeviceAsyncImpl(const void* src, void* dst,
                                                                size_t bytes,
                                                                const HostTransfer* after) {
  RETURN_IF_ERROR(MakeCurrent());
  if (after == nullptr) {
    // On the compute stream: the work before it may still read what `dst`
    // held, and the work after it reads the values.
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    return RecordTransfer(stream_);
  }
  // On the upload stream, once `after` is done, alongside the compute queued
  // before it; the compute queued from now on waits for the copy.
  if (after->native_handle() != nullptr) {
    CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(upload_stream_, static_cast<cudaEvent_t>(after->native_handle()), 0));
  }
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, upload_stream_));
  ASSIGN_OR_RETURN(HostTransfer transfer, RecordTransfer(upload_stream_));
  RETURN_IF_ERROR(AwaitOnDevice(transfer));
  return transfer;
}

absl::StatusOr<std::unique_ptr<WorkTimer>> CudaBackend::StartTimer() {
  RETURN_IF_ERROR(MakeCurrent());
  auto timer = std::make_unique<cuda::EventTimer>(stream_, device_);
  RETURN_IF_ERROR(timer->Start());
  return std::unique_ptr<WorkTimer>(std::move(timer));
}

absl::Status CudaBackend::AwaitOnDevice(const HostTransfer& transfer) {
  RETURN_IF_ERROR(MakeCurrent());
  if (transfer.native_handle() == nullptr) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(transfer.native_handle()), 0));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyOnDeviceImpl(const void* src, void* dst, size_t bytes) {
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}

}  // namespace shardline::worker
