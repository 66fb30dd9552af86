#include "common/cost_model.h"

#include <algorithm>

#include "common/job_spec.h"

namespace shardline::common {

double TensorGroupBytesPerRank(const shardline::v1::JobSpec& spec, int begin, int end) {
  const int t = spec.parallel().tensor_parallel();
  if (t <= 1) return 0;
  const int units = PipelineUnits(spec.model());
  const int64_t m = spec.train().micro_batches();
  const double tokens = static_cast<double>(spec.train().global_batch() / (m * spec.parallel().data_parallel())) *
                        spec.model().context();
  const double activation = tokens * spec.model().d_model();  // floats, what each all-reduce sums
  const int blocks = std::max(0, std::min(end, units - 1) - std::max(begin, 1));
  int all_reduces = 4 * blocks;  // per micro-batch
  double gathered = 0;           // floats gathered per micro-batch, all ranks' parts
  if (VocabParallel(spec)) {
    if (begin == 0) ++all_reduces;  // the embedding's rows
    if (end == units) {
      ++all_reduces;  // the head's input gradient
      gathered += 3 * tokens * t;
    }
  }
  const double per_micro_batch =
      all_reduces * AllReduceBytesReceived(static_cast<size_t>(activation) * sizeof(float), t) +
      (t - 1.0) / t * gathered * sizeof(float);
  return m * per_micro_batch + (t - 1) * sizeof(double);  // + the norm's doubles
}

bool AllReduceInOneRound(size_t bytes, int ranks, size_t one_round_bytes) {
  const size_t d = static_cast<size_t>(std::max(ranks, 2));
  // One round sends (d − 1)·bytes, two send 2(d − 1)/d·bytes.
  return bytes <= one_round_bytes && (d - 1) * (d - 2) * bytes <= d * kOneRoundExtraBytes;
}

double AllReduceBytesReceived(size_t bytes, int ranks) {
  if (ranks <= 1) return 0;
  const double d = ranks, b = static_cast<double>(bytes);
  return AllReduceInOneRound(bytes, ranks) ? (d - 1) * b : 2 * (d - 1) / d * b;
}

int64_t UnitRangeParameters(const shardline::v1::ModelSpec& model, int begin, int end) {
  const std::vector<UnitCost> units = ModelUnitCosts(model, model.context());
  int64_t parameters = 0;
  for (int u = std::max(begin, 0); u < end && u < static_cast<int>(units.size()); ++u) {
    parameters += units[u].parameters;
  }
  return parameters;
}

bool RecomputesAttentionWeights(const std::string& device, int64_t t) {
  return HasAttentionKernel(device) && t > kCpuAttentionKeyTile;
}

bool HasAttentionKernel(const std::string& device) { return device == "cpu"; }

double AttentionSavedBytesPerToken(const shardline::v1::ModelSpec& model, int64_t t, bool recomputed) {
  return 4.0 * model.n_heads() * (recomputed ? 1.0 : static_cast<double>(t));
}

std::vector<UnitCost> ModelUnitCosts(const shardline::v1::ModelSpec& model, int64_t t) {
  const double c = model.d_model(), v = model.vocab_size();
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
    block.saved_bytes_per_token = 4 * (15 * c + 4) + AttentionSavedBytesPerToken(model, t, false);
    block.output_bytes_per_token = 4 * c;
    // The backward pass's temporaries (BlockLayer::Scratch): C, 3C and
    // twice 4C floats (a tensor rank's are narrower but for the C).
    block.scratch_bytes_per_token = 4 * 12 * c;
    units.push_back(block);
  }
  UnitCost head;
  head.parameters = static_cast<int64_t>(2 * c + v * c);
  head.flops_per_token = 3 * 2 * v * c;
  head.saved_bytes_per_token = 4 * (c + 2 + 2 * v);  // normed input, stats, logits, losses
  head.output_bytes_per_token = 0;
  head.scratch_bytes_per_token = 4 * (v + c);  // the backward pass's logit and input gradients
  units.push_back(head);
  return units;
}

}  // namespace shardline::common
