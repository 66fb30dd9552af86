#include "common/service_notifier.h"

#include <systemd/sd-daemon.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace shardline::common {

ServiceNotifier::ServiceNotifier() {
  uint64_t usec = 0;
  // 0 keeps WATCHDOG_USEC for any child; > 0 when the watchdog is on.
  if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) watchdog_ = absl::Microseconds(usec);
}

void ServiceNotifier::Ready(absl::string_view status) {
  Send(absl::StrCat("READY=1\nSTATUS=", status));
  if (watchdog_ > absl::ZeroDuration()) MainLoopAlive();
}

void ServiceNotifier::Stopping(absl::string_view status) { Send(absl::StrCat("STOPPING=1\nSTATUS=", status)); }

void ServiceNotifier::Status(absl::string_view status) { Send(absl::StrCat("STATUS=", status)); }

void ServiceNotifier::MainLoopAlive(absl::Time now) {
  if (watchdog_ <= absl::ZeroDuration() || now - last_ping_ < watchdog_ / 2) return;
  last_ping_ = now;
  Send("WATCHDOG=1");
}

void ServiceNotifier::Send(const std::string& state) {
  // < 0: the socket named by NOTIFY_SOCKET failed; 0: not under a manager.
  if (const int r = sd_notify(0, state.c_str()); r < 0) {
    LOG_EVERY_N(WARNING, 100) << "sd_notify failed: " << -r;
  }
}

}  // namespace shardline::common
