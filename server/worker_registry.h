// WorkerRegistry knows the coordinator's workers: who registered with which
// capabilities, whose lease is alive, who is lost, and which job each one
// runs. Leases are renewed by heartbeats; ExpireLeases() marks lapsed ones
// lost and returns them. The clock is injectable for tests. Thread-safe.
#ifndef SHARDLINE_SERVER_WORKER_REGISTRY_H_
#define SHARDLINE_SERVER_WORKER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shardline/v1/coordinator.pb.h"

namespace shardline::server {

// Re-measuring an idle worker's GEMM rate (docs/operations.md, Rates that
// recover): asked once it has been idle this long, and its reports say it
// is slower than its probe; not again within its wait (this long at
// first; doubled each time its next job's reports contradicted a fresh
// probe, up to the most).
inline constexpr absl::Duration kComputeProbeIdle = absl::Seconds(30);
inline constexpr absl::Duration kComputeProbeWait = absl::Minutes(2);
inline constexpr absl::Duration kComputeProbeMaxWait = absl::Hours(1);

struct WorkerRecord {
  std::string id;
  std::string name;
  std::string secret;  // RegisterResponse.worker_secret: never logged or shown
  shardline::v1::WorkerCapabilities capabilities;
  absl::Time lease_expiry;
  bool lost = false;
  absl::Time lost_at;  // when it was taken for lost
  std::string job_id;  // empty when idle
  int64_t order = 0;   // registration order
  bool drained = false;  // out of service: never given a job
  absl::Time last_heartbeat;  // or registration
  // What its stage was doing at the last heartbeat (empty job_id: none).
  shardline::v1::StageActivity activity;
  // The model FLOP/s its job reports showed (a position's forward and
  // backward FLOPs over its busy seconds, a moving average), and how many
  // reports made it: what it achieves on real layers, which its GEMM probe
  // (one large square product) overstates, the more so the smaller the
  // model.
  double achieved_flops = 0;
  int64_t achieved_reports = 0;
  // The parameters per second its optimizer steps updated (the same moving
  // average), and how many reports made it.
  double optimizer_rate = 0;
  int64_t optimizer_reports = 0;
  // The rate to plan with (List() sets it): its GEMM rate scaled by the
  // median achieved / GEMM ratio of the live workers with an achieved rate
  // (1 with none): the prediction in the units the jobs show, the workers
  // compared by their probes (which layers a worker ran moves its achieved
  // rate by more than the probes' noise). Where a worker's own achieved
  // rate disagrees with that by more than kRateDisagreement, its achieved
  // rate: its reports say it is slower (or faster) than its probe said.
  double planning_flops = 0;
  // Its achieved rate once kMinAchievedReports made it (at most its GEMM
  // rate), else planning_flops: what the prediction of a step counts (the
  // cut uses planning_flops).
  double predicting_flops = 0;
  // Its optimizer rate once kMinAchievedReports made it, else the median of
  // the live workers' that have one; 0 with none (not counted).
  double planning_optimizer_rate = 0;
  // Since when it has had no job (its registration, or its last job's end).
  absl::Time idle_since;
  // Its GEMM rate measured again while idle: not asked before
  // compute_probe_after; compute_probe_wait the wait after an ask; a fresh
  // probe set its reports aside (compute_rebased: its next job's reports
  // tell whether that was right).
  absl::Time compute_probe_after = absl::InfinitePast();
  absl::Duration compute_probe_wait = kComputeProbeWait;
  bool compute_rebased = false;
};

// Reports before an achieved rate counts.
inline constexpr int64_t kMinAchievedReports = 3;
inline constexpr double kRateDisagreement = 0.3;
// The weight of a new report in the achieved rate's moving average.
inline constexpr double kAchievedRateWeight = 0.2;

// w.planning_flops where set, else its GEMM rate.
double PlanningFlops(const WorkerRecord& w);
// w.predicting_flops where set, else PlanningFlops(w).
double PredictingFlops(const WorkerRecord& w);

// "idle", "busy", "draining" (drained, its job still on it), "drained" or
// "lost", as shardctl and /metrics show it.
std::string StateOf(const WorkerRecord& worker);

// Which workers a link probe or check may use now, by name (as the
// coordinator's heartbeats ask; WorkerRegistry::Availability).
struct WorkerAvailability {
  std::set<std::string> busy;         // live, with a job
  std::set<std::string> absent;       // drained or lost
  std::set<std::string> unavailable;  // live, busy or drained: not probed now
  std::map<std::string, std::string> address;  // live workers' listen addresses
};

class WorkerRegistry {
 public:
  // A lost worker's record stays this long (ListWorkers shows it), and the
  // registry holds at most kMaxWorkers records: past that the longest-lost
  // one goes, and with none lost Register says RESOURCE_EXHAUSTED.
  static constexpr absl::Duration kLostRetention = absl::Minutes(10);
  static constexpr size_t kMaxWorkers = 4096;

