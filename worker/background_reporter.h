// BackgroundReporter takes a running stage's reports and checkpoints off
// its critical path. Step reports go to the coordinator in order, on a
// thread of their own (each retried by the reporter it wraps). At a
// checkpoint the stage hands over a snapshot of its shard (host memory);
// the snapshot's digest, which the step's report carries, is computed on
// that thread, and replica 0's upload runs on a second one while the stage
// trains on. Each snapshot, once its digest is known, is the worker's
// StateCache's (for a restart, or a twin, to load from memory). One
// snapshot at a time, in memory reused from one checkpoint to the next
// (allocated ahead, off the stage's thread, by Prepare): a checkpoint
// waits in WaitForSnapshotSlot until the previous upload is done, the only
// wait for a checkpoint beyond copying its snapshot. The
// first error, or the coordinator saying stop, is kept for the stage to
// read between steps. Thread-safe; the reporter it wraps is used by one
// thread at a time.
#ifndef SHARDLINE_WORKER_BACKGROUND_REPORTER_H_
#define SHARDLINE_WORKER_BACKGROUND_REPORTER_H_

#include <atomic>
#include <deque>
#include <map>
#include <string>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "shardline/v1/coordinator.pb.h"
#include "worker/shard_snapshot.h"
#include "worker/state_cache.h"
#include "worker/stage_reporter.h"

namespace shardline::worker {

class BackgroundReporter {
 public:
  // `cancelled` is the job's: once true, waits end and the upload stops.
  BackgroundReporter(StageReporter& inner, StateCache& cache, const std::atomic<bool>& cancelled,
                     size_t max_queued = 64);
  // Abandon()s whatever is not sent yet (Flush first to send it).
  ~BackgroundReporter();

  // Allocates the snapshot's host memory (tensors of these names and
  // shapes) on the upload thread, while the stage starts training.
  void Prepare(std::map<std::string, std::vector<int64_t>> layout);
  // Queues a step report; blocks while `max_queued` wait (back-pressure
  // on a stage far ahead of a coordinator that does not answer).
  void Report(shardline::v1::ReportStepRequest report);
  // Blocks until no snapshot is held (the previous upload is done, or
  // failed, or the job was cancelled); returns the last snapshot's tensors
  // for the next one to be written over (none the first time).
  std::map<std::string, common::Tensor> WaitForSnapshotSlot();
  // Queues a checkpoint step's report with its shard; `upload`: this
  // position sends the shard (replica 0), else only its digest counts.
  void ReportCheckpoint(shardline::v1::ReportStepRequest report, std::unique_ptr<ShardSnapshot> shard, bool upload);
  // OK; the first error of a report or upload; CANCELLED once the
  // coordinator said the job no longer runs.
  absl::Status status();
  // Waits until every report is sent and the upload done (or the job is
  // cancelled); returns status().
  absl::Status Flush();
  // Stops now: the upload is cut, what is queued is dropped, the threads
  // are joined. After it the wrapped reporter is the caller's again.
  void Abandon();

 private:
  struct Item {
    shardline::v1::ReportStepRequest report;
    std::shared_ptr<ShardSnapshot> shard;
    bool upload = false;
  };

  void SendReports();
  void SendShards();
  void Fail(const absl::Status& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for `condition`, or until the job is cancelled (which also cuts
  // the upload).
  void AwaitOrCancelled(const absl::Condition& condition) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  StageReporter& inner_;
  StateCache& cache_;
  const std::atomic<bool>& cancelled_;
  const size_t max_queued_;
  std::atomic<bool> abandoned_{false};  // the upload's cancellation flag

  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool sending_ ABSL_GUARDED_BY(mu_) = false;      // a report is on its way
  bool snapshot_held_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<ShardSnapshot> to_upload_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<int64_t>> to_prepare_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, common::Tensor> spare_ ABSL_GUARDED_BY(mu_);  // Prepare's memory, for the first snapshot
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;

  std::thread reports_;
  std::thread uploads_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_BACKGROUND_REPORTER_H_
