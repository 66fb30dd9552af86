// GEMMs the CPU backend splits over its threads (cpu_gemm.h): every way a
// GEMM is cut (by rows, by columns, grids of both, ragged last pieces,
// batches fewer or more than the threads, k = 0) against the float64 reference, with padded
// leading dimensions so a part that read or wrote its neighbour's rows would
// show; the same bits on every run; batches the same bits on any thread count;
// pairs of GEMMs run at once, each with the bits of its share of the threads.
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/backend/reference_ops.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cpu/cpu_gemm.h"

namespace shardline::worker {
namespace {

using testing::AllNear;
using testing::AsDoubles;
using testing::Download;
using testing::RandomVector;
using testing::SameBits;
using testing::Upload;

struct GemmCase {
  std::string name;
  GemmShape shape;
};

// A shape with every leading dimension padded by 3 and every batch stride
// by 5 beyond what the operands need.
GemmShape Padded(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t batch = 1) {
  GemmShape s;
  s.trans_a = trans_a;
  s.trans_b = trans_b;
  s.m = m;
  s.n = n;
  s.k = k;
  s.alpha = 0.75f;
  s.beta = 0.5f;  // C starts random: the parts must scale only their own outputs
  s.lda = (trans_a ? m : k) + 3;
  s.ldb = (trans_b ? k : n) + 3;
  s.ldc = n + 3;
  s.batch = batch;
  s.stride_a = (trans_a ? k : m) * s.lda + 5;
  s.stride_b = (trans_b ? n : k) * s.ldb + 5;
  s.stride_c = m * s.ldc + 5;
  return s;
}

std::vector<GemmCase> Cases() {
  std::vector<GemmCase> cases;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const std::string t = std::string(ta ? "T" : "N") + (tb ? "T" : "N");
      cases.push_back({"by rows " + t, Padded(ta, tb, 150, 70, 40)});
      cases.push_back({"by columns " + t, Padded(ta, tb, 30, 301, 50)});
    }
  }
  cases.push_back({"ragged: 20 rows in parts of 16", Padded(false, true, 20, 20, 1000)});
  cases.push_back({"square, ragged both ways", Padded(true, true, 100, 90, 70)});
  cases.push_back({"batch of 2", Padded(true, false, 64, 64, 64, 2)});
  cases.push_back({"batch of 5", Padded(false, false, 48, 40, 80, 5)});
  GemmCase shared_a{"batch of 4 sharing A", Padded(false, true, 40, 64, 100, 4)};
  shared_a.shape.stride_a = 0;
  cases.push_back(shared_a);
  cases.push_back({"k = 0", Padded(false, false, 600, 500, 0)});
  GemmCase overwrite{"beta = 0 over NaNs", Padded(false, false, 100, 90, 60)};
  overwrite.shape.beta = 0.0f;
  cases.push_back(overwrite);
  GemmCase small{"too small to split", Padded(false, false, 10, 10, 10)};
  cases.push_back(small);
  return cases;
}

size_t Extent(int64_t batch, int64_t stride, int64_t rows, int64_t ld) {
  return static_cast<size_t>(batch == 1 ? rows * ld : (batch - 1) * stride + rows * ld);
}

// A case's operands: C starts random, or NaN where beta = 0.
struct CaseData {
  std::vector<float> a, b, c0;
};

CaseData MakeData(const GemmShape& s, uint64_t seed) {
  CaseData d{RandomVector(Extent(s.batch, s.stride_a, s.trans_a ? s.k : s.m, s.lda), seed),
             RandomVector(Extent(s.batch, s.stride_b, s.trans_b ? s.n : s.k, s.ldb), seed + 1),
             RandomVector(Extent(s.batch, s.stride_c, s.m, s.ldc), seed + 2)};
  if (s.beta == 0.0f) {
    for (float& x : d.c0) x = std::numeric_limits<float>::quiet_NaN();
  }
  return d;
}

// `got` (all of C, padding included) against the reference; the padding
// must be untouched.
void ExpectReference(const GemmShape& s, const CaseData& d, const std::vector<float>& got) {
  std::vector<double> want = AsDoubles(d.c0);
  reference::Gemm(s, AsDoubles(d.a), AsDoubles(d.b), want);
  // The reference writes only C's m × n entries: the padding must still be
  // what it was (NaN compares unequal, so compare bits there).
  std::vector<bool> written(want.size(), false);
  for (int64_t i = 0; i < s.batch; ++i) {
    for (int64_t r = 0; r < s.m; ++r) {
      for (int64_t col = 0; col < s.n; ++col) written[i * s.stride_c + r * s.ldc + col] = true;
    }
  }
  std::vector<float> got_written;
  std::vector<double> want_written;
  for (size_t i = 0; i < got.size(); ++i) {
    if (written[i]) {
      got_written.push_back(got[i]);
      want_written.push_back(want[i]);
    } else {
      EXPECT_EQ(std::memcmp(&got[i], &d.c0[i], sizeof(float)), 0) << "padding at " << i << " changed";
    }
  }
  EXPECT_TRUE(AllNear(got_written, want_written, 1e-4, 1e-4));
}

