#include "worker/collective/error_feedback.h"

#include <algorithm>
#include <cmath>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/int8_blocks.h"

namespace shardline::worker::collective {

void QuantizeWithFeedback(absl::Span<float> values, absl::Span<float> residual, absl::Span<char> blocks) {
  CHECK_EQ(residual.size(), values.size());
  CHECK_EQ(blocks.size(), common::Int8BlocksBytes(values.size()));
  float meant[common::kInt8BlockValues];
  for (size_t begin = 0, at = 0; begin < values.size(); begin += common::kInt8BlockValues) {
    const size_t n = std::min(common::kInt8BlockValues, values.size() - begin);
    for (size_t i = 0; i < n; ++i) meant[i] = values[begin + i] + residual[begin + i];
    const size_t bytes = common::Int8BlocksBytes(n);
    const absl::Span<char> block = blocks.subspan(at, bytes);
    common::EncodeInt8Blocks(absl::Span<const float>(meant, n), block);
    // An encoder's own blocks always decode.
    CHECK(common::DecodeInt8Blocks(block, values.subspan(begin, n)).ok());
    const bool finite = std::all_of(meant, meant + n, [](float x) { return std::isfinite(x); });
    for (size_t i = 0; i < n; ++i) residual[begin + i] = finite ? meant[i] - values[begin + i] : 0.0f;
    at += bytes;
  }
}

absl::Status CheckResidual(size_t values, size_t residual) {
  if (residual == values) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("a residual of ", residual, " floats for a buffer of ", values));
}

}  // namespace shardline::worker::collective
