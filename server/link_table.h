// LinkTable keeps what workers measured of the links between them (each
// direction of each pair of worker names: bandwidth with its spread, round
// trip) and the probes still to run. Probes are run by one worker at a
// time, so that two probes never share a wire and skew each other: Claim
// hands a worker its queued targets only when no other worker holds a
// claim (a claim not reported within kClaimTimeout lapses). A measurement
// older than kStaleAfter is stale: shown, marked, and re-probed when asked.
// A link a running job finds slower than before (Observe) keeps that rate
// beside its probe's until it is probed again.
// Pure bookkeeping, no I/O; the clock is injectable for tests. Thread-safe.
#ifndef SHARDLINE_SERVER_LINK_TABLE_H_
#define SHARDLINE_SERVER_LINK_TABLE_H_

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardline::server {

struct LinkRecord {
  std::string from;
  std::string to;
  double bytes_per_second = 0;
  double spread = 0;  // (fastest − slowest) / median of its transfers
  double rtt_seconds = 0;
  absl::Time measured_at;
  std::string error;  // the last probe failed (the figures are the last good ones, if any)
  // What a job's own transfers showed once the link slowed while it ran
  // (server/link_pace.h): estimates take it where it is below the probe's
  // figure, until the next probe (queued by Observe) replaces the record.
  double observed_bytes_per_second = 0;  // 0: nothing observed
  absl::Time observed_at;
  std::string observed_in;  // the job's id
};

class LinkTable {
 public:
  static constexpr absl::Duration kStaleAfter = absl::Minutes(10);
  static constexpr absl::Duration kClaimTimeout = absl::Seconds(60);

  using Clock = std::function<absl::Time()>;
  explicit LinkTable(Clock clock = [] { return absl::Now(); }) : clock_(std::move(clock)) {}

  // Queues both directions between `name` and each of `peers` (a worker
  // joined: its links to everyone are unknown).
  void Joined(const std::string& name, const std::vector<std::string>& peers);
  // Queues every direction between every two of `names`; how many were
  // not queued already.
  int Request(const std::vector<std::string>& names);
  // The peers `name` should probe now, marked claimed: empty unless it has
  // queued targets and no other worker holds a live claim.
  std::vector<std::string> Claim(const std::string& name);
  // `from`'s measurements (LinkRecord::from and measured_at are set here):
  // each ends its queued probe; the claim ends.
  void Record(const std::string& from, std::vector<LinkRecord> links);
  // A job's streams saw the link from `from` to `to` slow down to
  // `bytes_per_second` (LinkRecord::observed_bytes_per_second); a probe of
  // it is queued, which `from` runs once it is idle.
  void Observe(const std::string& from, const std::string& to, double bytes_per_second, const std::string& job_id);
  // The link carries its old rate again: its observation goes.
  void ForgetObserved(const std::string& from, const std::string& to);
  // Forgets links and probes naming a worker not in `known`.
  void Retain(const std::set<std::string>& known);

  std::vector<LinkRecord> Links() const;  // by (from, to)
  std::optional<LinkRecord> Get(const std::string& from, const std::string& to) const;
  bool Stale(const LinkRecord& link) const { return clock_() - link.measured_at > kStaleAfter; }
  int pending() const;
  absl::Time Now() const { return clock_(); }

 private:
  using Direction = std::pair<std::string, std::string>;  // (from, to)
  Clock clock_;
  mutable absl::Mutex mu_;
  std::map<Direction, LinkRecord> links_ ABSL_GUARDED_BY(mu_);
  std::set<Direction> queued_ ABSL_GUARDED_BY(mu_);
  std::string claimed_by_ ABSL_GUARDED_BY(mu_);  // empty: no claim
  absl::Time claimed_at_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_LINK_TABLE_H_
