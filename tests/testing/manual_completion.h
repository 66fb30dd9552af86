// ManualCompletion is a HostTransfer in flight that a test (or a test
// backend) finishes by hand, with a status. It counts the Wait() calls that
// found it unfinished, so a test can tell, without sleeping, that a thread is
// now waiting for it (AwaitBlockedWait) or that nothing ever waited
// (blocked_waits() == 0); and it can refuse to block (RefuseToBlock): such a
// Wait() returns FAILED_PRECONDITION at once, so a test that proves "this
// call does not wait for the copy" fails instead of hanging. Thread-safe.
#ifndef SHARDLINE_TESTS_TESTING_MANUAL_COMPLETION_H_
#define SHARDLINE_TESTS_TESTING_MANUAL_COMPLETION_H_

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/backend/host_transfer.h"

namespace shardline::testing {

class ManualCompletion final : public worker::HostTransfer::Completion {
 public:
  void Finish(absl::Status status = absl::OkStatus()) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    done_ = true;
  }
  absl::Status Wait() override {
    absl::MutexLock lock(&mu_);
    if (!done_) {
      ++blocked_waits_;
      if (refuse_to_block_) return absl::FailedPreconditionError("waited for a copy the test holds back");
    }
    mu_.Await(absl::Condition(&done_));
    return status_;
  }
  bool Done() override {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  void* native_handle() override { return nullptr; }

  // Wait() calls that found the transfer unfinished (blocked or refused).
  int blocked_waits() {
    absl::MutexLock lock(&mu_);
    return blocked_waits_;
  }
  // True once some Wait() has found it unfinished; false after `timeout`.
  bool AwaitBlockedWait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto waited = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return blocked_waits_ > 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&waited), timeout);
  }
  void RefuseToBlock(bool refuse) {
    absl::MutexLock lock(&mu_);
    refuse_to_block_ = refuse;
  }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  int blocked_waits_ ABSL_GUARDED_BY(mu_) = 0;
  bool refuse_to_block_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardline::testing

#endif  // SHARDLINE_TESTS_TESTING_MANUAL_COMPLETION_H_
