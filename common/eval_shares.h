// How a validation pass is shared by a job's data-parallel replicas: of its
// n batches (in the data source's order), replica r of d runs batches r,
// r + d, r + 2d, ... and reports each one's loss; the coordinator adds the
// losses back in batch order (SumEvalShares), which is the order the
// single-process trainer adds them in: the same bits for any d, while each
// replica runs a d-th of the pass. A replica with no batch (n < d) runs none.
#ifndef SHARDLINE_COMMON_EVAL_SHARES_H_
#define SHARDLINE_COMMON_EVAL_SHARES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shardline::common {

// The batches of n that replica `replica` of `replicas` runs, in order.
std::vector<int64_t> EvalShare(int64_t n, int replica, int replicas);

// The sum of the losses of every batch in batch order, from each replica's
// share (shares[r]: replica r's, in its order). INVALID_ARGUMENT when the
// shares' sizes are not those EvalShare gives for some n.
absl::StatusOr<double> SumEvalShares(const std::vector<absl::Span<const double>>& shares);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_EVAL_SHARES_H_
