// The CPU backend's own kernels: the tiled attention kernel against the
// composed attention (the oracle) and the float64 reference, and every
// threaded kernel giving the same bits on one thread as on several.
#include <functional>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/backend/reference_ops.h"
#include "worker/backend/attention.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace shardline::worker {
namespace {

using testing::AllNear;
using testing::AsDoubles;
using testing::Download;
using testing::RandomVector;
using testing::SameBits;
using testing::Upload;

std::unique_ptr<CpuBackend> Cpu(int threads) {
  auto backend = CpuBackend::Create(threads);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return std::move(*backend);
}

struct AttentionResult {
  std::vector<float> out, saved, dqkv;
};

// Forward, then backward onto a dqkv that already holds values (it adds).
// The kernel gets no scratch at all: it needs none.
AttentionResult RunAttention(Backend& backend, const AttentionShape& s, bool composed) {
  const size_t c = static_cast<size_t>(s.heads * s.head_dim), rows = static_cast<size_t>(s.batch * s.t);
  const size_t probs_n = static_cast<size_t>(s.batch * s.heads * s.t * s.t);
  DeviceBuffer qkv = Upload(backend, RandomVector(rows * 3 * c, 1, -2.0f, 2.0f));
  DeviceBuffer dout = Upload(backend, RandomVector(rows * c, 2));
  DeviceBuffer dqkv = Upload(backend, RandomVector(rows * 3 * c, 3));
  DeviceBuffer out = *backend.AllocateZeros(rows * c);
  auto f = [](DeviceBuffer& b) { return b.span<float>(); };
  if (composed) {
    DeviceBuffer probs = *backend.AllocateZeros(probs_n), scratch = *backend.AllocateZeros(probs_n);
    EXPECT_TRUE(ComposedAttentionForward(backend, s, f(qkv), f(out), f(probs)).ok());
    EXPECT_TRUE(ComposedAttentionBackward(backend, s, f(qkv), f(out), f(probs), f(dout), f(dqkv), f(scratch)).ok());
    return {Download(backend, out), Download(backend, probs), Download(backend, dqkv)};
  }
  EXPECT_EQ(*AttentionScratchFloats(backend, s), 0);
  // Sequences of one key tile keep their weights; longer ones a float per query.
  const size_t saved_n = static_cast<size_t>(*AttentionSavedFloats(backend, s));
  EXPECT_EQ(saved_n, s.t <= 256 ? probs_n : rows * static_cast<size_t>(s.heads));
  DeviceBuffer saved = *backend.AllocateZeros(saved_n);
  EXPECT_TRUE(AttentionForward(backend, s, f(qkv), f(out), f(saved)).ok());
  EXPECT_TRUE(AttentionBackward(backend, s, f(qkv), f(out), f(saved), f(dout), f(dqkv), {}).ok());
  return {Download(backend, out), Download(backend, saved), Download(backend, dqkv)};
}

TEST(CpuKernelsTest, AttentionKernelMatchesTheComposedAttention) {
  auto backend = Cpu(2);
  ASSERT_TRUE(backend->has_attention_kernel());
  // Lengths below, at and across the kernel's 32-query tiles, and across its
  // 256-key tiles (where a row's maximum and sum run over several tiles).
  for (const AttentionShape& s : {AttentionShape{2, 45, 3, 16}, AttentionShape{1, 128, 2, 64},
                                  AttentionShape{3, 1, 2, 8}, AttentionShape{2, 32, 4, 8},
                                  AttentionShape{1, 70, 1, 24}, AttentionShape{1, 300, 2, 16},
                                  AttentionShape{2, 600, 1, 8}}) {
    SCOPED_TRACE(::testing::Message() << "B" << s.batch << " T" << s.t << " H" << s.heads << " d" << s.head_dim);
    const AttentionResult kernel = RunAttention(*backend, s, false);
    const AttentionResult oracle = RunAttention(*backend, s, true);
    if (s.t <= 256) {  // the weights the kernel keeps (its masked entries unwritten: compare the rest)
      std::vector<float> kept;
      std::vector<double> want;
      for (size_t e = 0; e < oracle.saved.size(); ++e) {
        const int64_t i = static_cast<int64_t>(e / s.t) % s.t, j = static_cast<int64_t>(e % s.t);
        if (j > i) continue;
        kept.push_back(kernel.saved[e]);
        want.push_back(oracle.saved[e]);
      }
      EXPECT_TRUE(AllNear(kept, want, 1e-6, 1e-5));
    }
    EXPECT_TRUE(AllNear(kernel.out, AsDoubles(oracle.out), 1e-6, 1e-5));
    EXPECT_TRUE(AllNear(kernel.dqkv, AsDoubles(oracle.dqkv), 1e-5, 1e-4));
  }
}

// Long rows against the float64 reference, with scores large enough that a
// row's maximum moves from one key tile to the next (the rescaling).
TEST(CpuKernelsTest, TiledAttentionMatchesTheReferenceAcrossKeyTiles) {
  auto backend = Cpu(2);
  const AttentionShape s{1, 530, 2, 8};
  const size_t c = 16, rows = 530;
  std::vector<float> qkv = RandomVector(rows * 3 * c, 5, -3.0f, 3.0f);
  for (size_t r = 0; r < rows; ++r) {  // keys grow along the sequence: later tiles hold larger scores
    for (size_t j = c; j < 2 * c; ++j) qkv[r * 3 * c + j] *= 1.0f + static_cast<float>(r) / 100.0f;
  }
  DeviceBuffer dqkv_in = Upload(*backend, qkv);
  DeviceBuffer out = *backend->AllocateZeros(rows * c), lse = *backend->AllocateZeros(2 * rows);
  ASSERT_TRUE(AttentionForward(*backend, s, dqkv_in.span<float>(), out.span<float>(), lse.span<float>()).ok());
  EXPECT_TRUE(AllNear(Download(*backend, out), reference::Attention(s, AsDoubles(qkv)), 1e-5, 1e-4));
}

// Every kernel the pool splits, at sizes that split, run by `backend`;
// returns each kernel's outputs in order.
std::vector<std::vector<float>> RunThreadedKernels(Backend& backend) {
  constexpr int64_t kRows = 300, kCols = 700;  // not multiples of the parts
  const size_t n = static_cast<size_t>(kRows * kCols);
  std::vector<std::vector<float>> outputs;
  auto f = [](DeviceBuffer& b) { return b.span<float>(); };
  DeviceBuffer x = Upload(backend, RandomVector(n, 11)), dy = Upload(backend, RandomVector(n, 12));
  DeviceBuffer y = Upload(backend, RandomVector(n, 13)), dx = Upload(backend, RandomVector(n, 14));
  DeviceBuffer gamma = Upload(backend, RandomVector(kCols, 15)), beta = Upload(backend, RandomVector(kCols, 16));
  DeviceBuffer dgamma = Upload(backend, RandomVector(kCols, 17)), dbeta = Upload(backend, RandomVector(kCols, 18));
  DeviceBuffer stats = *backend.AllocateZeros(2 * kRows);
  auto mean = f(stats).subspan(0, kRows), rstd = f(stats).subspan(kRows, kRows);
  const LayerNormShape ln{kRows, kCols, 1e-5f};
  EXPECT_TRUE(backend.LayerNormForward(ln, f(x), f(gamma), f(beta), f(y), mean, rstd).ok());
  outputs.push_back(Download(backend, y));
  outputs.push_back(Download(backend, stats));
  EXPECT_TRUE(backend.LayerNormBackward(ln, f(x), f(gamma), mean, rstd, f(dy), f(dx), f(dgamma), f(dbeta)).ok());
  for (DeviceBuffer* b : {&dx, &dgamma, &dbeta}) outputs.push_back(Download(backend, *b));
  EXPECT_TRUE(backend.SumRows(f(x), f(dgamma), kRows, kCols).ok());
  EXPECT_TRUE(backend.BiasAdd(f(y), f(beta), kRows, kCols).ok());
  EXPECT_TRUE(backend.GeluForward(f(x), f(y)).ok());
  EXPECT_TRUE(backend.GeluBackward(f(x), f(dy), f(dx)).ok());
  EXPECT_TRUE(backend.Axpy(0.5f, f(x), f(y)).ok());
  for (DeviceBuffer* b : {&dgamma, &y, &dx}) outputs.push_back(Download(backend, *b));
  const SoftmaxShape softmax{kRows * kCols / (50 * 50), 50, 0.3f};
  DeviceBuffer probs = *backend.AllocateZeros(n);
  EXPECT_TRUE(backend.CausalSoftmaxForward(softmax, f(x), f(probs)).ok());
  EXPECT_TRUE(backend.CausalSoftmaxBackward(softmax, f(probs), f(dy), f(dx)).ok());
  outputs.push_back(Download(backend, probs));
  outputs.push_back(Download(backend, dx));
  DeviceBuffer m = *backend.AllocateZeros(n), v = *backend.AllocateZeros(n);
  for (int64_t step = 1; step <= 2; ++step) {
    EXPECT_TRUE(backend.AdamWUpdate(AdamWStep{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step}, f(y), f(dy), f(m), f(v)).ok());
  }
  outputs.push_back(Download(backend, y));
  std::vector<int32_t> host_targets(kRows);
  for (int64_t r = 0; r < kRows; ++r) host_targets[r] = r % 11 == 0 ? -1 : static_cast<int32_t>(r * 37 % kCols);
  DeviceBuffer targets = Upload(backend, host_targets);
  DeviceBuffer losses = *backend.AllocateZeros(kRows), parts = *backend.AllocateZeros(3 * kRows);
  const CrossEntropyShape ce{kRows, kCols};
  EXPECT_TRUE(backend.CrossEntropyForward(ce, f(x), targets.span<int32_t>(), f(losses)).ok());
  EXPECT_TRUE(backend.CrossEntropyBackward(ce, f(x), targets.span<int32_t>(), 0.01f, f(dx)).ok());
  EXPECT_TRUE(backend.CrossEntropyParts(ce, f(x), targets.span<int32_t>(), f(parts)).ok());
  for (DeviceBuffer* b : {&losses, &dx, &parts}) outputs.push_back(Download(backend, *b));
  const std::vector<DeviceSpan<const float>> pieces = {f(x).subspan(0, 1000), f(x).subspan(1000, 70000),
                                                       f(dy)};
  auto sums = backend.SumsOfSquares(pieces);
  EXPECT_TRUE(sums.ok());
  outputs.push_back(std::vector<float>(sums->begin(), sums->end()));
  const AttentionResult attention = RunAttention(backend, AttentionShape{3, 40, 2, 16}, false);
  for (const auto* part : {&attention.out, &attention.saved, &attention.dqkv}) outputs.push_back(*part);
  return outputs;
}

TEST(CpuKernelsTest, ThreadedKernelsGiveTheSameBitsOnOneThreadAsOnSeveral) {
  std::vector<std::vector<float>> one, several;
  {
    auto backend = Cpu(1);
    one = RunThreadedKernels(*backend);
  }
  {
    auto backend = Cpu(3);  // more threads than cores: parts land anywhere
    several = RunThreadedKernels(*backend);
  }
  ASSERT_EQ(one.size(), several.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(SameBits(one[i], several[i])) << "output " << i;
}

}  // namespace
}  // namespace shardline::worker
