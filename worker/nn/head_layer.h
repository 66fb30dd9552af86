// HeadLayer is the last pipeline unit: final LayerNorm (ln_f), LM head
// (lm_head.weight [vocab × C], no bias, not tied to the embedding so that
// stages never share a parameter) and the cross-entropy loss over the tokens
// whose target is ≥ 0. Forward writes the logits [N × vocab] to y when y is
// not empty and, when targets are given, queues the copy of each row's loss
// (0 for ignored rows) to mb.losses_out without waiting for it; Backward
// starts from that loss. Not thread-safe.
#ifndef SHARDLINE_WORKER_NN_HEAD_LAYER_H_
#define SHARDLINE_WORKER_NN_HEAD_LAYER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/nn/layer.h"
#include "worker/nn/linear.h"
#include "worker/nn/model_config.h"
#include "worker/nn/slot_store.h"

namespace shardline::worker::nn {

class HeadLayer final : public Layer {
 public:
  static absl::StatusOr<std::unique_ptr<HeadLayer>> Create(Backend& backend,
                                                           const ModelConfig& config,
                                                           uint64_t seed);

  const std::string& name() const override { return name_; }
  std::vector<Parameter*> parameters() override;
  int64_t input_width() const override { return config_.d_model; }
  int64_t output_width() const override { return config_.vocab; }
  absl::Status Forward(const MicroBatch& mb, DeviceSpan<const float> x,
                       DeviceSpan<float> y) override;
  absl::Status Backward(const MicroBatch& mb, DeviceSpan<const float> x,
                        DeviceSpan<const float> dy, DeviceSpan<float> dx) override;
  void Discard(int slot) override { saved_.Release(slot); }

 private:
  struct Saved {
    DeviceBuffer h, stats, logits, losses;
    HostTransfer losses_read;  // the last copy of `losses` to the host
  };

  HeadLayer(Backend& backend, const ModelConfig& config) : backend_(backend), config_(config) {}

  Backend& backend_;
  const ModelConfig config_;
  const std::string name_ = "head";
  Parameter norm_weight_, norm_bias_;
  Linear lm_head_;
  SlotStore<Saved> saved_;
  DeviceBuffer dlogits_, dh_;  // Backward temporaries
};

}  // namespace shardline::worker::nn

#endif  // SHARDLINE_WORKER_NN_HEAD_LAYER_H_
