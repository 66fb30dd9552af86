// The CUDA events behind the backend's asynchronous copies and timers:
// EventCompletion is a HostTransfer's completion (an event recorded after the
// copy; Wait() may run on any thread), EventTimer a WorkTimer (two timing
// events on the compute stream). Only worker/backend/cuda/ includes this.
#ifndef SHARDLINE_WORKER_BACKEND_CUDA_CUDA_EVENTS_H_
#define SHARDLINE_WORKER_BACKEND_CUDA_CUDA_EVENTS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backend/host_transfer.h"
#include "worker/backend/work_timer.h"

namespace shardline::worker::cuda {

class EventCompletion final : public HostTransfer::Completion {
 public:
  // Owns `event` (destroyed with the completion, also while pending).
  EventCompletion(cudaEvent_t event, int device) : event_(event), device_(device) {}
  ~EventCompletion() override;
  EventCompletion(const EventCompletion&) = delete;
  EventCompletion& operator=(const EventCompletion&) = delete;

  absl::Status Wait() override;
  bool Done() override;
  void* native_handle() override { return event_; }

 private:
  const cudaEvent_t event_;
  const int device_;
};

class EventTimer final : public WorkTimer {
 public:
  EventTimer(cudaStream_t stream, int device) : stream_(stream), device_(device) {}
  ~EventTimer() override;
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  // Records the start; call once, before Stop().
  absl::Status Start();
  absl::Status Stop() override;
  absl::StatusOr<double> Seconds() override;

 private:
  const cudaStream_t stream_;
  const int device_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t end_ = nullptr;
  bool stopped_ = false;
};

}  // namespace shardline::worker::cuda

#endif  // SHARDLINE_WORKER_BACKEND_CUDA_CUDA_EVENTS_H_
