// LinkPace tells a link that slowed during a job from noise, as StepPace
// does for steps, from what the receiving end of each of the job's streams
// reports (ReportStepRequest.wire_paces: the bytes of frames its neighbour
// sent back to back, over the time they took to arrive). A step counts when
// at least kMinSeconds of frames were timed in it; the epoch's rate is the
// median of its first PaceWindow::kCount such steps, and the link has slowed
// while the median of the last kCount (these included) stays below
// 1 / kSlowdown of its probe's figure (Below; JobManager), or, never probed,
// of the epoch's start (slowed). A pace above the probe's is not the wire's
// (frames that waited in a busy receiver's socket buffer read as if they
// arrived together), so the probe's figure is the reference where there is
// one; a link already slow when the epoch began (a re-plan moved onto it)
// shows as below it too.
//
// LinkPaces keeps one per direction (by the two workers' ids) for an epoch.
// Neither is thread-safe (a RunningJob's, under the JobManager's lock).
#ifndef SHARDLINE_SERVER_LINK_PACE_H_
#define SHARDLINE_SERVER_LINK_PACE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "server/pace_window.h"

namespace shardline::server {

class LinkPace {
 public:
  // Three times slower: a receiver short of CPU (a busy or capped machine)
  // takes its frames up to about twice as slowly as its wire brings them
  // (bench_heterogeneous: 0.2 CPU on 1 Gbit/s), while the slowdowns worth
  // a move are tenfold and more.
  static constexpr double kSlowdown = 3.0;
  static constexpr double kMinSeconds = 0.002;

  // A step's timed frames: `bytes` in `seconds`.
  void Note(int64_t bytes, double seconds);

  // Bytes per second; 0 until known.
  double baseline() const { return rates_.baseline(); }
  double recent() const { return rates_.recent(); }
  bool slowed() const { return Below(baseline()); }
  // The last kCount steps' median is below 1 / kSlowdown of
  // `bytes_per_second` (0: never).
  bool Below(double bytes_per_second) const {
    const double now = recent();
    return bytes_per_second > 0 && now > 0 && now * kSlowdown < bytes_per_second;
  }

  // Whether the link table was told of the slowdown (JobManager's note).
  bool told = false;

 private:
  PaceWindow rates_{/*after_baseline=*/false};
};

class LinkPaces {
 public:
  // The direction's pace, created on its first report.
  LinkPace& At(const std::string& from_worker_id, const std::string& to_worker_id) {
    return paces_[{from_worker_id, to_worker_id}];
  }
  // A new epoch.
  void Reset() { paces_.clear(); }

 private:
  std::map<std::pair<std::string, std::string>, LinkPace> paces_;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_LINK_PACE_H_
