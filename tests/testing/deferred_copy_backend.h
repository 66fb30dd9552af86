// DeferredCopyBackend is the CPU backend with a copy engine of its own, as a
// GPU has: CopyToHostAsync copies on a background thread some time later,
// and CopyToDeviceAsync copies at once but reports the host memory free only
// later. A pipeline run on it checks, without a GPU, the protocol a CUDA
// stage follows: nothing reads a tensor on the host before its copy is done,
// nothing overwrites device memory a copy still reads (AwaitOnDevice), and
// host memory a copy reads stays alive and unchanged until the copy is done
// (it is read again when the copy finishes: under ASan a buffer freed early
// is a use-after-free, and a changed one counts in host_changes_seen()). It
// also counts copies to the device from memory that did not come from
// AllocateHostStaging: on CUDA, such a copy makes the host wait. Hold()
// stops copies from finishing, so that a test proves without timing that a
// call does not wait for one.
#ifndef SHARDLINE_TESTS_TESTING_DEFERRED_COPY_BACKEND_H_
#define SHARDLINE_TESTS_TESTING_DEFERRED_COPY_BACKEND_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tests/testing/manual_completion.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace shardline::testing {

class DeferredCopyBackend final : public worker::CpuBackend {
 public:
  // Each copy finishes `delay` after it was queued, in queueing order.
  explicit DeferredCopyBackend(absl::Duration delay);
  // Finishes the copies still queued.
  ~DeferredCopyBackend() override;

  // Copies finished on the background thread so far.
  int deferred_copies();
  // Copies to the device whose host memory changed before they finished.
  int host_changes_seen();
  // Copies to the device from host memory outside AllocateHostStaging's.
  int uploads_from_pageable();
  // From Hold() until Release() no copy finishes (but for one the copy
  // thread may already have taken), and a Wait() for a copy queued
  // meanwhile returns FAILED_PRECONDITION at once instead of blocking,
  // counted in waits_while_held(): a call that waited fails, it does not hang.
  void Hold();
  void Release();
  int waits_while_held();

  absl::StatusOr<void*> AllocateHostStaging(size_t bytes) override;
  void FreeHostStaging(void* memory) override;

 protected:
  absl::StatusOr<worker::HostTransfer> CopyToHostAsyncImpl(const void* src, void* dst,
                                                           size_t bytes) override;
  absl::StatusOr<worker::HostTransfer> CopyToDeviceAsyncImpl(const void* src, void* dst,
                                                             size_t bytes,
                                                             const worker::HostTransfer* after) override;

 private:
  struct Pending {
    absl::Time due;
    const void* src = nullptr;  // null: nothing to copy, only to finish
    void* dst = nullptr;
    size_t bytes = 0;
    // A copy to the device: the host memory it read, and what it held.
    const void* read = nullptr;
    uint64_t read_hash = 0;
    std::shared_ptr<ManualCompletion> completion;
  };
  worker::HostTransfer Queue(Pending pending);
  void Run();

  const absl::Duration delay_;
  absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<ManualCompletion>> queued_while_held_ ABSL_GUARDED_BY(mu_);
  int released_waits_ ABSL_GUARDED_BY(mu_) = 0;  // refused waits of copies released since
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  int host_changes_ ABSL_GUARDED_BY(mu_) = 0;
  int pageable_uploads_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<const char*, size_t> staging_ ABSL_GUARDED_BY(mu_);  // start → bytes
  std::thread thread_;
};

}  // namespace shardline::testing

#endif  // SHARDLINE_TESTS_TESTING_DEFERRED_COPY_BACKEND_H_
