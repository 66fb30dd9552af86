#include "common/eval_shares.h"

#include "absl/strings/str_cat.h"

namespace shardline::common {

std::vector<int64_t> EvalShare(int64_t n, int replica, int replicas) {
  std::vector<int64_t> share;
  for (int64_t i = replica; replicas > 0 && i < n; i += replicas) share.push_back(i);
  return share;
}

absl::StatusOr<double> SumEvalShares(const std::vector<absl::Span<const double>>& shares) {
  const int64_t d = static_cast<int64_t>(shares.size());
  int64_t n = 0;
  for (absl::Span<const double> share : shares) n += static_cast<int64_t>(share.size());
  for (int64_t r = 0; r < d; ++r) {
    const int64_t want = n > r ? (n - r + d - 1) / d : 0;
    if (static_cast<int64_t>(shares[r].size()) != want) {
      return absl::InvalidArgumentError(absl::StrCat("replica ", r, " of ", d, " reported ", shares[r].size(),
                                                     " validation batches where a pass of ", n, " gives it ", want));
    }
  }
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += shares[i % d][i / d];
  return sum;
}

}  // namespace shardline::common
