// A CallWatchdog cancels a blocking gRPC call that stalls: each blocking
// operation is bracketed by Arm(limit) … Disarm(), and one that takes
// longer than its limit has the call's context cancelled (fired() tells
// why the call then failed). It also cancels the call soon after
// `abandon` turns true (where given). One thread of its own, for the
// watchdog's life. Streams of unknown length (a model's weights) take it
// instead of a deadline for the whole call: each piece must come in time.
// Thread-safe.
#ifndef SHARDLINE_COMMON_CALL_WATCHDOG_H_
#define SHARDLINE_COMMON_CALL_WATCHDOG_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardline::common {

class CallWatchdog {
 public:
  CallWatchdog(grpc::ClientContext& context, const std::atomic<bool>& abandon);
  explicit CallWatchdog(grpc::ClientContext& context) : CallWatchdog(context, never_) {}
  ~CallWatchdog();

  void Arm(absl::Duration limit);
  void Disarm();
  // An armed operation outlived its limit and the call was cancelled.
  bool fired();

 private:
  void Watch();

  const std::atomic<bool> never_{false};
  grpc::ClientContext& context_;
  const std::atomic<bool>& abandon_;
  absl::Mutex mu_;
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_CALL_WATCHDOG_H_
