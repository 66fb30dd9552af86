#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/backend/cpu/cpu_kernels.h"

namespace shardline::worker::cpu {
namespace {

absl::Status CheckIds(const char* op, const int32_t* ids, int64_t rows, int64_t vocab,
                      bool allow_ignored) {
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t id = ids[r];
    if (id >= vocab || (id < 0 && !allow_ignored)) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": id ", id, " at row ", r, " is outside [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

// log Σ exp(row), computed stably in double.
double LogSumExp(const float* row, int64_t n) {
  float max = row[0];
  for (int64_t j = 1; j < n; ++j) max = std::max(max, row[j]);
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(row[j]) - max);
  return max + std::log(sum);
}

}  // namespace

absl::Status EmbeddingForward(const EmbeddingShape& shape, const int32_t* ids, const float* table,
                              float* out, bool accumulate) {
  if (absl::Status s = CheckIds("EmbeddingForward", ids, shape.rows, shape.vocab, false); !s.ok()) {
    return s;
  }
  const int64_t dim = shape.dim;
  for (int64_t r = 0; r < shape.rows; ++r) {
    const float* src = table + static_cast<int64_t>(ids[r]) * dim;
    float* dst = out + r * dim;
    if (accumulate) {
      for (int64_t c = 0; c < dim; ++c) dst[c] += src[c];
    } else {
      std::memcpy(dst, src, static_cast<size_t>(dim) * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(const EmbeddingShape& shape, const int32_t* ids, const float* dout,
                               float* dtable) {
  if (absl::Status s = CheckIds("EmbeddingBackward", ids, shape.rows, shape.vocab, false);
      !s.ok()) {
    return s;
  }
  const int64_t dim = shape.dim;
  for (int64_t r = 0; r < shape.rows; ++r) {
    float* dst = dtable + static_cast<int64_t>(ids[r]) * dim;
    const float* src = dout + r * dim;
    for (int64_t c = 0; c < dim; ++c) dst[c] += src[c];
  }
  return absl::OkStatus();
}

absl::Status CrossEntropyForward(const CrossEntropyShape& shape, const float* logits,
                                 const int32_t* targets, float* losses) {
  if (absl::Status s = CheckIds("CrossEntropyForward", targets, shape.rows, shape.vocab, true);
      !s.ok()) {
    return s;
  }
  for (int64_t r = 0; r < shape.rows; ++r) {
    if (targets[r] < 0) {
      losses[r] = 0.0f;
      continue;
    }
    const float* row = logits + r * shape.vocab;
    losses[r] = static_cast<float>(LogSumExp(row, shape.vocab) - row[targets[r]]);
  }
  return absl::OkStatus();
}

absl::Status CrossEntropyBackward(const CrossEntropyShape& shape, const float* logits,
                                  const int32_t* targets, float grad_scale, float* dlogits) {
  if (absl::Status s = CheckIds("CrossEntropyBackward", targets, shape.rows, shape.vocab, true);
      !s.ok()) {
    return s;
  }
  const int64_t vocab = shape.vocab;
  for (int64_t r = 0; r < shape.rows; ++r) {
    if (targets[r] < 0) continue;
    const float* row = logits + r * vocab;
    float* drow = dlogits + r * vocab;
    const double lse = LogSumExp(row, vocab);
    for (int64_t j = 0; j < vocab; ++j) {
      const float p = static_cast<float>(std::exp(static_cast<double>(row[j]) - lse));
      drow[j] += grad_scale * (p - (j == targets[r] ? 1.0f : 0.0f));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardline::worker::cpu
