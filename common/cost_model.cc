#include "common/cost_model.h"

namespace shardline::common {

std::vector<UnitCost> ModelUnitCosts(const shardline::v1::ModelSpec& model, int64_t t) {
  const double c = model.d_model(), v = model.vocab_size(), h = model.n_heads();
  const double tt = static_cast<double>(t);
  std::vector<UnitCost> units;
  UnitCost embedding;
  embedding.parameters = static_cast<int64_t>((v + model.context()) * c);
  embedding.flops_per_token = 4 * c;  // gather + add, scatter-add back
  embedding.output_bytes_per_token = 4 * c;
  units.push_back(embedding);
  for (int i = 0; i < model.n_layers(); ++i) {
    UnitCost block;
    block.parameters = static_cast<int64_t>(12 * c * c + 13 * c);
    // Forward: 24·C² for the four matrices, 4·t·C for QKᵀ and P·V (the full
    // square, as the kernels compute it); backward twice that.
    block.flops_per_token = 3 * (24 * c * c + 4 * tt * c);
    // Saved: h1, qkv (3C), att, r1, h2, fc (4C), gelu (4C) = 15C, the
    // LayerNorm statistics, and the attention weights (heads · t per token).
    block.saved_bytes_per_token = 4 * (15 * c + 4 + h * tt);
    block.output_bytes_per_token = 4 * c;
    units.push_back(block);
  }
  UnitCost head;
  head.parameters = static_cast<int64_t>(2 * c + v * c);
  head.flops_per_token = 3 * 2 * v * c;
  head.saved_bytes_per_token = 4 * (c + 2 + 2 * v);  // normed input, stats, logits, losses
  head.output_bytes_per_token = 0;
  units.push_back(head);
  return units;
}

}  // namespace shardline::common
