// BlockLayer is one pre-LayerNorm transformer block (GPT-2):
//   r = x + proj(attention(qkv(ln1(x))));  y = r + mlp.proj(gelu(mlp.fc(ln2(r))))
// with causal multi-head self-attention. Parameters are named
// blocks.<i>.{ln1,attn.qkv,attn.proj,ln2,mlp.fc,mlp.proj}.{weight,bias}.
// Split over a tensor-parallel group of t ranks (TensorParallel: qkv and fc
// column-parallel, proj and mlp.proj row-parallel), a rank runs n_heads/t
// heads and 4·C/t MLP features, and the group sums the two row-parallel
// outputs in the forward pass and the two column-parallel input gradients
// in the backward pass: four all-reduces of N·C floats per micro-batch.
// Saved activations per slot (floats, N = batch·t tokens, C = width):
// 4·N·C + 8·N·C/t + 4·N + batch·(heads/t)·t²; between BackwardInput and
// BackwardWeights only the four linear layers' inputs, 2·N·C + 5·N·C/t, and
// their output gradients, 2·N·C + 7·N·C/t. Not thread-safe.
#ifndef SHARDLINE_WORKER_NN_BLOCK_LAYER_H_
#define SHARDLINE_WORKER_NN_BLOCK_LAYER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/nn/layer.h"
#include "worker/nn/linear.h"
#include "worker/nn/model_config.h"
#include "worker/nn/slot_store.h"
#include "worker/nn/tensor_parallel.h"

namespace shardline::worker::nn {

class BlockLayer final : public Layer {
 public:
  // `tp` must divide the heads and 4·d_model (TensorParallel::Check).
  // The temporaries of one Forward or Backward call (contents dead when it
  // returns). A stage's blocks run one at a time on one thread, so they
  // share one set (BuildLayers): 12 MB a block on the large model.
  // attention: the composed attention's backward scratch (none on the CPU).
  struct Scratch {
    DeviceBuffer c, three_c, mlp_a, mlp_b, attention;
  };

  // `scratch`: shared with the stage's other blocks; null for a set of its own.
  static absl::StatusOr<std::unique_ptr<BlockLayer>> Create(Backend& backend, const ModelConfig& config, int index,
                                                            uint64_t seed, const TensorParallel& tp = {},
                                                            std::shared_ptr<Scratch> scratch = nullptr);

  const std::string& name() const override { return name_; }
  std::vector<Parameter*> parameters() override;
  int64_t input_width() const override { return config_.d_model; }
  int64_t output_width() const override { return config_.d_model; }
  absl::Status Forward(const MicroBatch& mb, DeviceSpan<const float> x,
                       DeviceSpan<float> y) override;
  absl::Status Backward(const MicroBatch& mb, DeviceSpan<const float> x,
                        DeviceSpan<const float> dy, DeviceSpan<float> dx) override;
  // The four linear layers' weight and bias gradients wait for BackwardWeights.
  absl::Status BackwardInput(const MicroBatch& mb, DeviceSpan<const float> x,
                             DeviceSpan<const float> dy, DeviceSpan<float> dx) override;
  absl::Status BackwardWeights(int slot) override;
  void Discard(int slot) override;

 private:
  // What a slot keeps, in three stores so that each part is freed as soon
  // as it is no longer needed (and a recycled one is reused): the backward
  // pass's input part reads PassSaved; the linear layers' weight gradients
  // read LinearInputs; between BackwardInput and BackwardWeights the slot
  // also keeps PendingGrads, the output gradients of mlp.proj (the block's
  // dy), fc, attn.proj (r1's) and qkv.
  struct PassSaved {
    DeviceBuffer stats1, qkv, attention, r1, stats2, f;  // attention: what it keeps (attention.h)
  };
  struct LinearInputs {
    DeviceBuffer h1, att, h2, g;
  };
  struct PendingGrads {
    DeviceBuffer dy, df, dr1, dqkv;
    int64_t rows = 0;
  };

  BlockLayer(Backend& backend, const ModelConfig& config, int index, const TensorParallel& tp)
      : backend_(backend), config_(config), tp_(tp), name_("blocks." + std::to_string(index)) {}
  // Per rank: heads, and attention and MLP features.
  int64_t heads() const { return config_.heads / tp_.size; }
  int64_t attention_width() const { return config_.d_model / tp_.size; }
  int64_t mlp_width() const { return 4 * config_.d_model / tp_.size; }
  absl::Status EnsureScratch(int64_t rows, const AttentionShape& attn);
  // Backward, or with `defer` BackwardInput.
  absl::Status BackwardPass(const MicroBatch& mb, DeviceSpan<const float> x, DeviceSpan<const float> dy,
                            DeviceSpan<float> dx, bool defer);

  Backend& backend_;
  const ModelConfig config_;
  const TensorParallel tp_;
  const std::string name_;
  Parameter ln1_weight_, ln1_bias_, ln2_weight_, ln2_bias_;
  Linear qkv_, proj_, fc_, mlp_proj_;
  SlotStore<PassSaved> pass_;
  SlotStore<LinearInputs> inputs_;
  SlotStore<PendingGrads> pending_;
  std::shared_ptr<Scratch> scratch_;
};

}  // namespace shardline::worker::nn

#endif  // SHARDLINE_WORKER_NN_BLOCK_LAYER_H_
