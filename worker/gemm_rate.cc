#include "worker/gemm_rate.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "common/status_macros.h"

namespace shardline::worker {

absl::StatusOr<GemmRate> MeasureGemmRate(Backend& backend) {
  constexpr int64_t n = 1024;
  constexpr int kProbes = 7, kMinProbes = 3;
  constexpr double kBudgetSeconds = 0.5;
  ASSIGN_OR_RETURN(DeviceBuffer a, backend.AllocateZeros(n * n));
  ASSIGN_OR_RETURN(DeviceBuffer b, backend.AllocateZeros(n * n));
  ASSIGN_OR_RETURN(DeviceBuffer c, backend.AllocateZeros(n * n));
  GemmShape g;
  g.m = g.n = g.k = n;
  std::vector<double> seconds;
  double spent = 0;
  for (int rep = 0; rep <= kProbes; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(backend.Gemm(g, a.span<float>(), b.span<float>(), c.span<float>()));
    RETURN_IF_ERROR(backend.Synchronize());
    const double took = std::max(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1e-9);
    if (rep == 0) continue;  // the warm-up: caches, page faults, clocks
    seconds.push_back(took);
    spent += took;
    if (static_cast<int>(seconds.size()) >= kMinProbes && spent > kBudgetSeconds) break;
  }
  std::sort(seconds.begin(), seconds.end());
  const double flops = 2.0 * n * n * n;
  GemmRate rate;
  rate.flops = flops / seconds[seconds.size() / 2];
  rate.spread = std::min(10.0, (flops / seconds.front() - flops / seconds.back()) / rate.flops);
  return rate;
}

}  // namespace shardline::worker
