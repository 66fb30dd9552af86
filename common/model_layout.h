// The GPT model's parameters by global name and shape, from the model spec
// alone: what a complete set of weights for it holds (a checkpoint, an
// export, the starting weights sent with a job). worker/nn creates the same
// parameters (tests/worker/model_layout_test checks it against every layer);
// this copy lets the coordinator and tools check weights without building a
// model.
#ifndef SHARDLINE_COMMON_MODEL_LAYOUT_H_
#define SHARDLINE_COMMON_MODEL_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/safetensors.h"
#include "shardline/v1/job.pb.h"

namespace shardline::common {

struct ModelParameter {
  std::string name;            // e.g. "blocks.3.attn.qkv.weight"
  std::vector<int64_t> shape;  // the whole tensor's, f32
  int unit = 0;                // its pipeline unit: 0 embedding, 1.. blocks, last the head
};

// Every parameter of `model` (a validated spec), unit by unit in the order
// the layers list them.
std::vector<ModelParameter> ModelParameters(const shardline::v1::ModelSpec& model);

// OK when `index` holds exactly `model`'s parameters, each f32 with its
// whole shape, and nothing else but optimizer state ("optimizer."
// tensors, for the caller to judge). INVALID_ARGUMENT otherwise, naming
// the first tensors missing, extra or of another shape (`what` leads the
// message, e.g. "the weights sent").
absl::Status CheckWeightsFitModel(const SafetensorsIndex& index, const shardline::v1::ModelSpec& model,
                                  const std::string& what);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_MODEL_LAYOUT_H_
