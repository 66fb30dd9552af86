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

absl::Status CheckTargets(const char* op, const int32_t* targets, int64_t rows, int64_t classes) {
  return CheckIds(op, targets, rows, classes, true);
}

absl::Status EmbeddingForward(const EmbeddingShape& shape, const int32_t* ids, const float* table,
                              float* out, bool accumulate) {
  if (absl::Status s = CheckIds("EmbeddingForward", ids, shape.rows, shape.ids(), false); !s.ok()) {
    return s;
  }
  const int64_t dim = shape.dim;
  for (int64_t r = 0; r < shape.rows; ++r) {
    const int64_t row = ids[r] - shape.first;
    float* dst = out + r * dim;
    if (row < 0 || row >= shape.vocab) {  // held by another rank
      if (!accumulate) std::fill(dst, dst + dim, 0.0f);
      continue;
    }
    const float* src = table + row * dim;
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
  if (absl::Status s = CheckIds("EmbeddingBackward", ids, shape.rows, shape.ids(), false); !s.ok()) {
    return s;
  }
  const int64_t dim = shape.dim;
  for (int64_t r = 0; r < shape.rows; ++r) {
    const int64_t row = ids[r] - shape.first;
    if (row < 0 || row >= shape.vocab) continue;
    float* dst = dtable + row * dim;
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
                                  const int32_t* targets, const float* lse, float grad_scale,
                                  float* dlogits) {
  if (absl::Status s = CheckIds("CrossEntropyBackward", targets, shape.rows, shape.classes(), true);
      !s.ok()) {
    return s;
  }
  const int64_t vocab = shape.vocab;
  for (int64_t r = 0; r < shape.rows; ++r) {
    if (targets[r] < 0) continue;
    const float* row = logits + r * vocab;
    float* drow = dlogits + r * vocab;
    const double row_lse = lse != nullptr ? static_cast<double>(lse[r]) : LogSumExp(row, vocab);
    const int64_t target = targets[r] - shape.first;  // outside [0, vocab): held elsewhere
    for (int64_t j = 0; j < vocab; ++j) {
      const float p = static_cast<float>(std::exp(static_cast<double>(row[j]) - row_lse));
      drow[j] += grad_scale * (p - (j == target ? 1.0f : 0.0f));
    }
  }
  return absl::OkStatus();
}

absl::Status CrossEntropyParts(const CrossEntropyShape& shape, const float* logits, const int32_t* targets,
                               float* parts) {
  if (absl::Status s = CheckIds("CrossEntropyParts", targets, shape.rows, shape.classes(), true); !s.ok()) {
    return s;
  }
  const int64_t vocab = shape.vocab;
  for (int64_t r = 0; r < shape.rows; ++r) {
    const float* row = logits + r * vocab;
    float max = row[0];
    for (int64_t j = 1; j < vocab; ++j) max = std::max(max, row[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j]) - max);
    const int64_t target = targets[r] - shape.first;
    float* out = parts + 3 * r;
    out[0] = max;
    out[1] = static_cast<float>(sum);
    out[2] = targets[r] >= 0 && target >= 0 && target < vocab ? row[target] : 0.0f;
  }
  return absl::OkStatus();
}

void CrossEntropyCombine(const LossPartsShape& shape, const float* parts, const int32_t* targets,
                         float* losses, float* lse) {
  const int64_t rows = shape.rows;
  for (int64_t r = 0; r < rows; ++r) {
    float max = parts[3 * r];
    for (int64_t k = 1; k < shape.slices; ++k) max = std::max(max, parts[3 * (k * rows + r)]);
    double sum = 0.0, target = 0.0;
    for (int64_t k = 0; k < shape.slices; ++k) {
      const float* part = parts + 3 * (k * rows + r);
      sum += static_cast<double>(part[1]) * std::exp(static_cast<double>(part[0]) - max);
      target += part[2];
    }
    const double row_lse = max + std::log(sum);
    lse[r] = static_cast<float>(row_lse);
    losses[r] = targets[r] < 0 ? 0.0f : static_cast<float>(row_lse - target);
  }
}

}  // namespace shardline::worker::cpu
