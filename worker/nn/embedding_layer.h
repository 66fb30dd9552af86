// EmbeddingLayer: y[b, t] = tok_emb[ids[b, t]] + pos_emb[t]. The first
// pipeline unit; reads token ids instead of activations. Owns tok_emb.weight
// [vocab × C] and pos_emb.weight [context × C]. Vocabulary-parallel
// (tp.vocab_split()), a rank holds vocab/t rows of tok_emb (its Slice) and
// reads zeros for the ids held elsewhere; the group's all-reduce of the
// rows (one id's row and zeros, added: exactly the whole table's row) then
// gets pos_emb, replicated. Its gradient needs no collective: every rank
// gets the same dy. Not thread-safe.
#ifndef SHARDLINE_WORKER_NN_EMBEDDING_LAYER_H_
#define SHARDLINE_WORKER_NN_EMBEDDING_LAYER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/nn/layer.h"
#include "worker/nn/model_config.h"
#include "worker/nn/tensor_parallel.h"

namespace shardline::worker::nn {

class EmbeddingLayer final : public Layer {
 public:
  static absl::StatusOr<std::unique_ptr<EmbeddingLayer>> Create(Backend& backend,
                                                                const ModelConfig& config,
                                                                uint64_t seed,
                                                                const TensorParallel& tp = {});

  const std::string& name() const override { return name_; }
  std::vector<Parameter*> parameters() override { return {&tokens_, &positions_}; }
  int64_t input_width() const override { return 0; }
  int64_t output_width() const override { return config_.d_model; }
  absl::Status Forward(const MicroBatch& mb, DeviceSpan<const float> x,
                       DeviceSpan<float> y) override;
  absl::Status Backward(const MicroBatch& mb, DeviceSpan<const float> x,
                        DeviceSpan<const float> dy, DeviceSpan<float> dx) override;
  void Discard(int slot) override {}

 private:
  EmbeddingLayer(Backend& backend, const ModelConfig& config, const TensorParallel& tp)
      : backend_(backend), config_(config), tp_(tp) {}
  // The token rows this rank holds, of the whole vocabulary.
  EmbeddingShape TokenShape(int64_t rows) const {
    return {rows, tp_.VocabRows(config_.vocab), config_.d_model, tp_.VocabFirst(config_.vocab), config_.vocab};
  }
  // Position ids 0..t-1 repeated `batch` times, rebuilt when the shape changes.
  absl::Status EnsurePositionIds(int64_t batch, int64_t t);

  Backend& backend_;
  const ModelConfig config_;
  const TensorParallel tp_;
  const std::string name_ = "embedding";
  Parameter tokens_;
  Parameter positions_;
  DeviceBuffer position_ids_;
  int64_t position_batch_ = -1;
  int64_t position_t_ = -1;
};

}  // namespace shardline::worker::nn

#endif  // SHARDLINE_WORKER_NN_EMBEDDING_LAYER_H_
