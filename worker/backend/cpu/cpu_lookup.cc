#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/backend/cpu/cpu_kernels.h"
#include "worker/backend/cpu/cpu_math.h"

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

// Σ exp(row[j] − max) for a row's maximum `max`: each term the branch-free
// float exp (cpu_math.h; the argument is <= 0), summed in double over eight
// lanes in a fixed order. Vectorised, where a double std::exp per logit cost
// 35 ms for 256 rows of a 50,304-word vocabulary (docs/benchmarks.md).
// The terms go through a chunk buffer so that the exps vectorise apart
// from the double sums; term j still lands in lane j mod 8 (chunks are whole
// multiples of 8), so the sum is LaneSum's, bit for bit.
SHARDLINE_CPU_CLONES double SumExpBelow(const float* row, int64_t n, float max) {
  constexpr int64_t kChunk = 512, kLanes = 8;
  float terms[kChunk];
  double lanes[kLanes] = {};
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    const int64_t m = std::min(kChunk, n - j0), whole = m / kLanes * kLanes;
    for (int64_t j = 0; j < m; ++j) terms[j] = ExpNonPositive(row[j0 + j] - max);
    for (int64_t j = 0; j < whole; j += kLanes) {
      for (int64_t k = 0; k < kLanes; ++k) lanes[k] += terms[j + k];
    }
    for (int64_t j = whole; j < m; ++j) lanes[j - whole] += terms[j];
  }
  double total = 0.0;
  for (double lane : lanes) total += lane;
  return total;
}

// log Σ exp(row), stably: max + log Σ exp(row − max).
double LogSumExp(const float* row, int64_t n) {
  const float max = ScaledMax(row, n, 1.0f);
  return max + std::log(SumExpBelow(row, n, max));
}

// drow[j] += grad_scale · (exp(row[j] − lse) − [j = target]).
SHARDLINE_CPU_CLONES void SoftmaxGradientRow(const float* row, int64_t n, float lse, int64_t target, float grad_scale,
                                             float* drow) {
  for (int64_t j = 0; j < n; ++j) {
    const float p = ExpNonPositive(row[j] - lse);
    drow[j] += grad_scale * (p - (j == target ? 1.0f : 0.0f));
  }
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
    // As a float, lse is still >= every logit (it rounds to nearest and the
    // maximum logit is a float), so every exponent is <= 0.
    const float row_lse = lse != nullptr ? lse[r] : static_cast<float>(LogSumExp(row, vocab));
    const int64_t target = targets[r] - shape.first;  // outside [0, vocab): held elsewhere
    SoftmaxGradientRow(row, vocab, row_lse, target, grad_scale, drow);
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
    const float max = ScaledMax(row, vocab, 1.0f);
    const double sum = SumExpBelow(row, vocab, max);
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
