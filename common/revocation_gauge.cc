#include "common/revocation_gauge.h"

#include <limits>
#include <memory>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace shardline::common {

void AddRevocationGauge(MetricsRegistry& metrics, std::shared_ptr<const TransportSecurity> security) {
  if (security == nullptr || !security->checks_revocation()) return;
  Gauge& gauge = metrics.GetGauge(
      "shardline_tls_crl_next_update_timestamp_seconds",
      "when the revocation lists of --tls_crl_dir expire (unix time; 0: unreadable or a CA has none): then every "
      "certificate of that CA is refused");
  Counter& refused = metrics.GetCounter(
      "shardline_tls_revoked_calls_total",
      "calls refused because the client's certificate was revoked, on connections opened before the revocation "
      "(new ones fail in the TLS handshake)");
  // Two scrapes at once must not both add the same calls.
  auto serial = std::make_shared<absl::Mutex>();
  metrics.AddRefresh([&gauge, &refused, serial, security = std::move(security)] {
    absl::MutexLock lock(serial.get());
    refused.Add(static_cast<double>(security->RevokedCallsRefused()) - refused.value());
    const absl::Time next = security->RevocationNextUpdate();
    gauge.Set(next == absl::InfinitePast()     ? 0
              : next == absl::InfiniteFuture() ? std::numeric_limits<double>::infinity()
                                               : absl::ToDoubleSeconds(next - absl::UnixEpoch()));
  });
}

}  // namespace shardline::common