  using Clock = std::function<absl::Time()>;
  // Worker ids are "worker-<n>.<incarnation_tag>" ("worker-<n>" without a
  // tag): the coordinator passes a tag unique to its incarnation, so an id
  // is never handed out twice across restarts, and a worker still holding
  // an earlier incarnation's id is told NOT_FOUND and registers again.
  explicit WorkerRegistry(absl::Duration lease, Clock clock = [] { return absl::Now(); },
                          std::string incarnation_tag = "")
      : lease_(lease), clock_(std::move(clock)), tag_(std::move(incarnation_tag)) {}

  absl::Duration lease() const { return lease_; }
  // The registry's clock: the coordinator's one clock for leases and the
  // deadlines measured against them (injectable for tests).
  absl::Time Now() const { return clock_(); }

  // A new worker id. INVALID_ARGUMENT for a bad name or capabilities;
  // ALREADY_EXISTS while a live worker has the name (a lost one is replaced).
  absl::StatusOr<std::string> Register(const std::string& name,
                                       const shardline::v1::WorkerCapabilities& capabilities);
  // Whether `secret` is the registration's (WorkerRecord::secret), in
  // constant time: NOT_FOUND for an unknown worker (it must register
  // again), UNAUTHENTICATED for another secret.
  absl::Status Authenticate(const std::string& worker_id, absl::string_view secret);
  // NOT_FOUND for an unknown or lost worker (it must register again).
  // `activity` is kept for the hang explainer (an absurd one is dropped).
  absl::Status Heartbeat(const std::string& worker_id,
                         const shardline::v1::StageActivity& activity = shardline::v1::StageActivity());
  // A worker leaving (shutting down): lost now, not a lease later. Its
  // record as it was; NOT_FOUND for an unknown or already lost worker.
  absl::StatusOr<WorkerRecord> Leave(const std::string& worker_id);
  // Marks workers whose lease has lapsed as lost; returns them. Forgets
  // those lost longer than kLostRetention.
  std::vector<WorkerRecord> ExpireLeases();
  // Marks those of `ids` silent for longer than `silence` (no heartbeat)
  // as lost before their lease lapses; returns them. For workers already
  // suspected: their neighbours' links broke.
  std::vector<WorkerRecord> ExpireSilent(const std::vector<std::string>& ids, absl::Duration silence);

  absl::StatusOr<WorkerRecord> Get(const std::string& worker_id);
  // The record of the worker named `name` (live or lost); NOT_FOUND.
  absl::StatusOr<WorkerRecord> GetByName(const std::string& name);
  // Every record, in registration order, each with its planning_flops.
  std::vector<WorkerRecord> List();
  // Live workers without a job, not drained, in registration order.
  std::vector<WorkerRecord> Idle();
  // A report of the model FLOP/s `worker_id` achieved in a step: moves its
  // achieved rate (one that is not positive and finite, or more than 100×
  // its GEMM rate, is dropped). Unknown workers are ignored.
  void NoteAchievedRate(const std::string& worker_id, double flops_per_second);
  // The same for the parameters per second its optimizer step updated
  // (dropped unless positive and finite).
  void NoteOptimizerRate(const std::string& worker_id, double parameters_per_second);
  // Whether the worker should measure its GEMM rate again now
  // (HeartbeatResponse.measure_compute): live, idle (not drained) for
  // kComputeProbeIdle, its reports say it is more than kRateDisagreement
  // slower than its probe (SlowerThanProbe), and its wait has passed.
  // Asking starts the wait.
  bool AskComputeProbe(const std::string& worker_id);
  // A fresh GEMM probe of the idle worker (validated by the caller): within
  // kRateDisagreement of the GEMM rate it registered with (or faster), its
  // machine is as fast as then (its registration's rate stays its probe): the job
  // reports that said it was slower are set aside (achieved and optimizer
  // rates start over) — true. Slower, its reports stand (its machine is
  // still busy; asked again after its wait) — false. Unknown, lost or busy
  // workers: false, nothing changes.
  bool NoteComputeProbe(const std::string& worker_id, double gemm_flops);
  // Takes the live worker named or identified `worker` out of service, or
  // (drained = false) back; its record. NOT_FOUND for no such live worker.
  absl::StatusOr<WorkerRecord> SetDrained(const std::string& worker, bool drained);
  void SetJob(const std::string& worker_id, const std::string& job_id);
  // Which workers probes may use now: kept until a worker registers,
  // leaves, is lost or forgotten, drained or undrained, or gets or ends a
  // job (every heartbeat asks; a listing of every record would cost each
  // O(workers)).
  std::shared_ptr<const WorkerAvailability> Availability();
  // How many records were forgotten since the registry began (lost ones
  // past kLostRetention or making room, or replaced by a registration of
  // the same name): what keeps a record of their names can drop them once
  // this moves.
  uint64_t forgotten();

 private:
  const absl::Duration lease_;
  const Clock clock_;
  const std::string tag_;
  // The median achieved / GEMM ratio of the live workers with an achieved
  // rate, 1 with none (List's).
  double MedianRatioLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Its achieved rate is known and more than kRateDisagreement below its
  // GEMM rate times `ratio` (the median).
  static bool SlowerThanProbe(const WorkerRecord& w, double ratio);

  absl::Mutex mu_;
  std::map<std::string, WorkerRecord> workers_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const WorkerAvailability> availability_ ABSL_GUARDED_BY(mu_);  // null: to build
  uint64_t forgotten_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_WORKER_REGISTRY_H_
