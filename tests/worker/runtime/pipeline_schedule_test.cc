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

TEST(PipelineScheduleTest, BadArgumentsAndNames) {
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kGPipe, 0, 0, 1).ok());
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kGPipe, 2, 2, 1).ok());
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kOneFOneB, 2, 0, 0).ok());
  EXPECT_EQ(*ParseScheduleKind("1f1b"), ScheduleKind::kOneFOneB);
  EXPECT_EQ(ParseScheduleKind("zero-bubble").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardline::worker::runtime
