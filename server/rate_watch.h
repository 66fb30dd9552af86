// RateWatch tells when a worker a running job could use got clearly faster
// during the job's epoch: its planning rate (WorkerRegistry::List) above
// kRise times the lowest it showed since the epoch settled, and above
// kRecheck times what it was when a move was last weighed (a rate that
// rises over many reports is weighed again as it goes on rising, not once
// at its first step). A worker that slowed and recovered (its machine was
// busy a while) shows so as its job's reports rise again, or, idle since a
// re-plan moved the job off it, once a fresh GEMM probe set its slower
// reports aside (WorkerRegistry::NoteComputeProbe).
//
// The lows start kSettleSteps into the epoch, not at its start: a worker's
// achieved rate is a moving average that needs about that many reports to
// leave its previous layout's load, and a lighter load reads faster by
// itself where the worker's CPU is shared or capped (short passes run in
// the slack between another tenant's slices or within a quota's period),
// which is no recovery: a move back onto it would be slow again. Not
// thread-safe (a RunningJob's, under the JobManager's lock).
#ifndef SHARDLINE_SERVER_RATE_WATCH_H_
#define SHARDLINE_SERVER_RATE_WATCH_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "server/worker_registry.h"

namespace shardline::server {

class RateWatch {
 public:
  static constexpr double kRise = 1 + kRateDisagreement;
  static constexpr double kRecheck = 1.05;
  // After kSettleSteps reports at kAchievedRateWeight, under 11% of an
  // earlier rate is left in the average: less than kRise for any change.
  static constexpr int kSettleSteps = 10;

  // An epoch begins at `first_step`: nothing is watched until kSettleSteps
  // later.
  void Start(int64_t first_step);
  // Notes `workers`' rates (the job's and the idle ones) at `step` (a
  // worker not seen since the epoch settled starts its low); the first that
  // rose clearly above its low and past its weighed rate, for people: "b
  // got faster (2.0 → 8.0 GFLOP/s)"; empty if none did.
  std::string Rose(int64_t step, const std::vector<WorkerRecord>& workers);
  // A move was weighed on `workers`' rates now (and not made).
  void Weighed(const std::vector<WorkerRecord>& workers);

 private:
  struct Seen {
    double low = 0;      // since the epoch settled
    double weighed = 0;  // at the last Weighed (its first look's at first)
  };
  int64_t settle_step_ = 0;
  std::map<std::string, Seen> seen_;  // by worker id
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_RATE_WATCH_H_
