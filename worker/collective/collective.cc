#include "worker/collective/collective.h"

namespace shardline::worker::collective {

Chunk ChunkOf(size_t n, int ranks, int rank) {
  const size_t d = static_cast<size_t>(ranks), r = static_cast<size_t>(rank);
  // n · r / d without overflow for any n below 2^64 / d.
  return {n / d * r + n % d * r / d, n / d * (r + 1) + n % d * (r + 1) / d};
}

void AddInRankOrder(absl::Span<const float* const> parts, absl::Span<float> out) {
  if (parts.empty()) return;
  const float* first = parts[0];
  for (size_t i = 0; i < out.size(); ++i) out[i] = first[i];
  for (size_t p = 1; p < parts.size(); ++p) {
    const float* part = parts[p];
    for (size_t i = 0; i < out.size(); ++i) out[i] += part[i];
  }
}

}  // namespace shardline::worker::collective
