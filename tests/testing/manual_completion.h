// ManualCompletion is a HostTransfer in flight that a test (or a test
// backend) finishes by hand, with a status.
#ifndef SHARDLINE_TESTS_TESTING_MANUAL_COMPLETION_H_
#define SHARDLINE_TESTS_TESTING_MANUAL_COMPLETION_H_

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
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
    mu_.Await(absl::Condition(&done_));
    return status_;
  }
  bool Done() override {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  void* native_handle() override { return nullptr; }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::testing

#endif  // SHARDLINE_TESTS_TESTING_MANUAL_COMPLETION_H_
