// StagingPool is a bounded set of equal host buffers ("slots") that stage
// link tensors live in on their way to and from the wire, allocated once
// when the pool is made: page-locked (pinned) memory on CUDA workers, so
// that device copies into and out of a slot run at the bus's speed, plain
// memory elsewhere. A slot is handed out as a StagingSlot and goes back to
// the pool when that handle is destroyed, on whichever thread (a frame
// aliasing it may be released by gRPC after the link is gone, so slots
// keep their pool alive). Thread-safe.
#ifndef SHARDLINE_WORKER_TRANSPORT_STAGING_POOL_H_
#define SHARDLINE_WORKER_TRANSPORT_STAGING_POOL_H_

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/backend/backend.h"

namespace shardline::worker::transport {

// Where a pool's memory comes from.
struct HostMemory {
  std::function<absl::StatusOr<void*>(size_t bytes)> allocate;
  std::function<void(void*)> release;
  bool pinned = false;
};
// 64-byte aligned memory from the C++ heap.
HostMemory PlainHostMemory();
// `backend`'s staging memory (pinned on CUDA); the backend must outlive
// every pool made from it.
HostMemory HostStagingMemory(Backend& backend);

class StagingPool;

class StagingSlot {
 public:
  StagingSlot() = default;
  StagingSlot(StagingSlot&& other) noexcept;
  StagingSlot& operator=(StagingSlot&& other) noexcept;
  ~StagingSlot();

  void* data() const { return memory_; }
  size_t bytes() const;
  explicit operator bool() const { return memory_ != nullptr; }

 private:
  friend class StagingPool;
  StagingSlot(std::shared_ptr<StagingPool> pool, void* memory) : pool_(std::move(pool)), memory_(memory) {}
  std::shared_ptr<StagingPool> pool_;
  void* memory_ = nullptr;
};

class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  // All `slots` × `slot_bytes` are allocated here; RESOURCE_EXHAUSTED if
  // the memory cannot be had.
  static absl::StatusOr<std::shared_ptr<StagingPool>> Create(size_t slot_bytes, int slots,
                                                             HostMemory memory);
  ~StagingPool();

  // A free slot if there is one now (callers never wait for one: the heap
  // takes a tensor that finds the pool empty).
  std::optional<StagingSlot> TryAcquire();

  size_t slot_bytes() const { return slot_bytes_; }
  int slots() const { return static_cast<int>(all_.size()); }
  bool pinned() const { return memory_.pinned; }
  int free_slots();
  // Most slots handed out at once so far.
  int peak_in_use();

 private:
  friend class StagingSlot;
  StagingPool(size_t slot_bytes, HostMemory memory) : slot_bytes_(slot_bytes), memory_(std::move(memory)) {}
  void Return(void* memory);
  StagingSlot Take() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t slot_bytes_;
  const HostMemory memory_;
  std::vector<void*> all_;
  absl::Mutex mu_;
  std::vector<void*> free_ ABSL_GUARDED_BY(mu_);
  int peak_in_use_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_WORKER_TRANSPORT_STAGING_POOL_H_
