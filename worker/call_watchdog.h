// A CallWatchdog cancels a blocking gRPC call that stalls: each blocking
// operation is bracketed by Arm(limit) … Disarm(), and one that takes
// longer than its limit has the call's context cancelled (fired() tells
// why the call then failed). It also cancels the call soon after
// `abandon` turns true. One thread of its own, for the watchdog's life.
// Thread-safe.
#ifndef SHARDLINE_WORKER_CALL_WATCHDOG_H_
#define SHARDLINE_WORKER_CALL_WATCHDOG_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardline::worker {

class CallWatchdog {
 public:
  CallWatchdog(grpc::ClientContext& context, const std::atomic<bool>& abandon);
  ~CallWatchdog();

  void Arm(absl::Duration limit);
  void Disarm();
  // An armed operation outlived its limit and the call was cancelled.
  bool fired();

 private:
  void Watch();

  grpc::ClientContext& context_;
  const std::atomic<bool>& abandon_;
  absl::Mutex mu_;
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_CALL_WATCHDOG_H_
