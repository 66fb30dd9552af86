// ShardRuntimeTest: runtimes of units of the tiny addition model on the CPU
// backend, one batch of its data, and the gradients of a runtime by name.
#ifndef SHARDLINE_TESTS_WORKER_RUNTIME_SHARD_RUNTIME_FIXTURE_H_
#define SHARDLINE_TESTS_WORKER_RUNTIME_SHARD_RUNTIME_FIXTURE_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/data/data_source.h"
#include "worker/runtime/shard_runtime.h"

namespace shardline::worker::runtime::testing {

class ShardRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = worker::testing::CpuBackend();
    spec_ = worker::testing::TinySpec();
    config_ = nn::ModelConfig::FromSpec(spec_.model());
    data_ = std::move(*data::CreateDataSource(spec_));
    batch_ = data_->TrainBatch(1, 0, 4).value();
  }
  // Units [begin, end) on `backend` (default: the CPU backend).
  std::unique_ptr<ShardRuntime> Make(int begin, int end, Backend* backend = nullptr) {
    auto runtime = ShardRuntime::Create(backend != nullptr ? *backend : *backend_, config_, begin, end, 5,
                                        nn::OptimizerConfig::FromSpec(spec_.train()));
    EXPECT_TRUE(runtime.ok()) << runtime.status();
    return std::move(*runtime);
  }
  ShardRuntime::Inputs Inputs(const data::Batch& b, float scale) {
    return ShardRuntime::Inputs{b.batch, b.t, b.ids, b.targets, scale, {}};
  }
  std::map<std::string, std::vector<float>> Grads(ShardRuntime& runtime) {
    std::map<std::string, std::vector<float>> out;
    for (nn::Parameter* p : runtime.parameters()) {
      std::vector<float> g(p->count());
      EXPECT_TRUE(backend_->CopyToHost(DeviceSpan<const float>(p->g()), absl::Span<float>(g)).ok());
      out[p->name] = std::move(g);
    }
    return out;
  }

  std::unique_ptr<Backend> backend_;
  shardline::v1::JobSpec spec_;
  nn::ModelConfig config_;
  std::unique_ptr<data::DataSource> data_;
  data::Batch batch_;
};

}  // namespace shardline::worker::runtime::testing

#endif  // SHARDLINE_TESTS_WORKER_RUNTIME_SHARD_RUNTIME_FIXTURE_H_
