// ShardRuntime's 16-bit edges (set_edge_dtype): what crosses them is
// rounded, nothing else is.
#include <cmath>
#include <cstring>
#include <vector>

#include "common/half.h"
#include "gtest/gtest.h"
#include "tests/worker/runtime/shard_runtime_fixture.h"
#include "worker/runtime/shard_runtime.h"

namespace shardline::worker::runtime {
namespace {

using testing::ShardRuntimeTest;

// A 16-bit edge: the runtime takes and gives 16-bit values (packed at the
// start of n-float buffers) and computes exactly what an f32 edge does on
// the same values rounded to that precision.
TEST_F(ShardRuntimeTest, HalfPrecisionEdgesEqualTheF32EdgeOnRoundedValues) {
  for (common::DType dtype : {common::DType::kBF16, common::DType::kF16}) {
    SCOPED_TRACE(common::DTypeName(dtype));
    auto narrow = Make(1, 3), wide = Make(1, 3);
    ASSERT_TRUE(narrow->set_edge_dtype(dtype).ok());
    const int64_t rows = batch_.batch * batch_.t;
    const size_t in_n = static_cast<size_t>(rows * wide->input_width());
    const size_t out_n = static_cast<size_t>(rows * wide->output_width());
    auto to_halves = [dtype](const std::vector<float>& v) {
      std::vector<uint16_t> h(v.size());
      if (dtype == common::DType::kBF16) common::ConvertF32ToBf16(v.data(), h.data(), v.size());
      if (dtype == common::DType::kF16) common::ConvertF32ToF16(v.data(), h.data(), v.size());
      return h;
    };
    auto packed = [](const std::vector<uint16_t>& h) {  // n halves in an n-float buffer
      std::vector<float> buffer(h.size());
      std::memcpy(buffer.data(), h.data(), h.size() * 2);
      return buffer;
    };
    auto unpacked = [](const std::vector<float>& buffer) {
      std::vector<uint16_t> h(buffer.size());
      std::memcpy(h.data(), buffer.data(), h.size() * 2);
      return h;
    };
    auto rounded = [&](const std::vector<float>& v) {
      std::vector<float> r(v);
      if (dtype == common::DType::kBF16) common::RoundThroughBf16(r.data(), r.size());
      if (dtype == common::DType::kF16) common::RoundThroughF16(r.data(), r.size());
      return r;
    };
    std::vector<float> acts(in_n), grad(out_n);
    for (size_t i = 0; i < in_n; ++i) acts[i] = std::sin(0.37f * static_cast<float>(i));
    for (size_t i = 0; i < out_n; ++i) grad[i] = 1e-3f * std::cos(0.11f * static_cast<float>(i));

    const std::vector<float> acts_rounded = rounded(acts), acts_packed = packed(to_halves(acts));
    std::vector<float> wide_out(out_n), narrow_out(out_n);
    ASSERT_TRUE(wide->Forward(0, {batch_.batch, batch_.t, {}, {}, 1.0f, acts_rounded},
                              absl::Span<float>(wide_out)).ok());
    auto fwd = narrow->ForwardAsync(0, {batch_.batch, batch_.t, {}, {}, 1.0f, acts_packed},
                                    absl::Span<float>(narrow_out));
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    ASSERT_TRUE(fwd->output_written.Wait().ok());
    EXPECT_EQ(unpacked(narrow_out), to_halves(wide_out));

    const std::vector<float> grad_rounded = rounded(grad), grad_packed = packed(to_halves(grad));
    std::vector<float> wide_gin(in_n), narrow_gin(in_n);
    ASSERT_TRUE(wide->Backward(0, grad_rounded, absl::Span<float>(wide_gin)).ok());
    auto bwd = narrow->BackwardAsync(0, grad_packed, absl::Span<float>(narrow_gin));
    ASSERT_TRUE(bwd.ok()) << bwd.status();
    ASSERT_TRUE(bwd->output_written.Wait().ok());
    EXPECT_EQ(unpacked(narrow_gin), to_halves(wide_gin));
    EXPECT_EQ(Grads(*narrow), Grads(*wide));
  }
  auto runtime = Make(1, 3);
  EXPECT_EQ(runtime->set_edge_dtype(common::DType::kI32).code(), absl::StatusCode::kInvalidArgument);
}

// The last stage's output is the logits, no edge tensor: f32 whatever the
// edge precision (its input edge still 16-bit).
TEST_F(ShardRuntimeTest, TheLastStagesLogitsStayF32OnAHalfPrecisionEdge) {
  auto narrow = Make(1, config_.units()), wide = Make(1, config_.units());
  ASSERT_TRUE(narrow->set_edge_dtype(common::DType::kBF16).ok());
  const int64_t rows = batch_.batch * batch_.t;
  std::vector<float> acts(static_cast<size_t>(rows * wide->input_width()));
  for (size_t i = 0; i < acts.size(); ++i) acts[i] = std::sin(0.37f * static_cast<float>(i));
  std::vector<uint16_t> halves(acts.size());
  common::ConvertF32ToBf16(acts.data(), halves.data(), acts.size());
  std::vector<float> packed(acts.size());
  std::memcpy(packed.data(), halves.data(), halves.size() * 2);
  common::RoundThroughBf16(acts.data(), acts.size());
  std::vector<float> wide_logits(static_cast<size_t>(rows * wide->output_width())), narrow_logits(wide_logits.size());
  ASSERT_TRUE(wide->Forward(0, {batch_.batch, batch_.t, {}, {}, 1.0f, acts}, absl::MakeSpan(wide_logits)).ok());
  ASSERT_TRUE(narrow->Forward(0, {batch_.batch, batch_.t, {}, {}, 1.0f, packed}, absl::MakeSpan(narrow_logits)).ok());
  EXPECT_EQ(narrow_logits, wide_logits);
}

}  // namespace
}  // namespace shardline::worker::runtime
