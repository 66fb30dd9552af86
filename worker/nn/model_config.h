// ModelConfig: the dimensions of the GPT model, taken from a validated
// shardline.v1.ModelSpec.
#ifndef SHARDLINE_WORKER_NN_MODEL_CONFIG_H_
#define SHARDLINE_WORKER_NN_MODEL_CONFIG_H_

#include <cmath>
#include <cstdint>

#include "shardline/v1/job.pb.h"

namespace shardline::worker::nn {

struct ModelConfig {
  int64_t vocab = 0;
  int64_t context = 0;
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t layers = 0;

  static ModelConfig FromSpec(const shardline::v1::ModelSpec& spec) {
    return ModelConfig{spec.vocab_size(), spec.context(), spec.d_model(), spec.n_heads(),
                       spec.n_layers()};
  }
  int64_t head_dim() const { return d_model / heads; }
  // Pipeline units: embedding, blocks, head.
  int units() const { return static_cast<int>(layers) + 2; }
  // GPT-2 initialisation: N(0, 0.02²), residual projections scaled by 1/sqrt(2L).
  float init_std() const { return 0.02f; }
  float residual_std() const { return 0.02f / std::sqrt(2.0f * static_cast<float>(layers)); }
};

}  // namespace shardline::worker::nn

#endif  // SHARDLINE_WORKER_NN_MODEL_CONFIG_H_
