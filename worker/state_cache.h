// StateCache keeps the last checkpoint snapshot a worker took (a
// ShardSnapshot: its job, step and tensors, the weights and optimizer state
// of its position) once the snapshot is taken, and after its job ends, so
// that a restart of that job from that step finds its state in memory: on
// this worker, if it holds the same position again, and on its
// data-parallel twins (WorkerState.FetchState), instead of fetching it
// from the coordinator's disk. One snapshot; its memory is handed back for
// the next snapshot when nobody reads it. Thread-safe.
#ifndef SHARDLINE_WORKER_STATE_CACHE_H_
#define SHARDLINE_WORKER_STATE_CACHE_H_

#include <cstdint>
#include <deque>
#include <utility>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/tensor.h"
#include "worker/shard_snapshot.h"

namespace shardline::worker {

class StateCache {
 public:
  // `snapshot` (its digest computed) is the newest: it replaces the one held.
  void Put(std::shared_ptr<ShardSnapshot> snapshot);
  // The snapshot of `job_id` at `step`, if that is the one held.
  std::shared_ptr<const ShardSnapshot> Get(const std::string& job_id, int64_t step);
  // The held snapshot's tensors, for the next snapshot to be written into,
  // when no one else holds it (a twin's fetch, an upload): then nothing is
  // held afterwards. Else none, and it stays.
  std::map<std::string, common::Tensor> TakeMemory();

  // Twins prove they belong to a job with its link token: the token
  // of an assignment this worker received for `job_id` (the last few
  // plans of the last few jobs are remembered).
  void AdmitToken(const std::string& job_id, const std::string& token);
  bool Admits(const std::string& job_id, const std::string& token);

 private:
  absl::Mutex mu_;
  std::shared_ptr<ShardSnapshot> held_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<std::string, std::string>> tokens_ ABSL_GUARDED_BY(mu_);  // (job, token), newest last
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_STATE_CACHE_H_