std::unique_ptr<CpuBackend> Backend(int threads) {
  auto backend = CpuBackend::Create(threads);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return std::move(*backend);
}

// Runs `c` on a backend of `threads` threads; checks it against the
// reference and returns all of C.
std::vector<float> RunCase(int threads, const GemmCase& c, uint64_t seed = 1) {
  auto backend = Backend(threads);
  const CaseData d = MakeData(c.shape, seed);
  DeviceBuffer da = Upload(*backend, d.a), db = Upload(*backend, d.b), dc = Upload(*backend, d.c0);
  EXPECT_TRUE(backend->Gemm(c.shape, da.span<float>(), db.span<float>(), dc.span<float>()).ok());
  std::vector<float> got = Download(*backend, dc);
  ExpectReference(c.shape, d, got);
  return got;
}

// Runs `one` and `two` as one GemmPair; checks each against the reference
// and returns both Cs.
std::pair<std::vector<float>, std::vector<float>> RunPair(int threads, const GemmCase& one, const GemmCase& two) {
  auto backend = Backend(threads);
  const CaseData d1 = MakeData(one.shape, 1), d2 = MakeData(two.shape, 11);
  DeviceBuffer a1 = Upload(*backend, d1.a), b1 = Upload(*backend, d1.b), c1 = Upload(*backend, d1.c0);
  DeviceBuffer a2 = Upload(*backend, d2.a), b2 = Upload(*backend, d2.b), c2 = Upload(*backend, d2.c0);
  EXPECT_TRUE(backend
                  ->GemmPair({one.shape, a1.span<float>(), b1.span<float>(), c1.span<float>()},
                             {two.shape, a2.span<float>(), b2.span<float>(), c2.span<float>()})
                  .ok());
  std::pair<std::vector<float>, std::vector<float>> got{Download(*backend, c1), Download(*backend, c2)};
  ExpectReference(one.shape, d1, got.first);
  ExpectReference(two.shape, d2, got.second);
  return got;
}

TEST(CpuGemmTest, EverySplitMatchesTheReferenceAndLeavesPaddingAlone) {
  for (const GemmCase& c : Cases()) {
    for (int threads : {1, 2, 3, 4, 6}) {  // 4 and 6: grids of rows × columns
      SCOPED_TRACE(::testing::Message() << c.name << ", " << threads << " threads");
      const std::vector<float> first = RunCase(threads, c);
      EXPECT_TRUE(SameBits(first, RunCase(threads, c))) << "a second run gave other bits";
    }
  }
}

TEST(CpuGemmTest, BatchesGiveTheSameBitsOnAnyThreadCount) {
  for (const GemmCase& c : Cases()) {
    if (c.shape.batch < 4) continue;  // items run whole only when there are as many as threads
    SCOPED_TRACE(c.name);
    const std::vector<float> one = RunCase(1, c);
    EXPECT_TRUE(SameBits(one, RunCase(2, c)));
    EXPECT_TRUE(SameBits(one, RunCase(3, c)));
  }
}

// A pair on an even thread count gives each GEMM half the threads, so each
// C has the bits of that GEMM alone on half as many (on two: whole, on one
// thread); on an odd count, or with a GEMM too small to split, the two run
// one after the other, as Gemm on all of them. (The bits of a GEMM cut in
// other pieces may differ: OpenBLAS's edge kernels for a piece's last rows
// and columns need not add in the same order, as its Zen kernels do not.)
TEST(CpuGemmTest, PairsMatchTheReferenceAndEachGemmOnItsShareOfTheThreads) {
  const std::vector<GemmCase> cases = Cases();
  for (size_t i = 0; i < cases.size(); ++i) {
    const GemmCase& one = cases[i];
    const GemmCase& two = cases[(i + 1) % cases.size()];
    for (int threads : {1, 2, 3, 4, 6}) {
      SCOPED_TRACE(::testing::Message() << one.name << " with " << two.name << ", " << threads << " threads");
      const auto got = RunPair(threads, one, two);
      const int share = cpu::PairRunsSplit(threads, one.shape, two.shape) ? threads / 2 : threads;
      EXPECT_TRUE(SameBits(got.first, RunCase(share, one, 1)));
      EXPECT_TRUE(SameBits(got.second, RunCase(share, two, 11)));
    }
  }
}

}  // namespace
}  // namespace shardline::worker
