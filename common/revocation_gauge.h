// The revocation lists' next update as a Prometheus gauge, for an alert
// before they expire (a daemon with --tls_crl_dir then refuses every peer
// of that CA): shardline_tls_crl_next_update_timestamp_seconds, re-read at
// every scrape; 0 where the lists cannot be read or a CA has none; and the
// calls refused for a revoked certificate on a connection opened before
// (shardline_tls_revoked_calls_total: someone still holds one). Only where
// `security` checks revocation lists.
#ifndef SHARDLINE_COMMON_REVOCATION_GAUGE_H_
#define SHARDLINE_COMMON_REVOCATION_GAUGE_H_

#include <memory>

#include "common/metrics_registry.h"
#include "common/transport_security.h"

namespace shardline::common {

void AddRevocationGauge(MetricsRegistry& metrics, std::shared_ptr<const TransportSecurity> security);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_REVOCATION_GAUGE_H_
