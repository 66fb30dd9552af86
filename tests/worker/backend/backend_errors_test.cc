// Bad arguments to a backend return a clear error and leave memory alone; the
// backend keeps working afterwards. Run over every backend built.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "worker/backend/attention.h"
#include "worker/backend/backend_factory.h"

namespace shardline::worker {
namespace {

using testing::BackendTest;
using testing::Download;
using testing::RandomVector;
using testing::Upload;

class BackendErrorsTest : public BackendTest {
 protected:
  // An op that fails on data may only notice it when the work runs (CUDA):
  // then the next Synchronize() reports it.
  absl::Status RunAndSync(absl::Status status) {
    if (!status.ok()) return status;
    return backend().Synchronize();
  }
};

TEST_P(BackendErrorsTest, GemmRejectsShortOperandAndLeavesCUntouched) {
  GemmShape s;
  s.m = 4;
  s.n = 4;
  s.k = 4;
  DeviceBuffer a = Upload(backend(), RandomVector(15, 1));  // needs 16
  DeviceBuffer b = Upload(backend(), RandomVector(16, 2));
  const auto c0 = RandomVector(16, 3);
  DeviceBuffer c = Upload(backend(), c0);
  const absl::Status status = backend().Gemm(s, a.span<float>(), b.span<float>(), c.span<float>());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("A has 15 elements, needs 16"), std::string::npos) << status;
  EXPECT_EQ(Download(backend(), c), c0);
}

TEST_P(BackendErrorsTest, GemmRejectsBadDimensionsAndStrides) {
  DeviceBuffer buf = Upload(backend(), RandomVector(64, 1));
  auto span = buf.span<float>();
  GemmShape s;
  s.m = -1;
  s.n = 2;
  s.k = 2;
  EXPECT_EQ(backend().Gemm(s, span, span, span).code(), absl::StatusCode::kInvalidArgument);
  s.m = 2;
  s.lda = 1;  // fewer than k = 2 columns
  EXPECT_EQ(backend().Gemm(s, span, span, span).code(), absl::StatusCode::kInvalidArgument);
  s.lda = 0;
  s.batch = 0;
  EXPECT_EQ(backend().Gemm(s, span, span, span).code(), absl::StatusCode::kInvalidArgument);
  s.batch = 2;
  s.stride_c = 0;  // two C matrices on top of each other
  EXPECT_EQ(backend().Gemm(s, span, span, span).code(), absl::StatusCode::kInvalidArgument);
  s.batch = 1;
  s.m = int64_t{1} << 40;  // beyond what BLAS can index
  EXPECT_EQ(backend().Gemm(s, span, span, span).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendErrorsTest, GemmPairRejectsOverlapsAndBadShapesAndLeavesBothCsUntouched) {
  GemmShape s;
  s.m = 4;
  s.n = 4;
  s.k = 4;
  DeviceBuffer a = Upload(backend(), RandomVector(16, 1));
  DeviceBuffer b = Upload(backend(), RandomVector(16, 2));
  const auto c0 = RandomVector(32, 3);
  DeviceBuffer c = Upload(backend(), c0);
  auto cs = c.span<float>();
  const DeviceSpan<const float> av = a.span<float>(), bv = b.span<float>();
  auto expect_invalid = [&](const GemmCall& first, const GemmCall& second, const std::string& says) {
    const absl::Status status = backend().GemmPair(first, second);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(says), std::string::npos) << status;
    EXPECT_EQ(Download(backend(), c), c0);
  };
  // The two Cs share 4 elements; then the second reads what the first writes.
  expect_invalid({s, av, bv, cs.subspan(0, 16)}, {s, av, bv, cs.subspan(12, 16)}, "overlaps");
  expect_invalid({s, av, bv, cs.subspan(0, 16)}, {s, cs.subspan(0, 16), bv, cs.subspan(16, 16)}, "overlaps");
  expect_invalid({s, cs.subspan(16, 16), bv, cs.subspan(0, 16)}, {s, av, bv, cs.subspan(16, 16)}, "overlaps");
  // Each call is checked as Gemm checks it, and named.
  GemmShape bad = s;
  bad.k = -1;
  expect_invalid({s, av, bv, cs.subspan(0, 16)}, {bad, av, bv, cs.subspan(16, 16)}, "GemmPair (second)");
  expect_invalid({s, av.subspan(0, 15), bv, cs.subspan(0, 16)}, {s, av, bv, cs.subspan(16, 16)},
                 "GemmPair (first): A has 15 elements, needs 16");
  // Both reading the same A and B is fine; so is an empty second GEMM.
  ASSERT_TRUE(RunAndSync(backend().GemmPair({s, av, bv, cs.subspan(0, 16)}, {s, av, bv, cs.subspan(16, 16)})).ok());
  const std::vector<float> both = Download(backend(), c);
  EXPECT_TRUE(std::equal(both.begin(), both.begin() + 16, both.begin() + 16));
  GemmShape empty = s;
  empty.m = 0;
  EXPECT_TRUE(RunAndSync(backend().GemmPair({s, av, bv, cs.subspan(0, 16)}, {empty, av, bv, {}})).ok());
}

TEST_P(BackendErrorsTest, NullDataIsRejected) {
  DeviceSpan<float> null(nullptr, 0);
  DeviceBuffer x = Upload(backend(), RandomVector(8, 1));
  EXPECT_EQ(backend().BiasAdd(x.span<float>(), null, 2, 4).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend().GeluForward(x.span<float>(), DeviceSpan<float>(nullptr, 8)).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<DeviceSpan<const float>> one_null = {x.span<float>(), DeviceSpan<const float>(nullptr, 8)};
  EXPECT_EQ(backend().SumsOfSquares(one_null).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendErrorsTest, MismatchedElementCountsAreRejected) {
  DeviceBuffer a = Upload(backend(), RandomVector(8, 1)), b = Upload(backend(), RandomVector(7, 2));
  EXPECT_EQ(backend().Axpy(1.0f, a.span<float>(), b.span<float>()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend().Add(a.span<float>(), b.span<float>(), a.span<float>()).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> host(4);
  EXPECT_EQ(backend().CopyToHost(DeviceSpan<const float>(a.span<float>()), absl::Span<float>(host)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendErrorsTest, OverflowingShapesAreRejected) {
  DeviceBuffer x = Upload(backend(), RandomVector(8, 1));
  const int64_t huge = int64_t{1} << 40;
  EXPECT_EQ(backend().SumRows(x.span<float>(), x.span<float>(), huge, huge).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend().BiasAdd(x.span<float>(), x.span<float>(), -2, 4).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendErrorsTest, LayerNormRejectsShortParametersAndBadEps) {
  const LayerNormShape shape{2, 4, 1e-5f};
  DeviceBuffer x = Upload(backend(), RandomVector(8, 1)), gamma = Upload(backend(), RandomVector(3, 2));
  DeviceBuffer beta = Upload(backend(), RandomVector(4, 3)), y = Upload(backend(), RandomVector(8, 4));
  DeviceBuffer stats = Upload(backend(), RandomVector(2, 5));
  EXPECT_EQ(backend().LayerNormForward(shape, x.span<float>(), gamma.span<float>(),
                                       beta.span<float>(), y.span<float>(), stats.span<float>(),
                                       stats.span<float>()).code(),
            absl::StatusCode::kInvalidArgument);
  const LayerNormShape no_eps{2, 4, 0.0f};
  EXPECT_EQ(backend().LayerNormForward(no_eps, x.span<float>(), beta.span<float>(),
                                       beta.span<float>(), y.span<float>(), stats.span<float>(),
                                       stats.span<float>()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendErrorsTest, OutOfRangeTokenIdIsReportedAndBackendRecovers) {
  const EmbeddingShape shape{3, 4, 2};
  DeviceBuffer table = Upload(backend(), RandomVector(8, 1));
  DeviceBuffer bad_ids = Upload(backend(), std::vector<int32_t>{0, 4, 1});
  DeviceBuffer out = Upload(backend(), RandomVector(6, 2));
  EXPECT_EQ(RunAndSync(backend().EmbeddingForward(shape, bad_ids.span<int32_t>(),
                                                  table.span<float>(), out.span<float>(), false))
                .code(),
            absl::StatusCode::kInvalidArgument);
  DeviceBuffer negative = Upload(backend(), std::vector<int32_t>{0, -1, 1});
  EXPECT_EQ(RunAndSync(backend().EmbeddingBackward(shape, negative.span<int32_t>(),
                                                   out.span<float>(), table.span<float>()))
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The error is consumed: good work afterwards succeeds.
  DeviceBuffer good = Upload(backend(), std::vector<int32_t>{0, 3, 1});
  EXPECT_TRUE(RunAndSync(backend().EmbeddingForward(shape, good.span<int32_t>(),
                                                    table.span<float>(), out.span<float>(), false))
                  .ok());
}

TEST_P(BackendErrorsTest, TargetAtVocabSizeIsReported) {
  const CrossEntropyShape shape{2, 5};
  DeviceBuffer logits = Upload(backend(), RandomVector(10, 1));
  DeviceBuffer targets = Upload(backend(), std::vector<int32_t>{1, 5});
  DeviceBuffer losses = Upload(backend(), RandomVector(2, 2));
  EXPECT_EQ(RunAndSync(backend().CrossEntropyForward(shape, logits.span<float>(),
                                                     targets.span<int32_t>(), losses.span<float>()))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunAndSync(backend().CrossEntropyBackward(shape, logits.span<float>(),
                                                      targets.span<int32_t>(), 1.0f,
                                                      logits.span<float>()))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend().Synchronize().ok());
}

// A slice's ids and targets are checked against the whole vocabulary, not
// its rows; a slice outside the vocabulary, or a slice's backward without
// the rows' log-sum-exp, is refused before anything runs.
TEST_P(BackendErrorsTest, VocabularySlicesCheckIdsAgainstTheWholeVocabulary) {
  DeviceBuffer table = Upload(backend(), RandomVector(2 * 3, 1));
  DeviceBuffer out = Upload(backend(), RandomVector(3 * 3, 2));
  DeviceBuffer in_range = Upload(backend(), std::vector<int32_t>{0, 5, 3});   // rows 2 and 3 held
  DeviceBuffer too_big = Upload(backend(), std::vector<int32_t>{0, 6, 3});    // 6 ≥ total
  const EmbeddingShape slice{3, 2, 3, 2, 6};
  EXPECT_TRUE(RunAndSync(backend().EmbeddingForward(slice, in_range.span<int32_t>(), table.span<float>(),
                                                    out.span<float>(), false))
                  .ok());
  EXPECT_EQ(RunAndSync(backend().EmbeddingForward(slice, too_big.span<int32_t>(), table.span<float>(),
                                                  out.span<float>(), false))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend().EmbeddingForward(EmbeddingShape{3, 2, 3, 5, 6}, in_range.span<int32_t>(),
                                       table.span<float>(), out.span<float>(), false).code(),
            absl::StatusCode::kInvalidArgument);
  const CrossEntropyShape classes{3, 2, 2, 6};
  DeviceBuffer logits = Upload(backend(), RandomVector(3 * 2, 3));
  DeviceBuffer parts = Upload(backend(), RandomVector(3 * 3, 4));
  EXPECT_TRUE(RunAndSync(backend().CrossEntropyParts(classes, logits.span<float>(), in_range.span<int32_t>(),
                                                     parts.span<float>()))
                  .ok());
  EXPECT_EQ(RunAndSync(backend().CrossEntropyParts(classes, logits.span<float>(), too_big.span<int32_t>(),
                                                   parts.span<float>()))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend().CrossEntropyBackward(classes, logits.span<float>(), in_range.span<int32_t>(), 1.0f,
                                           logits.span<float>()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend().CrossEntropyForward(classes, logits.span<float>(), in_range.span<int32_t>(),
                                          parts.span<float>()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend().Synchronize().ok());
}

TEST_P(BackendErrorsTest, OptimizerRejectsBadHyperparameters) {
  DeviceBuffer p = Upload(backend(), RandomVector(4, 1));
  AdamWStep adam;
  adam.step = 0;
  EXPECT_EQ(backend().AdamWUpdate(adam, p.span<float>(), p.span<float>(), p.span<float>(),
                                  p.span<float>()).code(),
            absl::StatusCode::kInvalidArgument);
  adam.step = 1;
  adam.beta2 = 1.0f;
  EXPECT_EQ(backend().AdamWUpdate(adam, p.span<float>(), p.span<float>(), p.span<float>(),
                                  p.span<float>()).code(),
            absl::StatusCode::kInvalidArgument);
  SgdStep sgd;
  sgd.momentum = -1.0f;
  EXPECT_EQ(backend().SgdMomentumUpdate(sgd, p.span<float>(), p.span<float>(), p.span<float>())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendErrorsTest, ConversionRejectsNonHalfDtypes) {
  DeviceBuffer x = Upload(backend(), RandomVector(4, 1));
  auto half = backend().Allocate(8);
  ASSERT_TRUE(half.ok());
  EXPECT_EQ(backend().ConvertFromF32(x.span<float>(), common::DType::kI32, half->span<uint16_t>())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend().ConvertToF32(half->span<uint16_t>(), common::DType::kF32, x.span<float>())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendErrorsTest, AttentionRejectsBadShapesAndShortBuffers) {
  DeviceBuffer buf = Upload(backend(), RandomVector(5000, 1));
  auto span = buf.span<float>();
  EXPECT_EQ(AttentionForward(backend(), AttentionShape{1, 4, 0, 4}, span, span, span).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AttentionSavedFloats(backend(), AttentionShape{1, 4, 0, 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AttentionScratchFloats(backend(), AttentionShape{-1, 4, 1, 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const AttentionShape shape{2, 8, 2, 8};  // qkv 768, out 256, weights 256 floats
  auto status = AttentionForward(backend(), shape, span, span.subspan(0, 10), span);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("out has 10 elements, needs 256"), std::string::npos) << status;
  status = AttentionBackward(backend(), shape, span, span, span.subspan(0, 255), span, span, span);
  EXPECT_NE(status.message().find("saved has 255 elements, needs 256"), std::string::npos) << status;
  if (!backend().has_attention_kernel()) {  // the composed version's scratch: the weights' size
    status = AttentionBackward(backend(), shape, span, span, span, span, span, span.subspan(0, 200));
    EXPECT_NE(status.message().find("scratch has 200 elements, needs 256"), std::string::npos) << status;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendErrorsTest,
                         ::testing::ValuesIn(testing::BackendsUnderTest()),
                         testing::BackendTestName);

TEST(BackendFactoryTest, UnknownDevicesAreInvalidArguments) {
  for (const char* device : {"tpu", "", "cuda:", "cuda:x", "cuda:-1", "CPU"}) {
    auto backend = CreateBackend(device);
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument) << device;
  }
}

TEST(BackendFactoryTest, CpuBackendIsAlwaysAvailable) {
  auto backend = CreateBackend("cpu", BackendOptions{1});
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->name(), "cpu");
  EXPECT_NE((*backend)->description().find("BLAS"), std::string::npos);
  EXPECT_EQ(CreateBackend("cpu", BackendOptions{-1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BackendFactoryTest, CudaWithoutDeviceSaysWhy) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  auto backend = CreateBackend("cuda:0");
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), CudaCompiledIn() ? absl::StatusCode::kFailedPrecondition
                                                      : absl::StatusCode::kUnimplemented)
      << backend.status();
}

TEST(CudaFactoryTest, CudaDevicePastTheLastIsNotFound) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  auto backend = CreateBackend("cuda:" + std::to_string(CudaDeviceCount()));
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shardline::worker
