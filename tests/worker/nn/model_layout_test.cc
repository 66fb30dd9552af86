// common::ModelParameters, the coordinator's copy of the model's parameter
// names and shapes, against the parameters worker/nn's layers create: the
// same names in the same order with the same whole shapes, unit by unit, on
// any tensor-parallel split; and the cost model's parameter counts.
#include "common/model_layout.h"

#include <memory>
#include <vector>

#include "common/cost_model.h"
#include "common/dtype.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/collective/in_process_collective.h"
#include "worker/nn/model_layers.h"

namespace shardline::worker {
namespace {

shardline::v1::ModelSpec Model(int vocab, int context, int d_model, int heads, int layers) {
  shardline::v1::ModelSpec m;
  m.set_kind("gpt");
  m.set_vocab_size(vocab);
  m.set_context(context);
  m.set_d_model(d_model);
  m.set_n_heads(heads);
  m.set_n_layers(layers);
  return m;
}

std::vector<shardline::v1::ModelSpec> Models() {
  return {Model(16, 12, 16, 2, 2), Model(32, 8, 24, 4, 1), Model(12, 5, 8, 1, 4)};
}

// The whole model's parameters as units [begin, end) of rank `rank` of `t`
// create them (names and whole shapes).
std::vector<common::ModelParameter> Built(const shardline::v1::ModelSpec& model, int begin, int end, int t = 1,
                                          int rank = 0, bool split_vocab = false) {
  auto backend = testing::CpuBackend();
  auto group = collective::InProcessGroup::Create(t, absl::Seconds(10));
  EXPECT_TRUE(group.ok()) << group.status();
  std::unique_ptr<collective::Collective> handle = (*group)->Rank(rank, *backend);
  auto layers = nn::BuildLayers(*backend, nn::ModelConfig::FromSpec(model), begin, end, /*seed=*/3,
                                nn::TensorParallel{rank, t, handle.get(), split_vocab});
  EXPECT_TRUE(layers.ok()) << layers.status();
  std::vector<common::ModelParameter> out;
  if (!layers.ok()) return out;
  for (int u = begin; u < end; ++u) {
    for (nn::Parameter* p : (*layers)[u - begin]->parameters()) out.push_back({p->name, p->global_shape, u});
  }
  return out;
}

void ExpectSame(const std::vector<common::ModelParameter>& built, const std::vector<common::ModelParameter>& layout) {
  ASSERT_EQ(built.size(), layout.size());
  for (size_t i = 0; i < built.size(); ++i) {
    EXPECT_EQ(built[i].name, layout[i].name) << "parameter " << i;
    EXPECT_EQ(common::ShapeString(built[i].shape), common::ShapeString(layout[i].shape)) << built[i].name;
    EXPECT_EQ(built[i].unit, layout[i].unit) << built[i].name;
  }
}

TEST(ModelLayoutTest, IsWhatTheLayersCreate) {
  for (const auto& model : Models()) {
    SCOPED_TRACE(model.ShortDebugString());
    ExpectSame(Built(model, 0, common::PipelineUnits(model)), common::ModelParameters(model));
  }
}

TEST(ModelLayoutTest, IsWhatEachUnitCreatesAlone) {
  const auto model = Models()[0];
  const std::vector<common::ModelParameter> layout = common::ModelParameters(model);
  for (int u = 0; u < common::PipelineUnits(model); ++u) {
    std::vector<common::ModelParameter> unit;
    for (const auto& p : layout) {
      if (p.unit == u) unit.push_back(p);
    }
    EXPECT_FALSE(unit.empty()) << "unit " << u;
    ExpectSame(Built(model, u, u + 1), unit);
  }
}

TEST(ModelLayoutTest, IsTheWholeShapesOfEveryTensorRank) {
  const auto model = Model(16, 12, 16, 2, 2);
  for (bool split_vocab : {false, true}) {
    for (int rank = 0; rank < 2; ++rank) {
      SCOPED_TRACE(::testing::Message() << "rank " << rank << (split_vocab ? ", vocabulary split" : ""));
      ExpectSame(Built(model, 0, common::PipelineUnits(model), 2, rank, split_vocab), common::ModelParameters(model));
    }
  }
}

TEST(ModelLayoutTest, CountsWhatTheCostModelCounts) {
  for (const auto& model : Models()) {
    SCOPED_TRACE(model.ShortDebugString());
    const std::vector<common::UnitCost> costs = common::ModelUnitCosts(model, model.context());
    std::vector<int64_t> counted(costs.size(), 0);
    for (const auto& p : common::ModelParameters(model)) counted[p.unit] += *common::NumElements(p.shape);
    for (size_t u = 0; u < costs.size(); ++u) EXPECT_EQ(counted[u], costs[u].parameters) << "unit " << u;
  }
}

}  // namespace
}  // namespace shardline::worker
