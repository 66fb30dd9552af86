#include "worker/runtime/pipeline_schedule.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace shardline::worker::runtime {
namespace {

std::string Schedule(ScheduleKind kind, int p, int s, int m) {
  auto actions = BuildSchedule(kind, p, s, m);
  EXPECT_TRUE(actions.ok()) << actions.status();
  return ScheduleString(*actions);
}

// Most micro-batches forwarded but not yet backwarded at any point.
int PeakInFlight(const std::vector<PipelineAction>& actions) {
  int held = 0, peak = 0;
  for (const auto& a : actions) {
    held += a.type == PipelineAction::Type::kForward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

TEST(PipelineScheduleTest, OneFOneBWarmsUpByDistanceToTheLastStage) {
  EXPECT_EQ(Schedule(ScheduleKind::kOneFOneB, 3, 0, 5), "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4");
  EXPECT_EQ(Schedule(ScheduleKind::kOneFOneB, 3, 1, 5), "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4");
  EXPECT_EQ(Schedule(ScheduleKind::kOneFOneB, 3, 2, 5), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4");
  EXPECT_EQ(Schedule(ScheduleKind::kOneFOneB, 4, 0, 2), "F0 F1 B0 B1");
}

TEST(PipelineScheduleTest, GPipeRunsAllForwardsFirst) {
  EXPECT_EQ(Schedule(ScheduleKind::kGPipe, 2, 0, 3), "F0 F1 F2 B0 B1 B2");
}

TEST(PipelineScheduleTest, OneFOneBHoldsAtMostStagesInFlight) {
  for (int p = 1; p <= 5; ++p) {
    for (int m = 1; m <= 9; ++m) {
      for (int s = 0; s < p; ++s) {
        auto one = BuildSchedule(ScheduleKind::kOneFOneB, p, s, m);
        auto gpipe = BuildSchedule(ScheduleKind::kGPipe, p, s, m);
        ASSERT_TRUE(one.ok() && gpipe.ok());
        EXPECT_EQ(PeakInFlight(*one), std::min(p - s, m)) << p << " " << s << " " << m;
        EXPECT_EQ(PeakInFlight(*gpipe), m);
        // Every micro-batch once forward, once backward, backward in index order.
        int next_b = 0;
        std::vector<bool> forwarded(m, false);
        for (const auto& a : *one) {
          if (a.type == PipelineAction::Type::kForward) {
            forwarded[a.micro_batch] = true;
          } else {
            EXPECT_TRUE(forwarded[a.micro_batch]);
            EXPECT_EQ(a.micro_batch, next_b++);
          }
        }
        EXPECT_EQ(next_b, m);
      }
    }
  }
}

TEST(PipelineScheduleTest, ZeroBubbleSplitsBackwardAndFillsTheWaitsWithWeights) {
  EXPECT_EQ(Schedule(ScheduleKind::kZeroBubble, 2, 0, 8),
            "F0 F1 B0 F2 B1 W0 F3 B2 W1 F4 B3 W2 F5 B4 W3 F6 B5 W4 F7 B6 W5 W6 B7 W7");
  EXPECT_EQ(Schedule(ScheduleKind::kZeroBubble, 2, 1, 8),
            "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 F4 B4 W3 F5 B5 W4 F6 B6 W5 F7 B7 W6 W7");
  EXPECT_EQ(Schedule(ScheduleKind::kZeroBubble, 1, 0, 3), "F0 B0 F1 B1 W0 F2 B2 W1 W2");
}

TEST(PipelineScheduleTest, ZeroBubbleKeepsOneFOneBOrderAndHoldsOneMore) {
  using Type = PipelineAction::Type;
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 12; ++m) {
      for (int s = 0; s < p; ++s) {
        auto zb = BuildSchedule(ScheduleKind::kZeroBubble, p, s, m);
        auto one = BuildSchedule(ScheduleKind::kOneFOneB, p, s, m);
        ASSERT_TRUE(zb.ok() && one.ok());
        EXPECT_EQ(PeakHeldSlots(*zb), std::min(p - s + 1, m)) << p << " " << s << " " << m;
        // Without the weight parts, 1F1B's order (the same messages in the
        // same order on every link: no new way to deadlock).
        std::vector<PipelineAction> without_w;
        int next_w = 0;
        std::vector<bool> input_done(m, false);
        for (const auto& a : *zb) {
          if (a.type == Type::kBackwardWeights) {
            EXPECT_TRUE(input_done[a.micro_batch]);
            EXPECT_EQ(a.micro_batch, next_w++);  // weight gradients in micro-batch order
            continue;
          }
          if (a.type == Type::kBackwardInput) input_done[a.micro_batch] = true;
          without_w.push_back(a.type == Type::kBackwardInput ? PipelineAction{Type::kBackward, a.micro_batch} : a);
        }
        EXPECT_EQ(next_w, m);
        EXPECT_EQ(ScheduleString(without_w), ScheduleString(*one));
      }
    }
  }
}

TEST(PipelineScheduleTest, SimulatedStepIsShorterWithZeroBubble) {
  // Unit costs: F = 1, B = 2 (its parts 1 + 1).
  EXPECT_EQ(*SimulatedStepUnits(ScheduleKind::kOneFOneB, 2, 8), 27);
  EXPECT_EQ(*SimulatedStepUnits(ScheduleKind::kZeroBubble, 2, 8), 25);
  EXPECT_EQ(*SimulatedStepUnits(ScheduleKind::kOneFOneB, 4, 8), 33);
  EXPECT_EQ(*SimulatedStepUnits(ScheduleKind::kZeroBubble, 4, 8), 29);
  EXPECT_EQ(*SimulatedStepUnits(ScheduleKind::kGPipe, 1, 4), 12);
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 12; ++m) {
      auto zb = SimulatedStepUnits(ScheduleKind::kZeroBubble, p, m);
      auto one = SimulatedStepUnits(ScheduleKind::kOneFOneB, p, m);
      ASSERT_TRUE(zb.ok() && one.ok()) << zb.status() << one.status();
      EXPECT_LE(*zb, *one) << p << " " << m;
      EXPECT_GE(*zb, 3 * m + p - 1) << p << " " << m;  // the first stage's F0 reaches the last after p − 1
    }
  }
}

TEST(PipelineScheduleTest, BadArgumentsAndNames) {
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kGPipe, 0, 0, 1).ok());
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kGPipe, 2, 2, 1).ok());
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kOneFOneB, 2, 0, 0).ok());
  EXPECT_EQ(*ParseScheduleKind("1f1b"), ScheduleKind::kOneFOneB);
  EXPECT_EQ(*ParseScheduleKind("zb"), ScheduleKind::kZeroBubble);
  EXPECT_EQ(ParseScheduleKind("zero-bubble").status().code(), absl::StatusCode::kInvalidArgument);
  // The zero-bubble schedule simulates the whole pipeline: bounded.
  EXPECT_EQ(BuildSchedule(ScheduleKind::kZeroBubble, 1024, 0, 1 << 11).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(BuildSchedule(ScheduleKind::kZeroBubble, 2, 0, 1 << 19).ok());
}

}  // namespace
}  // namespace shardline::worker::runtime
