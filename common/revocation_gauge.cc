#include "common/revocation_gauge.h"

#include <limits>
#include <utility>

namespace shardline::common {

void AddRevocationGauge(MetricsRegistry& metrics, std::shared_ptr<const TransportSecurity> security) {
  if (security == nullptr || !security->checks_revocation()) return;
  Gauge& gauge = metrics.GetGauge(
      "shardline_tls_crl_next_update_timestamp_seconds",
      "when the revocation lists of --tls_crl_dir expire (unix time; 0: unreadable or a CA has none): then every "
      "certificate of that CA is refused");
  metrics.AddRefresh([&gauge, security = std::move(security)] {
    const absl::Time next = security->RevocationNextUpdate();
    gauge.Set(next == absl::InfinitePast()     ? 0
              : next == absl::InfiniteFuture() ? std::numeric_limits<double>::infinity()
                                               : absl::ToDoubleSeconds(next - absl::UnixEpoch()));
  });
}

}  // namespace shardline::common
