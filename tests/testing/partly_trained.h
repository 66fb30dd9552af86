// TrainUntilPartlyRight: an addition model the reference trainer trained
// until its held-out exact match is neither none nor all (at least a tenth
// right and a tenth wrong), checked every 100 steps up to 3,000: weights on
// which a distributed validation pass can count the trainer's problems.
#ifndef SHARDLINE_TESTS_TESTING_PARTLY_TRAINED_H_
#define SHARDLINE_TESTS_TESTING_PARTLY_TRAINED_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "shardline/v1/job.pb.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/trainer/trainer.h"

namespace shardline::testing {

struct PartlyTrained {
  std::map<std::string, common::Tensor> weights;
  worker::trainer::EvalResult eval;  // the trainer's validation with them
};

inline absl::StatusOr<PartlyTrained> TrainUntilPartlyRight(const shardline::v1::JobSpec& spec) {
  auto backend = worker::testing::CpuBackend();
  auto trainer = worker::trainer::Trainer::Create(spec, *backend);
  if (!trainer.ok()) return trainer.status();
  for (int step = 1; step <= 3000; ++step) {
    if (absl::Status s = (*trainer)->TrainStep(step).status(); !s.ok()) return s;
    if (step % 100 != 0) continue;
    absl::StatusOr<worker::trainer::EvalResult> eval = (*trainer)->Evaluate();
    if (!eval.ok()) return eval.status();
    if (eval->matches < eval->examples / 10 || eval->matches > eval->examples - eval->examples / 10) continue;
    auto weights = (*trainer)->runtime().ExportWeights();
    if (!weights.ok()) return weights.status();
    return PartlyTrained{*std::move(weights), *eval};
  }
  return absl::FailedPreconditionError("the model never got some held-out problems right and some wrong");
}

}  // namespace shardline::testing

#endif  // SHARDLINE_TESTS_TESTING_PARTLY_TRAINED_H_
