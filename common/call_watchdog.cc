#include "common/call_watchdog.h"

namespace shardline::common {

CallWatchdog::CallWatchdog(grpc::ClientContext& context, const std::atomic<bool>& abandon)
    : context_(context), abandon_(abandon), thread_([this] { Watch(); }) {}

CallWatchdog::~CallWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  thread_.join();
}

void CallWatchdog::Arm(absl::Duration limit) {
  absl::MutexLock lock(&mu_);
  deadline_ = absl::Now() + limit;
}

void CallWatchdog::Disarm() {
  absl::MutexLock lock(&mu_);
  deadline_ = absl::InfiniteFuture();
}

bool CallWatchdog::fired() {
  absl::MutexLock lock(&mu_);
  return fired_;
}

void CallWatchdog::Watch() {
  absl::MutexLock lock(&mu_);
  while (!done_) {
    // Wakes for done_, or every 20 ms to look at the deadline and abandon_.
    mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Milliseconds(20));
    if (done_) return;
    const bool late = absl::Now() > deadline_;
    if ((late || abandon_) && !cancelled_) {
      fired_ = late;
      cancelled_ = true;
      context_.TryCancel();
    }
  }
}

}  // namespace shardline::common
