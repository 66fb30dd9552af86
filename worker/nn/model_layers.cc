#include "worker/nn/model_layers.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/nn/block_layer.h"
#include "worker/nn/embedding_layer.h"
#include "worker/nn/head_layer.h"

namespace shardline::worker::nn {

absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildLayers(Backend& backend,
                                                                const ModelConfig& config,
                                                                int begin, int end, uint64_t seed,
                                                                const TensorParallel& tp) {
  if (begin < 0 || begin >= end || end > config.units()) {
    return absl::InvalidArgumentError(absl::StrCat("unit range [", begin, ", ", end,
                                                   ") is not inside [0, ", config.units(), ")"));
  }
  std::vector<std::unique_ptr<Layer>> layers;
  const auto block_scratch = std::make_shared<BlockLayer::Scratch>();  // one set for the stage's blocks
  for (int unit = begin; unit < end; ++unit) {
    if (unit == 0) {
      ASSIGN_OR_RETURN(auto layer, EmbeddingLayer::Create(backend, config, seed, tp));
      layers.push_back(std::move(layer));
    } else if (unit == config.units() - 1) {
      ASSIGN_OR_RETURN(auto layer, HeadLayer::Create(backend, config, seed, tp));
      layers.push_back(std::move(layer));
    } else {
      ASSIGN_OR_RETURN(auto layer, BlockLayer::Create(backend, config, unit - 1, seed, tp, block_scratch));
      layers.push_back(std::move(layer));
    }
  }
  return layers;
}

}  // namespace shardline::worker::nn
