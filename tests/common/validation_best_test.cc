#include "common/validation_best.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace shardline::common {
namespace {

shardline::v1::EarlyStoppingSpec Spec(int patience, double min_delta) {
  shardline::v1::EarlyStoppingSpec spec;
  spec.set_patience(patience);
  spec.set_min_delta(min_delta);
  return spec;
}

TEST(ValidationBestTest, ThePatienceRunsOutAfterThatManyPassesWithoutALowerLoss) {
  const auto spec = Spec(2, 0.0);
  ValidationBest best;
  EXPECT_FALSE(PatienceRunOut(spec, best)) << "no pass yet";
  EXPECT_TRUE(NoteValidationPass(spec, 10, 3.0, best)) << "the first pass is the best so far";
  EXPECT_TRUE(NoteValidationPass(spec, 20, 2.5, best));
  EXPECT_EQ(best.step, 20);
  EXPECT_FALSE(NoteValidationPass(spec, 30, 2.5, best)) << "an equal loss is no improvement";
  EXPECT_FALSE(PatienceRunOut(spec, best));
  EXPECT_TRUE(NoteValidationPass(spec, 40, 2.4, best)) << "a lower one starts the count again";
  EXPECT_EQ(best.passes_since, 0);
  EXPECT_FALSE(NoteValidationPass(spec, 50, 2.6, best));
  EXPECT_FALSE(NoteValidationPass(spec, 60, 2.41, best));
  EXPECT_TRUE(PatienceRunOut(spec, best));
  EXPECT_EQ(best.step, 40);
  EXPECT_EQ(best.loss, 2.4);
  EXPECT_EQ(best.passes_since, 2);
  EXPECT_EQ(EarlyStopMessage(spec, 60, best),
            "stopped early after step 60: 2 validation passes without improving on step 40's loss 2.4000; the "
            "weights are step 40's");
}

TEST(ValidationBestTest, AnImprovementMustBeatTheBestByMoreThanMinDelta) {
  const auto spec = Spec(1, 0.1);
  ValidationBest best;
  NoteValidationPass(spec, 5, 1.0, best);
  EXPECT_FALSE(NoteValidationPass(spec, 10, 0.95, best));
  EXPECT_TRUE(PatienceRunOut(spec, best));
  EXPECT_TRUE(NoteValidationPass(spec, 15, 0.85, best));
  EXPECT_EQ(best.step, 15);
  EXPECT_FALSE(PatienceRunOut(spec, best));
  best.passes_since = 1;
  EXPECT_NE(EarlyStopMessage(spec, 20, best).find("(min_delta 0.1)"), std::string::npos);
}

TEST(ValidationBestTest, ANanLossNeverBeatsANumberAndAnyNumberBeatsANan) {
  const auto spec = Spec(3, 0.0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ValidationBest best;
  EXPECT_TRUE(NoteValidationPass(spec, 1, nan, best));
  EXPECT_TRUE(NoteValidationPass(spec, 2, 7.0, best));
  EXPECT_FALSE(NoteValidationPass(spec, 3, nan, best));
  EXPECT_EQ(best.step, 2);
  EXPECT_EQ(best.passes_since, 1);
}

TEST(ValidationBestTest, PatienceZeroNeverStops) {
  const auto spec = Spec(0, 0.0);
  ValidationBest best;
  for (int step = 1; step <= 5; ++step) NoteValidationPass(spec, step, 1.0, best);
  EXPECT_EQ(best.step, 1);
  EXPECT_EQ(best.passes_since, 4);
  EXPECT_FALSE(PatienceRunOut(spec, best));
}

}  // namespace
}  // namespace shardline::common
