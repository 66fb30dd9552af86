// JobTrace keeps what every position of a job did in its last steps (the
// spans its stage reports with each step), for Admin.GetTrace and
// `shardctl trace`: per position (stage, replica, tensor rank), the last
// kStepsKept steps, a step run again after a restart kept once per epoch.
// In memory only (a coordinator restart forgets it). Not thread-safe: the
// job manager's lock guards it.
#ifndef SHARDLINE_SERVER_JOB_TRACE_H_
#define SHARDLINE_SERVER_JOB_TRACE_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "shardline/v1/admin.pb.h"

namespace shardline::server {

class JobTrace {
 public:
  static constexpr int kStepsKept = 200;

  void Add(int stage, int replica, int tensor_rank, const std::string& worker, uint64_t plan_epoch, int64_t step,
           const google::protobuf::RepeatedPtrField<shardline::v1::TraceEvent>& events);
  // Steps in [first, last] (0: no bound) of every position, in position order.
  shardline::v1::GetTraceResponse Get(const std::string& job_id, int64_t first, int64_t last) const;

 private:
  std::map<std::tuple<int, int, int>, shardline::v1::PositionTrace> positions_;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_JOB_TRACE_H_
