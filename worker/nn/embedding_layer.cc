#include "worker/nn/embedding_layer.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::worker::nn {

absl::StatusOr<std::unique_ptr<EmbeddingLayer>> EmbeddingLayer::Create(Backend& backend,
                                                                       const ModelConfig& config,
                                                                       uint64_t seed,
                                                                       const TensorParallel& tp) {
  RETURN_IF_ERROR(tp.CheckVocab(config.vocab));
  std::unique_ptr<EmbeddingLayer> layer(new EmbeddingLayer(backend, config, tp));
  Slice rows;  // tok_emb's rows [k·V/t, (k+1)·V/t) when vocabulary-parallel
  if (tp.vocab_split()) rows = Slice{0, {{0, config.vocab}}, tp.rank, tp.size};
  ASSIGN_OR_RETURN(layer->tokens_,
                   CreateParameter(backend, seed, "tok_emb.weight", {config.vocab, config.d_model},
                                   InitKind::kNormal, config.init_std(), /*decay=*/true, rows));
  ASSIGN_OR_RETURN(layer->positions_, CreateParameter(backend, seed, "pos_emb.weight",
                                                      {config.context, config.d_model},
                                                      InitKind::kNormal, config.init_std(),
                                                      /*decay=*/true));
  return layer;
}

absl::Status EmbeddingLayer::EnsurePositionIds(int64_t batch, int64_t t) {
  if (batch == position_batch_ && t == position_t_) return absl::OkStatus();
  std::vector<int32_t> ids(static_cast<size_t>(batch * t));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % t);
  ASSIGN_OR_RETURN(position_ids_, backend_.Allocate(ids.size() * sizeof(int32_t)));
  RETURN_IF_ERROR(
      backend_.CopyToDevice(absl::Span<const int32_t>(ids), position_ids_.span<int32_t>()));
  position_batch_ = batch;
  position_t_ = t;
  return absl::OkStatus();
}

absl::Status EmbeddingLayer::Forward(const MicroBatch& mb, DeviceSpan<const float> x,
                                     DeviceSpan<float> y) {
  if (mb.t > config_.context) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence of ", mb.t, " tokens is longer than the context ", config_.context));
  }
  RETURN_IF_ERROR(EnsurePositionIds(mb.batch, mb.t));
  RETURN_IF_ERROR(backend_.EmbeddingForward(TokenShape(mb.rows()), mb.ids, tokens_.v(), y, /*accumulate=*/false));
  if (tp_.vocab_split()) {
    RETURN_IF_ERROR(tp_.AllReduce(y.subspan(0, static_cast<size_t>(mb.rows() * config_.d_model))));
  }
  const EmbeddingShape pos{mb.rows(), config_.context, config_.d_model};
  return backend_.EmbeddingForward(pos, position_ids_.span<int32_t>(), positions_.v(), y,
                                   /*accumulate=*/true);
}

absl::Status EmbeddingLayer::Backward(const MicroBatch& mb, DeviceSpan<const float> x,
                                      DeviceSpan<const float> dy, DeviceSpan<float> dx) {
  RETURN_IF_ERROR(EnsurePositionIds(mb.batch, mb.t));
  RETURN_IF_ERROR(backend_.EmbeddingBackward(TokenShape(mb.rows()), mb.ids, dy, tokens_.g()));
  const EmbeddingShape pos{mb.rows(), config_.context, config_.d_model};
  return backend_.EmbeddingBackward(pos, position_ids_.span<int32_t>(), dy, positions_.g());
}

}  // namespace shardline::worker::nn
