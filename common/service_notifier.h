// ServiceNotifier tells a service manager (systemd, Type=notify) how the
// daemon is doing: READY=1 once it serves, WATCHDOG=1 while its main loop
// runs (at half the unit's WatchdogSec), STOPPING=1 when it begins to shut
// down, and a STATUS= line a person reads in `systemctl status`. Outside
// systemd (no NOTIFY_SOCKET) every call does nothing. Uses libsystemd's
// sd_notify. Thread-compatible: the daemon's main thread calls it.
#ifndef SHARDLINE_COMMON_SERVICE_NOTIFIER_H_
#define SHARDLINE_COMMON_SERVICE_NOTIFIER_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shardline::common {

class ServiceNotifier {
 public:
  // Reads the watchdog period from the environment (WATCHDOG_USEC).
  ServiceNotifier();

  // READY=1 with `status`.
  void Ready(absl::string_view status);
  // STOPPING=1 with `status`.
  void Stopping(absl::string_view status);
  // STATUS=`status`.
  void Status(absl::string_view status);
  // Call from the main loop, as often as it turns: sends WATCHDOG=1 when half
  // the watchdog period has passed since the last one. A hung loop stops
  // sending, and systemd restarts the daemon.
  void MainLoopAlive(absl::Time now = absl::Now());

  // Zero when systemd asked for no watchdog.
  absl::Duration watchdog_period() const { return watchdog_; }

 private:
  void Send(const std::string& state);

  absl::Duration watchdog_ = absl::ZeroDuration();
  absl::Time last_ping_ = absl::InfinitePast();
};

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_SERVICE_NOTIFIER_H_
