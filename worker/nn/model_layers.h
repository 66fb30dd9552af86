// Builds the pipeline units [begin, end) of the GPT model: unit 0 is the
// embedding, units 1..n_layers the blocks, unit n_layers+1 the head. Every
// parameter is initialised from (seed, its global name) only, so any
// partition of the units gives the same initial model. With tensor
// parallelism the blocks are split over `tp` (BlockLayer), and the token
// embedding and the head too when tp.split_vocab (vocabulary-parallel);
// otherwise those are replicated on every rank.
#ifndef SHARDLINE_WORKER_NN_MODEL_LAYERS_H_
#define SHARDLINE_WORKER_NN_MODEL_LAYERS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/nn/layer.h"
#include "worker/nn/model_config.h"
#include "worker/nn/tensor_parallel.h"

namespace shardline::worker::nn {

// INVALID_ARGUMENT unless 0 ≤ begin < end ≤ config.units().
absl::StatusOr<std::vector<std::unique_ptr<Layer>>> BuildLayers(Backend& backend,
                                                                const ModelConfig& config,
                                                                int begin, int end, uint64_t seed,
                                                                const TensorParallel& tp = {});

}  // namespace shardline::worker::nn

#endif  // SHARDLINE_WORKER_NN_MODEL_LAYERS_H_
