// InProcessGroup is a group of ranks that are threads of one process, each
// with a backend of its own (tests, and pipelines run in-process). Rank(r)
// gives rank r's Collective; the group must outlive them.
//
// A call copies the rank's buffer to the host, meets the same call of every
// other rank, computes this rank's result from their host copies (sums with
// AddInRankOrder) and copies it back to the device. Host memory per call is
// one copy of each rank's buffer, freed once every rank has read it.
// Close() on any rank's handle fails every rank's calls. Thread-safe: each
// rank's Collective is used by its own thread.
#ifndef SHARDLINE_WORKER_COLLECTIVE_IN_PROCESS_COLLECTIVE_H_
#define SHARDLINE_WORKER_COLLECTIVE_IN_PROCESS_COLLECTIVE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/backend/backend.h"
#include "worker/collective/collective.h"

namespace shardline::worker::collective {

class InProcessGroup {
 public:
  // `ranks` ≥ 1; a call fails with DEADLINE_EXCEEDED when a rank has not
  // joined it within `timeout`.
  static absl::StatusOr<std::unique_ptr<InProcessGroup>> Create(int ranks, absl::Duration timeout);

  // Rank r's handle, on `backend` (which must outlive it). Each rank once.
  std::unique_ptr<Collective> Rank(int rank, Backend& backend);
  int size() const { return size_; }

 private:
  friend class InProcessCollective;
  enum class Op { kAllReduceSum, kReduceScatterSum, kAllGather, kBroadcast };
  // What a rank brought to one call.
  struct Contribution {
    Op op = Op::kAllReduceSum;
    size_t elements = 0;
    int root = 0;
    int parts = 1;  // AllReduceSumHostParts: the rank's parts, end to end in `values`
    std::shared_ptr<const std::vector<float>> values;  // the rank's host copy
  };
  struct Call {
    std::vector<Contribution> ranks;  // by rank, filled as they arrive
    int arrived = 0;
    int read = 0;          // ranks done with the others' values; the call goes at size_
    absl::Status failure;  // the call's, the same for every rank in it
  };

  InProcessGroup(int size, absl::Duration timeout) : size_(size), timeout_(timeout) {}
  static const char* OpName(Op op);
  // Rank `rank`'s part of call `sequence`: every rank's contribution, once
  // all have come and agree, or the reason the call failed. Done() says the
  // rank has read them.
  absl::StatusOr<std::vector<Contribution>> Meet(int rank, uint64_t sequence, Contribution mine);
  void Done(uint64_t sequence);
  void Close(const std::string& reason);

  const int size_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  std::deque<Call> calls_ ABSL_GUARDED_BY(mu_);   // by sequence number − base_
  uint64_t base_ ABSL_GUARDED_BY(mu_) = 0;        // sequence number of calls_[0]
  std::string closed_ ABSL_GUARDED_BY(mu_);       // non-empty once closed
};

}  // namespace shardline::worker::collective

#endif  // SHARDLINE_WORKER_COLLECTIVE_IN_PROCESS_COLLECTIVE_H_
