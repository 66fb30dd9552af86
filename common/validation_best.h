// The best of a job's validation passes so far, and early stopping on them
// (train.early_stopping): the same rule in the single-process trainer and
// on the coordinator, which keeps the record in JobStatus (best_val_loss,
// best_val_accuracy, best_val_step, passes_since_best) across restarts.
#ifndef SHARDLINE_COMMON_VALIDATION_BEST_H_
#define SHARDLINE_COMMON_VALIDATION_BEST_H_

#include <cstdint>
#include <optional>
#include <string>

#include "shardline/v1/admin.pb.h"
#include "shardline/v1/job.pb.h"

namespace shardline::common {

// What one validation pass measured: the loss, and with exact-match
// validation (addition) the fraction of problems answered right.
struct ValidationPass {
  double loss = 0.0;
  std::optional<double> accuracy;
};

struct ValidationBest {
  int64_t step = 0;  // of the best pass; 0: none yet
  ValidationPass pass;
  int passes_since = 0;  // passes after it that did not improve on it
};

// The record a job's status keeps (JobStatus.best_val_*).
ValidationBest BestOf(const shardline::v1::JobStatus& status);

// Notes the pass after `step` (after every earlier one): it is the new best
// when it is the first pass, or better than the best by more than
// min_delta on the spec's monitor: a lower loss ("loss", the default) or a
// higher accuracy ("accuracy"; the job spec allows it only where passes
// measure one). A NaN loss never is after the first; a number always beats
// a NaN best. Returns whether it is.
bool NoteValidationPass(const shardline::v1::EarlyStoppingSpec& spec, int64_t step, const ValidationPass& pass,
                        ValidationBest& best);

// Whether training stops here: patience passes in a row without a new best.
bool PatienceRunOut(const shardline::v1::EarlyStoppingSpec& spec, const ValidationBest& best);

// A pass's measures for people: "loss 1.2346", or with an accuracy
// "accuracy 91.20%, loss 1.2346".
std::string PassMeasures(const ValidationPass& pass);

// Why a job stopped after `step`, for people: "stopped early after step
// 900: 3 validation passes without improving on step 600's loss 1.2346
// (min_delta 0.001); the weights are step 600's" ("... on step 600's
// accuracy 91.20% ..." with monitor "accuracy").
std::string EarlyStopMessage(const shardline::v1::EarlyStoppingSpec& spec, int64_t step, const ValidationBest& best);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_VALIDATION_BEST_H_
