// JobManager is the coordinator's job state machine: PENDING until enough
// idle workers exist, then planned and assigned (a new plan epoch) and
// RUNNING; step reports from the stages are aggregated; shards go to the
// WeightStore; the job SUCCEEDS once every stage finished the last step and
// its weights are committed, and FAILS (naming the stage and worker) when a
// stage reports an error or a worker's lease lapses. Every message from a
// worker is checked against the job's current epoch and plan. Watchers get
// the statuses of the last completed steps, then the job's status after
// every change. Thread-safe.
//
// A job with parallel.data_parallel = d runs on a p × d grid of positions
// (stage s, replica r; position r·p + s): d copies of one pipeline cut,
// planned on the slowest and smallest worker of each stage. A step is
// complete when every position reported it; its loss is the replicas'
// last-stage losses added in rank order. Replica 0 sends the shards; at
// checkpoint steps every replica reports its shard's digest, and replicas
// that disagree fail the job.
#ifndef SHARDLINE_SERVER_JOB_MANAGER_H_
#define SHARDLINE_SERVER_JOB_MANAGER_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/planner.h"
#include "server/stream_mailbox.h"
#include "server/weight_store.h"
#include "server/worker_registry.h"
#include "shardline/v1/admin.pb.h"
#include "shardline/v1/coordinator.pb.h"

namespace shardline::server {

class JobManager {
 public:
  // Sends an assignment (or cancellation) to a worker's watch stream.
  using Deliver = std::function<void(const std::string& worker_id, shardline::v1::Assignment)>;

  JobManager(WorkerRegistry& registry, WeightStore& weights, Deliver deliver)
      : registry_(registry), weights_(weights), deliver_(std::move(deliver)) {}

  // INVALID_ARGUMENT for a spec that fails validation (naming the field).
  absl::StatusOr<shardline::v1::JobStatus> Submit(shardline::v1::JobSpec spec);
  absl::StatusOr<shardline::v1::JobStatus> Get(const std::string& job_id);
  absl::StatusOr<shardline::v1::JobSpec> Spec(const std::string& job_id);
  std::vector<shardline::v1::JobStatus> List();
  // FAILED_PRECONDITION for a job that has already ended.
  absl::StatusOr<shardline::v1::JobStatus> Cancel(const std::string& job_id);
  // The plan the spec would get on the idle workers now.
  absl::StatusOr<shardline::v1::PlanResponse> Plan(shardline::v1::JobSpec spec);
  // Which worker runs which stage of a job (names, for messages).
  absl::StatusOr<std::vector<std::string>> StageWorkers(const std::string& job_id);

  // Worker reports. NOT_FOUND: unknown job; FAILED_PRECONDITION: stale epoch
  // or a worker that does not hold that stage; INVALID_ARGUMENT: malformed.
  // Returns true when the worker should stop (the job is no longer running).
  absl::StatusOr<bool> ReportStep(const shardline::v1::ReportStepRequest& report);
  absl::StatusOr<bool> ReportShard(const shardline::v1::ShardHeader& header, const std::string& bytes);

  void WorkersLost(const std::vector<WorkerRecord>& lost);
  // Fails jobs whose stages reported a broken link and whose lost worker, if
  // any, has not been identified within a lease (called by the lease reaper).
  void Tick();
  // Plans and assigns pending jobs that now have enough idle workers.
  void Schedule();
  // Streams to `mailbox` the job's status as each of its last kRecentSteps
  // completed steps ended (so that a watcher subscribing after a job started
  // still sees every recent step), then its status now and after every change.
  static constexpr size_t kRecentSteps = 256;
  absl::Status Watch(const std::string& job_id,
                     std::shared_ptr<StreamMailbox<shardline::v1::JobStatus>> mailbox);

 private:
  struct Job {
    shardline::v1::JobSpec spec;
    shardline::v1::JobStatus status;
    int stages = 0;    // p
    int replicas = 1;  // d
    std::vector<std::string> workers;  // worker id per position (replica · p + stage)
    // Per position, its reports of the steps not yet complete everywhere.
    std::vector<std::map<int64_t, shardline::v1::ReportStepRequest>> reports;
    std::vector<std::shared_ptr<StreamMailbox<shardline::v1::JobStatus>>> watchers;
    std::deque<shardline::v1::JobStatus> recent_steps;  // as each of the last steps ended
    // A stage lost its link: usually a neighbour died. Wait up to a lease for
    // the registry to name the lost worker before failing with this message.
    std::string pending_failure;
    absl::Time failure_deadline;
  };

  absl::StatusOr<Job*> Find(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The position of (stage, replica), if the sender holds it at `epoch`.
  absl::StatusOr<int> CheckSender(const Job& job, uint64_t epoch, int stage, int replica,
                                  const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "stage 1" or, with replicas, "stage 1 of replica 2", and its worker.
  static std::string PositionName(const Job& job, int position);
  // Completes step `step` once every position reported it.
  void MaybeCompleteStep(Job& job, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void End(Job& job, shardline::v1::JobState state, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeSucceed(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Publish(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool Ended(const Job& job);

  WorkerRegistry& registry_;
  WeightStore& weights_;
  const Deliver deliver_;
  absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // submission order
  int64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_epoch_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_JOB_MANAGER_H_
