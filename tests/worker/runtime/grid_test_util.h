// Helpers of the in-process grid tests (LocalGrid against the reference
// trainer): the tiny model's spec for a grid, a replica's weights, and
// checks of them against the other replicas' and the trainer's.
#ifndef SHARDLINE_TESTS_WORKER_RUNTIME_GRID_TEST_UTIL_H_
#define SHARDLINE_TESTS_WORKER_RUNTIME_GRID_TEST_UTIL_H_

#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/local_grid.h"
#include "tests/testing/local_pipeline.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/trainer/trainer.h"

namespace shardline::worker::testing {

// The tiny model (4 units) on `stages` stages × `replicas` replicas of
// `micro_batches` micro-batches of 2 sequences, grad-norm clipping on (the
// global norm matters).
inline shardline::v1::JobSpec TinyGridSpec(int stages, int replicas, const std::string& schedule, int micro_batches,
                                           double bucket_mib) {
  auto spec = TinySpec(micro_batches, /*global_batch=*/2 * replicas * micro_batches);
  spec.mutable_parallel()->set_pipeline_stages(stages);
  spec.mutable_parallel()->set_schedule(schedule);
  spec.mutable_parallel()->set_data_parallel(replicas);
  spec.mutable_parallel()->set_bucket_mib(bucket_mib);
  spec.mutable_train()->mutable_optimizer()->set_grad_clip(1.0);
  return spec;
}

// The weights of a replica's stages, by name.
inline std::map<std::string, std::vector<float>> ReplicaWeights(shardline::testing::LocalPipeline& replica) {
  std::map<std::string, std::vector<float>> out;
  auto weights = replica.ExportWeights();
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return out;
  for (const auto& [name, tensor] : *weights) {
    const auto v = tensor.values<float>();
    out[name] = std::vector<float>(v.begin(), v.end());
  }
  return out;
}

// Every replica of `grid` holds replica 0's weights.
inline void ExpectReplicasAgree(shardline::testing::LocalGrid& grid, int64_t step) {
  const auto first = ReplicaWeights(grid.replica(0));
  for (int r = 1; r < grid.replicas(); ++r) {
    EXPECT_TRUE(ReplicaWeights(grid.replica(r)) == first) << "replica " << r << " after step " << step;
  }
}

// Replica 0 of `grid` holds the reference trainer's weights, bit for bit.
inline void ExpectReferenceWeights(trainer::Trainer& reference, shardline::testing::LocalGrid& grid) {
  const auto got = ReplicaWeights(grid.replica(0));
  auto want = reference.runtime().ExportWeights();
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got.size(), want->size());
  for (const auto& [name, tensor] : *want) {
    const auto b = tensor.values<float>();
    ASSERT_EQ(got.at(name), std::vector<float>(b.begin(), b.end())) << name;
  }
}

}  // namespace shardline::worker::testing

#endif  // SHARDLINE_TESTS_WORKER_RUNTIME_GRID_TEST_UTIL_H_
