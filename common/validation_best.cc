#include "common/validation_best.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardline::common {

ValidationBest BestOf(const shardline::v1::JobStatus& status) {
  return {status.best_val_step(), status.best_val_loss(), status.passes_since_best()};
}

bool NoteValidationPass(const shardline::v1::EarlyStoppingSpec& spec, int64_t step, double loss,
                        ValidationBest& best) {
  const bool improves = best.step == 0 || loss < best.loss - spec.min_delta() ||
                        (std::isnan(best.loss) && !std::isnan(loss));
  if (improves) {
    best = {step, loss, 0};
    return true;
  }
  ++best.passes_since;
  return false;
}

bool PatienceRunOut(const shardline::v1::EarlyStoppingSpec& spec, const ValidationBest& best) {
  return spec.patience() > 0 && best.step > 0 && best.passes_since >= spec.patience();
}

std::string EarlyStopMessage(const shardline::v1::EarlyStoppingSpec& spec, int64_t step, const ValidationBest& best) {
  return absl::StrCat("stopped early after step ", step, ": ", best.passes_since, " validation pass",
                      best.passes_since == 1 ? "" : "es", " without improving on step ", best.step, "'s loss ",
                      absl::StrFormat("%.4f", best.loss),
                      spec.min_delta() > 0 ? absl::StrCat(" (min_delta ", spec.min_delta(), ")") : "",
                      "; the weights are step ", best.step, "'s");
}

}  // namespace shardline::common
