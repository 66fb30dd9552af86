#include "worker/collective/collective.h"

#include <vector>

#include "common/int8_blocks.h"
#include "common/status_macros.h"
#include "worker/collective/error_feedback.h"

namespace shardline::worker::collective {
namespace {

// Chunk `chunk` of `data` as its 8-bit blocks decode, with feedback.
void QuantizeChunk(absl::Span<float> data, absl::Span<float> residual, Chunk chunk) {
  std::vector<char> blocks(common::Int8BlocksBytes(chunk.size()));
  QuantizeWithFeedback(data.subspan(chunk.begin, chunk.size()), residual.subspan(chunk.begin, chunk.size()),
                       absl::MakeSpan(blocks));
}

}  // namespace

absl::Status Collective::ReduceScatterSumHostInt8(absl::Span<float> data, absl::Span<float> residual) {
  RETURN_IF_ERROR(CheckResidual(data.size(), residual.size()));
  if (size() > 1) {
    for (int q = 0; q < size(); ++q) {
      if (q != rank()) QuantizeChunk(data, residual, ChunkOf(data.size(), size(), q));
    }
  }
  return ReduceScatterSumHost(data);
}

absl::Status Collective::AllReduceSumHostInt8(absl::Span<float> data, absl::Span<float> residual) {
  RETURN_IF_ERROR(CheckResidual(data.size(), residual.size()));
  if (size() == 1) return AllReduceSumHost(data);  // nothing to send
  RETURN_IF_ERROR(ReduceScatterSumHostInt8(data, residual));
  QuantizeChunk(data, residual, ChunkOf(data.size(), size(), rank()));
  return AllGatherHost(data);
}

absl::Status Collective::AllReduceSumHostParts(absl::Span<float> data, absl::Span<const float* const> held) {
  if (held.empty()) return AllReduceSumHost(data);
  if (size() > 1) return absl::UnimplementedError("this collective sums one part per rank");
  for (size_t i = 0; i < data.size(); ++i) {  // AddInRankOrder's order per element
    float sum = held[0][i];
    for (size_t p = 1; p < held.size(); ++p) sum += held[p][i];
    data[i] = sum + data[i];
  }
  return absl::OkStatus();
}

absl::Status Collective::ReduceScatterSumHostParts(absl::Span<float> data, absl::Span<const float* const> held) {
  if (held.empty()) return ReduceScatterSumHost(data);
  return AllReduceSumHostParts(data, held);  // one rank: its chunk is the whole buffer
}

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
