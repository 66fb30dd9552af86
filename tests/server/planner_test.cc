#include "server/planner.h"

#include <chrono>
#include <functional>
#include <limits>
#include <random>

#include "common/cost_model.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"

namespace shardline::server {
namespace {

shardline::v1::JobSpec Spec(int layers, int stages, const std::string& schedule = "1f1b") {
  auto spec = common::ParseJobSpec(R"({"name": "p",
    "model": {"kind": "gpt", "vocab_size": 256, "context": 128, "d_model": 512, "n_heads": 8, "n_layers": )" +
                                   std::to_string(layers) + R"(},
    "data": {"kind": "text_bytes", "path": "/x"},
    "train": {"steps": 10, "global_batch": 32, "micro_batches": 8, "seed": 1,
              "optimizer": {"kind": "adamw", "lr": 0.001}},
    "parallel": {"pipeline_stages": )" + std::to_string(stages) +
                                   R"(, "schedule": ")" + schedule + R"("}})");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

constexpr int64_t kGiB = int64_t{1} << 30;

int Blocks(const StagePlan& s) { return s.unit_end - s.unit_begin; }

TEST(PlannerTest, EqualWorkersGetBalancedContiguousStages) {
  auto plan = PlanPipeline(Spec(8, 2), {{"a", 1e11, 8 * kGiB}, {"b", 1e11, 8 * kGiB}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 2u);
  EXPECT_EQ(plan->stages[0].unit_begin, 0);
  EXPECT_EQ(plan->stages[0].unit_end, plan->stages[1].unit_begin);
  EXPECT_EQ(plan->stages[1].unit_end, 10);
  EXPECT_LE(std::abs(Blocks(plan->stages[0]) - Blocks(plan->stages[1])), 1);
  EXPECT_NEAR(plan->bubble_fraction, 1.0 / 9, 1e-12);
  const double slowest = std::max(plan->stages[0].seconds_per_micro_batch,
                                  plan->stages[1].seconds_per_micro_batch);
  EXPECT_NEAR(plan->predicted_step_seconds, 9 * slowest, 1e-12);
}

// The cut search against every cut there is: on random small models,
// rates and memories (some cuts not fitting, some none), the plan's
// slowest stage is the fastest of all cuts that fit (each cut's own plan:
// PlanPipeline keeps a preferred cut that fits at any slack).
TEST(PlannerTest, TheCutIsTheFastestOfEveryCutThatFits) {
  std::mt19937 rng(20261206);
  const double rates[] = {1e10, 2e10, 3.7e10, 5e10};
  const char* schedules[] = {"1f1b", "gpipe", "zb"};
  int fitting = 0, none = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int layers = 1 + static_cast<int>(rng() % 8), n = layers + 2;
    const int p = 1 + static_cast<int>(rng() % std::min(n, 4));
    const shardline::v1::JobSpec spec = Spec(layers, p, schedules[rng() % 3]);
    auto whole = PlanPipeline(Spec(layers, 1), {{"all", 1e10, 1024 * kGiB}});
    ASSERT_TRUE(whole.ok()) << whole.status();
    std::vector<WorkerCapacity> workers;
    for (int s = 0; s < p; ++s) {
      const double share = 0.4 + 0.015 * static_cast<double>(rng() % 100);
      workers.push_back({"w" + std::to_string(s), rates[rng() % 4],
                         static_cast<int64_t>(share * static_cast<double>(whole->stages[0].memory_bytes))});
    }
    auto slowest = [](const PipelinePlan& plan) {
      double out = 0;
      for (const StagePlan& stage : plan.stages) out = std::max(out, stage.compute_seconds);
      return out;
    };
    double best = std::numeric_limits<double>::infinity();
    std::vector<int> cut(p);
    std::function<void(int)> each = [&](int s) {
      if (s == p) {
        auto plan = PlanPipeline(spec, workers, cut, std::numeric_limits<double>::infinity());
        if (!plan.ok()) return;
        for (int k = 0; k < p; ++k) {
          if (plan->stages[k].unit_begin != cut[k]) return;  // it did not fit
        }
        best = std::min(best, slowest(*plan));
        return;
      }
      for (int a = s == 0 ? 0 : cut[s - 1] + 1; a <= n - (p - s); ++a) {
        if (s == 0 && a > 0) break;
        cut[s] = a;
        each(s + 1);
      }
    };
    each(0);
    auto plan = PlanPipeline(spec, workers);
    if (best == std::numeric_limits<double>::infinity()) {
      ++none;
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << "trial " << trial;
      continue;
    }
    ++fitting;
    ASSERT_TRUE(plan.ok()) << "trial " << trial << ": " << plan.status();
    EXPECT_EQ(slowest(*plan), best) << "trial " << trial << ": " << DescribePlan(*plan);
  }
  EXPECT_GT(fitting, 100) << "fitting trials";
  EXPECT_GT(none, 10) << "trials where nothing fits";
}

// A restart prefers the cut its surviving workers hold state for: kept when
// it fits and is nearly as fast as the best (rates that differ by noise),
// not when another is clearly faster or it no longer fits.
TEST(PlannerTest, APreferredCutIsKeptUnlessClearlySlowerOrTooBig) {
  const std::vector<WorkerCapacity> equal = {{"a", 1e11, 8 * kGiB}, {"b", 1.03e11, 8 * kGiB}};
  auto best = PlanPipeline(Spec(24, 2), equal);
  ASSERT_TRUE(best.ok()) << best.status();
  const int split = best->stages[1].unit_begin;
  // One block of 24 over: a little slower (~8%), within the slack.
  auto kept = PlanPipeline(Spec(24, 2), equal, {0, split + 1});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->stages[1].unit_begin, split + 1);
  EXPECT_EQ(kept->stages[0].unit_end, split + 1);
  EXPECT_GT(kept->predicted_step_seconds, best->predicted_step_seconds);
  EXPECT_LE(kept->predicted_step_seconds, kKeepCutSlack * best->predicted_step_seconds * 1.0000001);
  // Everything but the head on one worker: clearly slower.
  auto lopsided = PlanPipeline(Spec(24, 2), equal, {0, 25});
  ASSERT_TRUE(lopsided.ok());
  EXPECT_EQ(lopsided->stages[1].unit_begin, split);
  // Kept cut that no longer fits the (new) first worker's memory.
  const std::vector<WorkerCapacity> small = {{"a", 1e11, best->stages[0].memory_bytes}, {"b", 1e11, 8 * kGiB}};
  auto too_big = PlanPipeline(Spec(24, 2), small, {0, split + 1});
  ASSERT_TRUE(too_big.ok());
  EXPECT_LE(too_big->stages[0].unit_end, split);
  // Not a cut of p stages: ignored.
  EXPECT_EQ(PlanPipeline(Spec(24, 2), equal, {0, 8, 16})->stages[1].unit_begin, split);
}

TEST(PlannerTest, AFasterWorkerGetsMoreLayers) {
  auto plan = PlanPipeline(Spec(12, 2), {{"slow", 1e11, 8 * kGiB}, {"fast", 3e11, 8 * kGiB}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GE(Blocks(plan->stages[1]), 2 * Blocks(plan->stages[0]));
  EXPECT_EQ(plan->stages[1].worker, "fast");
  // Balanced: neither stage more than a block's time slower than the other.
  const double a = plan->stages[0].seconds_per_micro_batch, b = plan->stages[1].seconds_per_micro_batch;
  EXPECT_LT(std::fabs(a - b) / std::max(a, b), 0.35);
}

// Two workers of one machine measured 8% apart by noise (the issue: a 6/4
// cut of a two-stage model instead of 5/5) get an equal cut; rates farther
// apart than the noise floor and than their probes' spread do not.
TEST(PlannerTest, RatesEqualWithinTheirSpreadGetAnEqualCut) {
  auto noisy = PlanPipeline(Spec(8, 2), {{"a", 1.08e11, 8 * kGiB, 0.03}, {"b", 1e11, 8 * kGiB, 0.02}});
  ASSERT_TRUE(noisy.ok()) << noisy.status();
  EXPECT_EQ(Blocks(noisy->stages[0]), 5);
  EXPECT_EQ(Blocks(noisy->stages[1]), 5);
  // 25% apart, but the probes of one disagreed by 30%: still one rate.
  auto spread = PlanPipeline(Spec(8, 2), {{"a", 1.25e11, 8 * kGiB, 0.3}, {"b", 1e11, 8 * kGiB, 0.02}});
  ASSERT_TRUE(spread.ok()) << spread.status();
  EXPECT_EQ(Blocks(spread->stages[0]), Blocks(spread->stages[1]));
  // 25% apart with tight probes: the faster one takes more.
  auto apart = PlanPipeline(Spec(8, 2), {{"a", 1.25e11, 8 * kGiB, 0.02}, {"b", 1e11, 8 * kGiB, 0.02}});
  ASSERT_TRUE(apart.ok()) << apart.status();
  EXPECT_GT(Blocks(apart->stages[0]), Blocks(apart->stages[1]));
}

// Placed "in_order", the cut balances compute as if the rates were equal
// (the same cut as for equal workers); the prediction is on the real rates.
TEST(PlannerTest, InOrderPlacementCutsAsIfTheRatesWereEqual) {
  auto spec = Spec(12, 2);
  spec.mutable_parallel()->set_placement("in_order");
  const std::vector<WorkerCapacity> uneven = {{"slow", 1e11, 8 * kGiB}, {"fast", 3e11, 8 * kGiB}};
  auto even = PlanPipeline(spec, uneven);
  auto equal = PlanPipeline(Spec(12, 2), {{"a", 1e11, 8 * kGiB}, {"b", 1e11, 8 * kGiB}});
  ASSERT_TRUE(even.ok() && equal.ok()) << even.status();
  EXPECT_EQ(even->stages[1].unit_begin, equal->stages[1].unit_begin);
  EXPECT_NEAR(even->stages[0].compute_seconds, equal->stages[0].compute_seconds, 1e-12);
  EXPECT_LT(even->stages[1].compute_seconds, 0.5 * equal->stages[1].compute_seconds);
  EXPECT_NEAR(even->predicted_step_seconds, 9 * even->stages[0].seconds_per_micro_batch, 1e-12);
  auto planned = PlanPipeline(Spec(12, 2), uneven);
  ASSERT_TRUE(planned.ok());
  EXPECT_LT(planned->predicted_step_seconds, even->predicted_step_seconds);
}

TEST(PlannerTest, EqualizeRatesGroupsFromTheSlowestWithoutChaining) {
  // 1.0, 1.08 and 1.16: the third is within 10% of the second but not of
  // the group's slowest, so it stays apart (no chain of small steps).
  const auto rates = EqualizeRates({{"c", 1.16e11, 1, 0}, {"a", 1.0e11, 1, 0}, {"b", 1.08e11, 1, 0},
                                    {"d", 3e11, 1, 0}});
  ASSERT_EQ(rates.size(), 4u);
  EXPECT_EQ(rates[0].name, "c") << "the order is kept";
  EXPECT_DOUBLE_EQ(rates[1].flops_per_second, 1.04e11);
  EXPECT_DOUBLE_EQ(rates[2].flops_per_second, 1.04e11);
  EXPECT_DOUBLE_EQ(rates[0].flops_per_second, 1.16e11);
  EXPECT_DOUBLE_EQ(rates[3].flops_per_second, 3e11);
}

TEST(PlannerTest, MemoryLimitsMoveLayersAway) {
  // Worker a fits only a few blocks; the plan must give it fewer despite equal speed.
  auto roomy = PlanPipeline(Spec(8, 2), {{"a", 1e11, 8 * kGiB}, {"b", 1e11, 8 * kGiB}});
  ASSERT_TRUE(roomy.ok());
  const int64_t tight = roomy->stages[0].memory_bytes * 2 / 3;
  auto plan = PlanPipeline(Spec(8, 2), {{"a", 1e11, tight}, {"b", 1e11, 8 * kGiB}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_LT(Blocks(plan->stages[0]), Blocks(roomy->stages[0]));
  EXPECT_LE(plan->stages[0].memory_bytes, tight);
}

TEST(PlannerTest, RefusesPlansThatDoNotFitAndSaysWhy) {
  auto plan = PlanPipeline(Spec(8, 2), {{"a", 1e11, 1 << 20}, {"b", 1e11, 1 << 20}});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("worker a"), std::string::npos) << plan.status();
  EXPECT_NE(plan.status().message().find("GiB"), std::string::npos);
}

TEST(PlannerTest, OneFOneBNeedsLessMemoryThanGPipeOnTheFirstStage) {
  const std::vector<WorkerCapacity> w = {{"a", 1e11, 64 * kGiB}, {"b", 1e11, 64 * kGiB}};
  auto one = PlanPipeline(Spec(8, 2, "1f1b"), w);
  auto gpipe = PlanPipeline(Spec(8, 2, "gpipe"), w);
  ASSERT_TRUE(one.ok() && gpipe.ok());
  EXPECT_LT(one->stages[0].memory_bytes, gpipe->stages[0].memory_bytes);
}

// Zero-bubble holds one micro-batch more than 1F1B on every stage, and the
// blocks' kept output gradients: more than 1F1B, less than GPipe (m = 8).
TEST(PlannerTest, ZeroBubbleNeedsMoreMemoryThanOneFOneBAndLessThanGPipe) {
  const std::vector<WorkerCapacity> w = {{"a", 1e11, 64 * kGiB}, {"b", 1e11, 64 * kGiB}};
  auto one = PlanPipeline(Spec(8, 2, "1f1b"), w);
  auto zb = PlanPipeline(Spec(8, 2, "zb"), w);
  auto gpipe = PlanPipeline(Spec(8, 2, "gpipe"), w);
  ASSERT_TRUE(one.ok() && zb.ok() && gpipe.ok());
  ASSERT_EQ(one->stages[0].unit_end, zb->stages[0].unit_end) << "the same cut, for the comparison";
  for (int s = 0; s < 2; ++s) {
    EXPECT_GT(zb->stages[s].memory_bytes, one->stages[s].memory_bytes) << "stage " << s;
    EXPECT_LT(zb->stages[s].memory_bytes, gpipe->stages[s].memory_bytes) << "stage " << s;
  }
  // Its step: 25 slot-thirds against 1F1B's 27 (pipeline_schedule_test's
  // simulation of 2 stages and 8 micro-batches), a 1/25 bubble.
  const double slot = one->predicted_step_seconds / 9;
  EXPECT_NEAR(zb->predicted_step_seconds, 25.0 / 3 * slot, 1e-9 * slot);
  EXPECT_NEAR(zb->bubble_fraction, 1.0 / 25, 1e-12);
}

// ZeRO-1: a replica keeps 1/d of AdamW's m and v, so a stage's estimate
// drops by about (1 − 1/d)·2 of its 4 floats per parameter.
TEST(PlannerTest, AShardedOptimizerNeedsLessMemoryPerWorker) {
  const std::vector<WorkerCapacity> w = {{"a", 1e11, 64 * kGiB}, {"b", 1e11, 64 * kGiB}};
  auto spec = Spec(8, 2);
  spec.mutable_parallel()->set_data_parallel(4);
  auto plain = PlanPipeline(spec, w);
  spec.mutable_parallel()->set_shard_optimizer(true);
  auto sharded = PlanPipeline(spec, w);
  ASSERT_TRUE(plain.ok() && sharded.ok());
  ASSERT_EQ(plain->stages[0].unit_end, sharded->stages[0].unit_end) << "the same cut, for the comparison";
  EXPECT_LT(sharded->stages[0].memory_bytes, plain->stages[0].memory_bytes);
  // Per parameter of the stage: 4 floats become 2 + 2/4.
  double parameters = 0;
  const auto units = common::ModelUnitCosts(spec.model(), spec.model().context());
  for (int u = sharded->stages[0].unit_begin; u < sharded->stages[0].unit_end; ++u) parameters += units[u].parameters;
  EXPECT_NEAR(static_cast<double>(plain->stages[0].memory_bytes - sharded->stages[0].memory_bytes),
              parameters * 4 * 1.5, 2.0);
}

// Long sequences on CPU workers: each block keeps a float per head and
// token instead of its attention weights (common::RecomputesAttentionWeights).
// `spec` planned on two equal roomy workers, without and with `flag` set on
// both; an error unless both plans make the same cut (for comparing them).
struct PlansWithoutAndWith {
  PipelinePlan without, with;
};
absl::StatusOr<PlansWithoutAndWith> PlanWithoutAndWith(const shardline::v1::JobSpec& spec,
                                                       bool WorkerCapacity::*flag) {
  std::vector<WorkerCapacity> w = {{"a", 1e11, 64 * kGiB}, {"b", 1e11, 64 * kGiB}};
  absl::StatusOr<PipelinePlan> without = PlanPipeline(spec, w);
  w[0].*flag = w[1].*flag = true;
  absl::StatusOr<PipelinePlan> with = PlanPipeline(spec, w);
  if (!without.ok()) return without.status();
  if (!with.ok()) return with.status();
  if (without->stages[0].unit_end != with->stages[0].unit_end) {
    return absl::FailedPreconditionError("the two plans cut apart");
  }
  return PlansWithoutAndWith{*std::move(without), *std::move(with)};
}

TEST(PlannerTest, WorkersThatRecomputeAttentionNeedLessMemoryForLongSequences) {
  auto spec = Spec(8, 2);
  spec.mutable_model()->set_context(1024);
  auto plans = PlanWithoutAndWith(spec, &WorkerCapacity::recomputes_attention);
  ASSERT_TRUE(plans.ok()) << plans.status();
  // Stage 0 of 1F1B holds 2 micro-batches of 32 / 8 sequences × 1024 tokens;
  // per block and token, 8 heads × (1024 − 1) floats fewer.
  const int blocks = plans->without.stages[0].unit_end - 1;  // units 1 … are blocks
  EXPECT_EQ(plans->without.stages[0].memory_bytes - plans->with.stages[0].memory_bytes,
            int64_t{2} * 4 * 1024 * blocks * 8 * 1023 * 4);
  EXPECT_TRUE(common::RecomputesAttentionWeights("cpu", 1024));
  EXPECT_FALSE(common::RecomputesAttentionWeights("cpu", common::kCpuAttentionKeyTile));
  EXPECT_FALSE(common::RecomputesAttentionWeights("cuda:0", 1024));
}

// One pass's temporaries are held once per stage, whatever is in flight:
// the blocks' shared set, the head's logit gradient, and on workers that
// compose attention (CUDA) its backward scratch of the weights' size.
TEST(PlannerTest, APassTemporariesCountOncePerStage) {
  auto spec = Spec(8, 2);
  auto plans = PlanWithoutAndWith(spec, &WorkerCapacity::composes_attention);
  ASSERT_TRUE(plans.ok()) << plans.status();
  // A micro-batch: 32 / 8 sequences × 128 tokens; 8 heads × 128 floats a
  // token, once per stage (stage 0 of 1F1B holds 2 micro-batches: not twice).
  const int64_t tokens = 4 * 128;
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(plans->with.stages[s].memory_bytes - plans->without.stages[s].memory_bytes, tokens * 8 * 128 * 4)
        << s;
  }
  // The blocks' set (12 C floats a token) and the head's logit and input
  // gradients (vocabulary + C).
  const auto units = common::ModelUnitCosts(spec.model(), 128);
  EXPECT_EQ(units.back().scratch_bytes_per_token, 4 * (256 + 512));
  EXPECT_EQ(units[1].scratch_bytes_per_token, 4 * 12 * 512);
  // A one-stage pipeline of one block: parameters and state, what one
  // micro-batch keeps (1F1B holds min(1, 8) = 1 in flight), and one set of
  // each temporary; the embedding has none.
  auto one = Spec(1, 1);
  auto single = PlanPipeline(one, {{"a", 1e11, 64 * kGiB}});
  ASSERT_TRUE(single.ok()) << single.status();
  const auto u = common::ModelUnitCosts(one.model(), 128);
  double parameters = 0, saved = 0;
  for (const auto& unit : u) parameters += unit.parameters, saved += unit.saved_bytes_per_token;
  const double edges = u[0].output_bytes_per_token + 2 * u.back().output_bytes_per_token;
  const double want = parameters * 4 * 4 + (saved + edges) * tokens +
                      (u[1].scratch_bytes_per_token + u.back().scratch_bytes_per_token) * tokens;
  EXPECT_EQ(static_cast<double>(single->stages[0].memory_bytes), want);
}

TEST(PlannerTest, BadRequests) {
  EXPECT_EQ(PlanPipeline(Spec(8, 3), {{"a", 1e11, kGiB}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanPipeline(Spec(8, 2), {{"a", 0, kGiB}, {"b", 1e11, kGiB}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlannerTest, LargeModelsPlanQuickly) {
  std::vector<WorkerCapacity> workers;
  for (int i = 0; i < 16; ++i) workers.push_back({"w" + std::to_string(i), 1e12 * (1 + i % 3), 80 * kGiB});
  const auto start = std::chrono::steady_clock::now();
  auto plan = PlanPipeline(Spec(256, 16), workers);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages.size(), 16u);
  EXPECT_FALSE(DescribePlan(*plan).empty());
  // Not a timing assertion on the machine's speed: a generous bound that only
  // an accidentally cubic search would break.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
}

// The hostile-client probe: a spec whose memory overflows int64 (here 1024
// blocks of d_model 8192 with 1024 heads over 65536 tokens, every one of
// 2^20 GPipe micro-batches in flight: about 2^74 bytes) was planned as if it fit.
TEST(PlannerTest, AMemoryEstimateThatOverflowsInt64FitsNowhere) {
  auto spec = common::ParseJobSpec(R"({"name": "huge",
    "model": {"kind": "gpt", "vocab_size": 256, "context": 65536, "d_model": 8192, "n_heads": 1024,
              "n_layers": 1024},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": 10, "global_batch": 1048576, "micro_batches": 1048576, "seed": 1,
              "optimizer": {"kind": "adamw", "lr": 0.001}},
    "parallel": {"pipeline_stages": 2, "schedule": "gpipe"}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2;
  auto plan = PlanPipeline(*spec, {{"a", 1e12, huge}, {"b", 1e12, huge}});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("stage 0"), std::string::npos) << plan.status();
  EXPECT_NE(plan.status().message().find("more bytes than 64-bit arithmetic holds"), std::string::npos)
      << plan.status();
}

TEST(PlannerTest, AStageWhoseCheckpointExceedsAShardIsRefused) {
  // One block of d_model 16384: 12 · 2^28 parameters, 3 copies of 4 bytes: 36 GiB.
  auto spec = common::ParseJobSpec(R"({"name": "wide",
    "model": {"kind": "gpt", "vocab_size": 256, "context": 16, "d_model": 16384, "n_heads": 16, "n_layers": 1},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": 10, "global_batch": 8, "micro_batches": 8, "seed": 1,
              "optimizer": {"kind": "adamw", "lr": 0.001}}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto plan = PlanPipeline(*spec, {{"a", 1e12, int64_t{1} << 40}});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("checkpoint shard"), std::string::npos) << plan.status();
}

}  // namespace
}  // namespace shardline::server
