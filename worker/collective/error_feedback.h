// Error feedback for sums sent as 8-bit blocks (common/int8_blocks.h), as
// 1-bit SGD and its successors do: what a rank sends is the 8-bit encoding
// of its values plus the residual it kept from the last call on the same
// buffer, and the new residual is what that encoding missed. Over T calls
// the sent values add up to the true ones minus the last residual (at most
// half a block's scale per value), so quantization delays part of a
// gradient by a step or more instead of losing it: the error of the sum
// over any number of steps stays bounded.
#ifndef SHARDLINE_WORKER_COLLECTIVE_ERROR_FEEDBACK_H_
#define SHARDLINE_WORKER_COLLECTIVE_ERROR_FEEDBACK_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace shardline::worker::collective {

// values + residual, encoded as 8-bit blocks into `blocks`
// (common::Int8BlocksBytes(values.size()) bytes); `values` becomes what a
// receiver decodes from them and `residual` (values.size() floats) the
// difference. A block holding a non-finite value decodes as NaN and leaves
// a zero residual (the step is skipped or fails; later steps are not
// poisoned).
void QuantizeWithFeedback(absl::Span<float> values, absl::Span<float> residual, absl::Span<char> blocks);

// INVALID_ARGUMENT unless a buffer of `values` floats has a residual of as
// many.
absl::Status CheckResidual(size_t values, size_t residual);

}  // namespace shardline::worker::collective

#endif  // SHARDLINE_WORKER_COLLECTIVE_ERROR_FEEDBACK_H_
