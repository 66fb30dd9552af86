// The best of a job's validation passes so far, and early stopping on them
// (train.early_stopping): the same rule in the single-process trainer and
// on the coordinator, which keeps the record in JobStatus (best_val_loss,
// best_val_step, passes_since_best) across restarts.
#ifndef SHARDLINE_COMMON_VALIDATION_BEST_H_
#define SHARDLINE_COMMON_VALIDATION_BEST_H_

#include <cstdint>
#include <string>

#include "shardline/v1/admin.pb.h"
#include "shardline/v1/job.pb.h"

namespace shardline::common {

struct ValidationBest {
  int64_t step = 0;  // of the best pass; 0: none yet
  double loss = 0.0;
  int passes_since = 0;  // passes after it that did not improve on it
};

// The record a job's status keeps (JobStatus.best_val_*).
ValidationBest BestOf(const shardline::v1::JobStatus& status);

// Notes the pass after `step` (after every earlier one) with validation
// loss `loss`: it is the new best when it is the first pass, or lower than
// the best by more than min_delta (a NaN loss never is after the first; a
// number always beats a NaN best). Returns whether it is.
bool NoteValidationPass(const shardline::v1::EarlyStoppingSpec& spec, int64_t step, double loss,
                        ValidationBest& best);

// Whether training stops here: patience passes in a row without a new best.
bool PatienceRunOut(const shardline::v1::EarlyStoppingSpec& spec, const ValidationBest& best);

// Why a job stopped after `step`, for people: "stopped early after step
// 900: 3 validation passes without improving on step 600's loss 1.2346
// (min_delta 0.001); the weights are step 600's".
std::string EarlyStopMessage(const shardline::v1::EarlyStoppingSpec& spec, int64_t step, const ValidationBest& best);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_VALIDATION_BEST_H_
