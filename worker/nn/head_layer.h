// HeadLayer is the last pipeline unit: final LayerNorm (ln_f), LM head
// (lm_head.weight [vocab × C], no bias, not tied to the embedding so that
// stages never share a parameter) and the cross-entropy loss over the tokens
// whose target is ≥ 0. Forward writes the logits [N × vocab] to y when y is
// not empty and, when targets are given, queues the copy of each row's loss
// (0 for ignored rows) to mb.losses_out without waiting for it; Backward
// starts from that loss.
//
// Vocabulary-parallel (tp.vocab_split(), Megatron-LM's parallel
// cross-entropy): a rank holds vocab/t rows of lm_head.weight and computes
// its slice of the logits only; the loss comes without gathering them:
// each rank's (max, Σ exp, target logit) per row (CrossEntropyParts), one
// all-gather of those 3 floats per row, and the same combination on every
// rank (CrossEntropyCombine), whose log-sum-exp the backward pass uses for
// the slice's gradient; the input gradient's parts are summed over the
// group (all-reduce) before ln_f's backward. The whole logits are not
// gathered: Forward with an output buffer is refused (training and the
// pipeline never ask for them); for MicroBatch::argmax_out each rank's best
// class of each row (value and index) is gathered instead. Not thread-safe.
#ifndef SHARDLINE_WORKER_NN_HEAD_LAYER_H_
#define SHARDLINE_WORKER_NN_HEAD_LAYER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/nn/layer.h"
#include "worker/nn/linear.h"
#include "worker/nn/model_config.h"
#include "worker/nn/slot_store.h"
#include "worker/nn/tensor_parallel.h"

namespace shardline::worker::nn {

class HeadLayer final : public Layer {
 public:
  static absl::StatusOr<std::unique_ptr<HeadLayer>> Create(Backend& backend,
                                                           const ModelConfig& config,
                                                           uint64_t seed,
                                                           const TensorParallel& tp = {});

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
    DeviceBuffer lse;          // vocabulary-parallel: each row's log-sum-exp over all classes
    HostTransfer losses_read;  // the last copy of `losses` to the host
  };

  HeadLayer(Backend& backend, const ModelConfig& config, const TensorParallel& tp)
      : backend_(backend), config_(config), tp_(tp) {}
  // The classes this rank's logits hold, of the whole vocabulary.
  CrossEntropyShape Classes(int64_t rows) const {
    return {rows, tp_.VocabRows(config_.vocab), tp_.VocabFirst(config_.vocab), config_.vocab};
  }
  // The rows' losses (and, split, their log-sum-exp) into s->losses.
  absl::Status Loss(const MicroBatch& mb, Saved& s, DeviceSpan<const float> logits);
  // Each of the n rows' first largest class into `out` (MicroBatch::
  // argmax_out), split: each rank's best gathered over the tensor group.
  absl::Status ArgMax(int64_t n, DeviceSpan<const float> logits, absl::Span<int32_t> out);

  Backend& backend_;
  const ModelConfig config_;
  const TensorParallel tp_;
  const std::string name_ = "head";
  Parameter norm_weight_, norm_bias_;
  Linear lm_head_;
  SlotStore<Saved> saved_;
  DeviceBuffer dlogits_, dh_;  // Backward temporaries
  DeviceBuffer parts_;         // vocabulary-parallel: [t × rows × 3], every rank's CrossEntropyParts
  DeviceBuffer argmax_parts_;  // vocabulary-parallel: [t × 2 · rows], every rank's best class of each row
};

}  // namespace shardline::worker::nn

#endif  // SHARDLINE_WORKER_NN_HEAD_LAYER_H_
