#include "worker/backend/cuda/cuda_events.h"

#include "worker/backend/cuda/cuda_status.h"

namespace shardline::worker::cuda {

EventCompletion::~EventCompletion() { cudaEventDestroy(event_); }

absl::Status EventCompletion::Wait() {
  // The waiting thread may never have used this device.
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
  return absl::OkStatus();
}

bool EventCompletion::Done() { return cudaEventQuery(event_) != cudaErrorNotReady; }

EventTimer::~EventTimer() {
  if (start_ != nullptr) cudaEventDestroy(start_);
  if (end_ != nullptr) cudaEventDestroy(end_);
}

absl::Status EventTimer::Start() {
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&start_, cudaEventBlockingSync));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&end_, cudaEventBlockingSync));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(start_, stream_));
  return absl::OkStatus();
}

absl::Status EventTimer::Stop() {
  if (stopped_) return absl::FailedPreconditionError("the timer was already stopped");
  stopped_ = true;
  CUDA_RETURN_IF_ERROR(cudaEventRecord(end_, stream_));
  return absl::OkStatus();
}

absl::StatusOr<double> EventTimer::Seconds() {
  if (!stopped_) return absl::FailedPreconditionError("the timer is still running");
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(end_));
  float ms = 0.0f;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_, end_));
  return ms / 1e3;
}

}  // namespace shardline::worker::cuda
