#include "common/validation_best.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardline::common {
namespace {

bool MonitorsAccuracy(const shardline::v1::EarlyStoppingSpec& spec) { return spec.monitor() == "accuracy"; }

// Whether `value` improves on `best` by more than min_delta, lower or
// higher being better; NaN is the worst value.
bool Improves(double value, double best, double min_delta, bool higher_is_better) {
  if (std::isnan(value)) return false;
  if (std::isnan(best)) return true;
  return higher_is_better ? value > best + min_delta : value < best - min_delta;
}

}  // namespace

ValidationBest BestOf(const shardline::v1::JobStatus& status) {
  ValidationBest best{status.best_val_step(), {status.best_val_loss(), std::nullopt}, status.passes_since_best()};
  if (status.has_best_val_accuracy()) best.pass.accuracy = status.best_val_accuracy();
  return best;
}

bool NoteValidationPass(const shardline::v1::EarlyStoppingSpec& spec, int64_t step, const ValidationPass& pass,
                        ValidationBest& best) {
  const bool on_accuracy = MonitorsAccuracy(spec);
  const double value = on_accuracy ? pass.accuracy.value_or(NAN) : pass.loss;
  const double best_value = on_accuracy ? best.pass.accuracy.value_or(NAN) : best.pass.loss;
  if (best.step == 0 || Improves(value, best_value, spec.min_delta(), on_accuracy)) {
    best = {step, pass, 0};
    return true;
  }
  ++best.passes_since;
  return false;
}

bool PatienceRunOut(const shardline::v1::EarlyStoppingSpec& spec, const ValidationBest& best) {
  return spec.patience() > 0 && best.step > 0 && best.passes_since >= spec.patience();
}

std::string PassMeasures(const ValidationPass& pass) {
  return absl::StrCat(pass.accuracy.has_value() ? absl::StrFormat("accuracy %.2f%%, ", 100.0 * *pass.accuracy) : "",
                      absl::StrFormat("loss %.4f", pass.loss));
}

std::string EarlyStopMessage(const shardline::v1::EarlyStoppingSpec& spec, int64_t step, const ValidationBest& best) {
  const std::string measure =
      MonitorsAccuracy(spec) ? absl::StrFormat("accuracy %.2f%%", 100.0 * best.pass.accuracy.value_or(NAN))
                             : absl::StrFormat("loss %.4f", best.pass.loss);
  return absl::StrCat("stopped early after step ", step, ": ", best.passes_since, " validation pass",
                      best.passes_since == 1 ? "" : "es", " without improving on step ", best.step, "'s ", measure,
                      spec.min_delta() > 0 ? absl::StrCat(" (min_delta ", spec.min_delta(), ")") : "",
                      "; the weights are step ", best.step, "'s");
}

}  // namespace shardline::common
