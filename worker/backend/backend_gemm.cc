// Backend's GEMMs: the checks before each call (shapes, leading dimensions,
// strides, span lengths; for a pair, that neither C overlaps the other call's
// operands) and the default pair, one GEMM after the other. The other
// compute operations' checks are in backend.cc.
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/dtype.h"
#include "worker/backend/backend.h"
#include "worker/backend/backend_checks.h"

namespace shardline::worker {
namespace {

using backend_checks::CheckSpan;
using backend_checks::Invalid;

constexpr int64_t kMaxBlasDim = std::numeric_limits<int32_t>::max();

// Elements one operand of a batched GEMM spans, given the matrix as stored
// ([rows × cols] with row stride ld). Fills in a packed ld when it is 0.
absl::StatusOr<uint64_t> GemmExtent(absl::string_view op, absl::string_view name, int64_t rows,
                                    int64_t cols, int64_t& ld, int64_t batch, int64_t stride) {
  if (ld == 0) ld = cols > 0 ? cols : 1;
  if (ld < cols || ld < 1 || ld > kMaxBlasDim) {
    return Invalid(op, absl::StrCat("leading dimension of ", name, " is ", ld, " for ", cols,
                                        " columns"));
  }
  if (stride < 0) return Invalid(op, absl::StrCat("batch stride of ", name, " is negative"));
  if (rows == 0 || cols == 0) return uint64_t{0};
  const __int128 extent = static_cast<__int128>(batch - 1) * stride +
                          static_cast<__int128>(rows - 1) * ld + cols;
  if (extent > common::kMaxElements) {
    return Invalid(op, absl::StrCat(name, " would span more than 2^48 elements"));
  }
  return static_cast<uint64_t>(extent);
}

// The elements [begin, end) of one operand that a GEMM reads or writes.
struct Extent {
  uintptr_t begin = 0, end = 0;
};

Extent ExtentOf(const void* data, uint64_t elements) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  return {begin, begin + elements * sizeof(float)};
}

bool Overlap(const Extent& x, const Extent& y) {
  return x.begin < x.end && y.begin < y.end && x.begin < y.end && y.begin < x.end;
}

// A GEMM whose arguments passed the checks; empty when C has no elements.
struct CheckedGemm {
  GemmOperands operands;
  Extent a, b, c;
  bool empty() const { return c.begin == c.end; }
};

absl::StatusOr<CheckedGemm> CheckGemm(absl::string_view op, const GemmCall& call) {
  GemmShape s = call.shape;
  for (int64_t dim : {s.m, s.n, s.k}) {
    if (dim < 0 || dim > kMaxBlasDim) {
      return Invalid(op, absl::StrCat("m, n, k must be in [0, 2^31), got ", s.m, ", ", s.n, ", ", s.k));
    }
  }
  if (s.batch < 1 || s.batch > kMaxBlasDim) {
    return Invalid(op, absl::StrCat("batch must be in [1, 2^31), got ", s.batch));
  }
  const int64_t a_rows = s.trans_a ? s.k : s.m, a_cols = s.trans_a ? s.m : s.k;
  const int64_t b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
  ASSIGN_OR_RETURN(uint64_t a_extent, GemmExtent(op, "A", a_rows, a_cols, s.lda, s.batch, s.stride_a));
  ASSIGN_OR_RETURN(uint64_t b_extent, GemmExtent(op, "B", b_rows, b_cols, s.ldb, s.batch, s.stride_b));
  ASSIGN_OR_RETURN(uint64_t c_extent, GemmExtent(op, "C", s.m, s.n, s.ldc, s.batch, s.stride_c));
  if (s.batch > 1 && s.stride_c == 0 && c_extent > 0) {
    return Invalid(op, "batched C must not have stride 0 (entries would overlap)");
  }
  CheckedGemm g;
  g.operands = {s, call.a.data(), call.b.data(), call.c.data()};
  if (c_extent == 0) return g;
  if (s.k > 0) {
    RETURN_IF_ERROR(CheckSpan(op, "A", call.a, a_extent));
    RETURN_IF_ERROR(CheckSpan(op, "B", call.b, b_extent));
    g.a = ExtentOf(call.a.data(), a_extent);
    g.b = ExtentOf(call.b.data(), b_extent);
  }
  RETURN_IF_ERROR(CheckSpan(op, "C", call.c, c_extent));
  g.c = ExtentOf(call.c.data(), c_extent);
  return g;
}

}  // namespace

absl::Status Backend::Gemm(const GemmShape& shape, DeviceSpan<const float> a,
                           DeviceSpan<const float> b, DeviceSpan<float> c) {
  ASSIGN_OR_RETURN(CheckedGemm g, CheckGemm("Gemm", GemmCall{shape, a, b, c}));
  return g.empty() ? absl::OkStatus() : GemmImpl(g.operands.shape, g.operands.a, g.operands.b, g.operands.c);
}

absl::Status Backend::GemmPair(const GemmCall& first, const GemmCall& second) {
  ASSIGN_OR_RETURN(CheckedGemm g1, CheckGemm("GemmPair (first)", first));
  ASSIGN_OR_RETURN(CheckedGemm g2, CheckGemm("GemmPair (second)", second));
  if (Overlap(g1.c, g2.c) || Overlap(g1.c, g2.a) || Overlap(g1.c, g2.b) || Overlap(g2.c, g1.a) ||
      Overlap(g2.c, g1.b)) {
    return Invalid("GemmPair", "one GEMM's C overlaps the other's operands");
  }
  if (g1.empty() || g2.empty()) {
    const CheckedGemm& g = g1.empty() ? g2 : g1;
    return g.empty() ? absl::OkStatus() : GemmImpl(g.operands.shape, g.operands.a, g.operands.b, g.operands.c);
  }
  return GemmPairImpl(g1.operands, g2.operands);
}

absl::Status Backend::GemmPairImpl(const GemmOperands& first, const GemmOperands& second) {
  RETURN_IF_ERROR(GemmImpl(first.shape, first.a, first.b, first.c));
  return GemmImpl(second.shape, second.a, second.b, second.c);
}

}  // namespace shardline::worker
