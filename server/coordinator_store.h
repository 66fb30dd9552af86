// CoordinatorStore is the coordinator's durable state, one SQLite database
// (`<state_dir>/coordinator.db`, WAL, synchronous=FULL): every job's spec and
// last saved status, in submission order, and the id counters (next job
// number, next plan epoch, the incarnation). The committed weights are the
// WeightStore's (safetensors files beside it). Each call is one
// transaction, durable when it returns, so a coordinator killed at any point
// restarts with every job it had acknowledged and never hands out an id or
// epoch twice. Thread-safe (one connection behind a mutex).
#ifndef SHARDLINE_SERVER_COORDINATOR_STORE_H_
#define SHARDLINE_SERVER_COORDINATOR_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "shardline/v1/admin.pb.h"
#include "shardline/v1/job.pb.h"

struct sqlite3;

namespace shardline::server {

class CoordinatorStore {
 public:
  struct StoredJob {
    shardline::v1::JobSpec spec;
    shardline::v1::JobStatus status;
  };

  // Opens (creating when absent) the database at `path` and starts a new
  // incarnation. DATA_LOSS for a file that is not our database.
  static absl::StatusOr<std::unique_ptr<CoordinatorStore>> Open(const std::string& path);
  ~CoordinatorStore();
  CoordinatorStore(const CoordinatorStore&) = delete;
  CoordinatorStore& operator=(const CoordinatorStore&) = delete;

  // This process's incarnation: 1 for the first coordinator on this state,
  // one more at every restart.
  int64_t incarnation() const { return incarnation_; }
  // The next job number (1, 2, …; never one handed out before).
  absl::StatusOr<int64_t> TakeJobNumber();
  // The next plan epoch (1, 2, …; never one handed out before).
  absl::StatusOr<uint64_t> TakeEpoch();

  // Inserts or replaces a job's record (by status.job_id()); a new job goes
  // after every earlier one.
  absl::Status SaveJob(const shardline::v1::JobSpec& spec, const shardline::v1::JobStatus& status);
  // Removes a job's record; NOT_FOUND when there is none.
  absl::Status DeleteJob(const std::string& job_id);
  // Every job, in submission order.
  absl::StatusOr<std::vector<StoredJob>> LoadJobs();

 private:
  explicit CoordinatorStore(sqlite3* db) : db_(db) {}
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds one to counter `name` and returns the value it had (from 1).
  absl::StatusOr<int64_t> Take(const char* name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Error(const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* const db_ ABSL_GUARDED_BY(mu_);
  int64_t incarnation_ = 0;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_COORDINATOR_STORE_H_
