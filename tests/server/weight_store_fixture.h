// The WeightStore tests' shards and fixture (a store under the test's own
// directory).
#ifndef SHARDLINE_TESTS_SERVER_WEIGHT_STORE_FIXTURE_H_
#define SHARDLINE_TESTS_SERVER_WEIGHT_STORE_FIXTURE_H_

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/weight_store.h"

namespace shardline::server {

inline common::Tensor Values(std::vector<int64_t> shape, float start) {
  common::Tensor t = *common::Tensor::Zeros(common::DType::kF32, shape);
  float v = start;
  for (float& x : t.values<float>()) x = (v += 0.5f);
  return t;
}

// Stage s of a 2-stage model at `step`: its weights and AdamW state.
inline ShardReport Shard(const std::string& job, int s, int64_t step, float salt = 0) {
  ShardReport r;
  r.key.job_id = job;
  r.key.shard = s;
  r.key.shard_count = 2;
  r.key.step = step;
  const std::string name = s == 0 ? "tok_emb.weight" : "lm_head.weight";
  r.contents.tensors.emplace(name, Values({3, 4}, step + s + salt));
  r.contents.tensors.emplace(std::string(kOptimizerPrefix) + "m." + name, Values({3, 4}, -1));
  return r;
}

class WeightStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "/weights-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    store_ = std::move(*WeightStore::Open(root_));
  }
  std::string root_;
  std::unique_ptr<WeightStore> store_;
};

}  // namespace shardline::server

#endif  // SHARDLINE_TESTS_SERVER_WEIGHT_STORE_FIXTURE_H_
