#include "common/validation_best.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace shardline::common {
namespace {

shardline::v1::EarlyStoppingSpec Spec(int patience, double min_delta, const std::string& monitor = "loss") {
  shardline::v1::EarlyStoppingSpec spec;
  spec.set_patience(patience);
  spec.set_min_delta(min_delta);
  spec.set_monitor(monitor);
  return spec;
}

ValidationPass Loss(double loss) { return {loss, std::nullopt}; }
ValidationPass Exact(double accuracy, double loss) { return {loss, accuracy}; }

TEST(ValidationBestTest, ThePatienceRunsOutAfterThatManyPassesWithoutALowerLoss) {
  const auto spec = Spec(2, 0.0);
  ValidationBest best;
  EXPECT_FALSE(PatienceRunOut(spec, best)) << "no pass yet";
  EXPECT_TRUE(NoteValidationPass(spec, 10, Loss(3.0), best)) << "the first pass is the best so far";
  EXPECT_TRUE(NoteValidationPass(spec, 20, Loss(2.5), best));
  EXPECT_EQ(best.step, 20);
  EXPECT_FALSE(NoteValidationPass(spec, 30, Loss(2.5), best)) << "an equal loss is no improvement";
  EXPECT_FALSE(PatienceRunOut(spec, best));
  EXPECT_TRUE(NoteValidationPass(spec, 40, Loss(2.4), best)) << "a lower one starts the count again";
  EXPECT_EQ(best.passes_since, 0);
  EXPECT_FALSE(NoteValidationPass(spec, 50, Loss(2.6), best));
  EXPECT_FALSE(NoteValidationPass(spec, 60, Loss(2.41), best));
  EXPECT_TRUE(PatienceRunOut(spec, best));
  EXPECT_EQ(best.step, 40);
  EXPECT_EQ(best.pass.loss, 2.4);
  EXPECT_EQ(best.passes_since, 2);
  EXPECT_EQ(EarlyStopMessage(spec, 60, best),
            "stopped early after step 60: 2 validation passes without improving on step 40's loss 2.4000; the "
            "weights are step 40's");
}

TEST(ValidationBestTest, AnImprovementMustBeatTheBestByMoreThanMinDelta) {
  const auto spec = Spec(1, 0.1);
  ValidationBest best;
  NoteValidationPass(spec, 5, Loss(1.0), best);
  EXPECT_FALSE(NoteValidationPass(spec, 10, Loss(0.95), best));
  EXPECT_TRUE(PatienceRunOut(spec, best));
  EXPECT_TRUE(NoteValidationPass(spec, 15, Loss(0.85), best));
  EXPECT_EQ(best.step, 15);
  EXPECT_FALSE(PatienceRunOut(spec, best));
  best.passes_since = 1;
  EXPECT_NE(EarlyStopMessage(spec, 20, best).find("(min_delta 0.1)"), std::string::npos);
}

TEST(ValidationBestTest, ANanLossNeverBeatsANumberAndAnyNumberBeatsANan) {
  const auto spec = Spec(3, 0.0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ValidationBest best;
  EXPECT_TRUE(NoteValidationPass(spec, 1, Loss(nan), best));
  EXPECT_TRUE(NoteValidationPass(spec, 2, Loss(7.0), best));
  EXPECT_FALSE(NoteValidationPass(spec, 3, Loss(nan), best));
  EXPECT_EQ(best.step, 2);
  EXPECT_EQ(best.passes_since, 1);
}

TEST(ValidationBestTest, PatienceZeroNeverStops) {
  const auto spec = Spec(0, 0.0);
  ValidationBest best;
  for (int step = 1; step <= 5; ++step) NoteValidationPass(spec, step, Loss(1.0), best);
  EXPECT_EQ(best.step, 1);
  EXPECT_EQ(best.passes_since, 4);
  EXPECT_FALSE(PatienceRunOut(spec, best));
}

TEST(ValidationBestTest, OnAccuracyAHigherExactMatchIsBetterWhateverTheLoss) {
  const auto spec = Spec(2, 0.01, "accuracy");
  ValidationBest best;
  EXPECT_TRUE(NoteValidationPass(spec, 10, Exact(0.50, 1.0), best));
  EXPECT_FALSE(NoteValidationPass(spec, 20, Exact(0.50, 0.5), best)) << "a lower loss alone is no improvement";
  EXPECT_TRUE(NoteValidationPass(spec, 30, Exact(0.52, 1.5), best)) << "two points more, though the loss rose";
  EXPECT_FALSE(NoteValidationPass(spec, 40, Exact(0.525, 0.1), best)) << "not more than min_delta (one point)";
  EXPECT_FALSE(NoteValidationPass(spec, 50, Exact(0.40, 0.1), best));
  EXPECT_TRUE(PatienceRunOut(spec, best));
  EXPECT_EQ(best.step, 30);
  EXPECT_EQ(best.pass.accuracy, 0.52);
  EXPECT_EQ(best.pass.loss, 1.5) << "the best pass's own loss";
  EXPECT_EQ(EarlyStopMessage(spec, 50, best),
            "stopped early after step 50: 2 validation passes without improving on step 30's accuracy 52.00% "
            "(min_delta 0.01); the weights are step 30's");
  EXPECT_EQ(PassMeasures(best.pass), "accuracy 52.00%, loss 1.5000");
}

TEST(ValidationBestTest, OnLossAnExactMatchPassIsJudgedByItsLossAndKeepsItsAccuracy) {
  const auto spec = Spec(1, 0.0);
  ValidationBest best;
  EXPECT_TRUE(NoteValidationPass(spec, 1, Exact(0.9, 2.0), best));
  EXPECT_FALSE(NoteValidationPass(spec, 2, Exact(0.95, 2.5), best)) << "a higher accuracy alone does not count";
  EXPECT_TRUE(NoteValidationPass(spec, 3, Exact(0.1, 1.0), best));
  EXPECT_EQ(best.pass.accuracy, 0.1);
  EXPECT_EQ(PassMeasures(Loss(1.0)), "loss 1.0000");
}

TEST(ValidationBestTest, TheRecordRoundTripsThroughTheJobStatus) {
  shardline::v1::JobStatus status;
  status.set_best_val_step(40);
  status.set_best_val_loss(0.25);
  status.set_passes_since_best(3);
  ValidationBest best = BestOf(status);
  EXPECT_EQ(best.step, 40);
  EXPECT_EQ(best.pass.loss, 0.25);
  EXPECT_FALSE(best.pass.accuracy.has_value());
  EXPECT_EQ(best.passes_since, 3);
  status.set_best_val_accuracy(0.75);
  EXPECT_EQ(BestOf(status).pass.accuracy, 0.75);
}

}  // namespace
}  // namespace shardline::common
