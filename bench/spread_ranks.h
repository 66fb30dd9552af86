// bench_collective's ranks spread over network namespaces, so that the
// all-reduce crosses real (veth) links instead of loopback: rank 0 runs in
// this process, rank r > 0 in a process forked into namespace netns[r];
// rank r serves its StageLink service and a raw-TCP listener on ips[r].
// Per buffer size every rank runs the all-reduces and then the raw-TCP ring
// (rank r streaming to rank r + 1 what one rank's links carry in those
// all-reduces), each trial started together (a one-float all-reduce as the
// barrier) and timed on rank 0; every rank checks its results.
#ifndef SHARDLINE_BENCH_SPREAD_RANKS_H_
#define SHARDLINE_BENCH_SPREAD_RANKS_H_

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/collective/collective.h"

namespace shardline::bench {

struct SpreadConfig {
  std::vector<std::string> netns;  // by rank; "" = this process's namespace (rank 0 must be "")
  std::vector<std::string> ips;    // by rank
  std::vector<size_t> sizes;       // buffer bytes
  int trials = 3;
  size_t chunk_bytes = 1 << 20;
  std::function<int(size_t bytes)> reps;  // all-reduces per trial
};

struct SpreadResult {
  size_t bytes = 0;
  int reps = 0;
  double allreduce_s = 0;        // one all-reduce: the median trial / reps
  double allreduce_total_s = 0;  // all trials
  double tcp_s = 0;              // one all-reduce's worth of the TCP ring, median trial
  bool correct = true;           // on every rank
};

// Forks the other ranks: call before this process starts any thread.
absl::StatusOr<std::vector<SpreadResult>> RunSpreadRanks(const SpreadConfig& config);

// `reps` all-reduces of `buffer` (n floats) as rank `rank` of `ranks`: the
// values grow call after call (to inf: the same work) and the last call
// starts from rank + 1 again, so that its result can be checked (every
// element d(d + 1)/2). True if it was right.
bool AllReduceReps(worker::Backend& backend, worker::collective::Collective& collective,
                   worker::DeviceBuffer& buffer, size_t n, int rank, int ranks, int reps);

}  // namespace shardline::bench

#endif  // SHARDLINE_BENCH_SPREAD_RANKS_H_
