#include "worker/nn/head_layer.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::worker::nn {

absl::StatusOr<std::unique_ptr<HeadLayer>> HeadLayer::Create(Backend& backend,
                                                             const ModelConfig& config,
                                                             uint64_t seed, const TensorParallel& tp) {
  RETURN_IF_ERROR(tp.CheckVocab(config.vocab));
  std::unique_ptr<HeadLayer> layer(new HeadLayer(backend, config, tp));
  const int64_t c = config.d_model;
  ASSIGN_OR_RETURN(layer->norm_weight_, CreateParameter(backend, seed, "ln_f.weight", {c},
                                                        InitKind::kOnes, 0.0f, false));
  ASSIGN_OR_RETURN(layer->norm_bias_, CreateParameter(backend, seed, "ln_f.bias", {c},
                                                      InitKind::kZeros, 0.0f, false));
  LinearSplit split;  // column-parallel: the logits' classes [k·V/t, (k+1)·V/t)
  if (tp.vocab_split()) split = {LinearSplit::Kind::kColumns, {{0, config.vocab}}, tp.rank, tp.size};
  ASSIGN_OR_RETURN(layer->lm_head_, Linear::Create(backend, seed, "lm_head", c, config.vocab,
                                                   /*bias=*/false, config.init_std(), split));
  return layer;
}

std::vector<Parameter*> HeadLayer::parameters() {
  std::vector<Parameter*> out = {&norm_weight_, &norm_bias_};
  lm_head_.AppendParameters(out);
  return out;
}

absl::Status HeadLayer::Forward(const MicroBatch& mb, DeviceSpan<const float> x,
                                DeviceSpan<float> y) {
  const int64_t n = mb.rows(), c = config_.d_model, v = lm_head_.out();
  if (!y.empty() && tp_.vocab_split()) {
    return absl::FailedPreconditionError(
        "the vocabulary-parallel head keeps its logits split over the tensor group: it computes the loss, not "
        "whole logits");
  }
  ASSIGN_OR_RETURN(Saved * s, saved_.Acquire(mb.slot));
  RETURN_IF_ERROR(EnsureFloats(backend_, s->h, static_cast<size_t>(n * c)));
  RETURN_IF_ERROR(EnsureFloats(backend_, s->stats, static_cast<size_t>(2 * n)));
  RETURN_IF_ERROR(EnsureFloats(backend_, s->logits, static_cast<size_t>(n * v)));
  RETURN_IF_ERROR(EnsureFloats(backend_, s->losses, static_cast<size_t>(n)));
  auto stats = s->stats.span<float>();
  const LayerNormShape ln{n, c, 1e-5f};
  RETURN_IF_ERROR(backend_.LayerNormForward(ln, x, norm_weight_.v(), norm_bias_.v(),
                                            s->h.span<float>(), stats.subspan(0, n),
                                            stats.subspan(n, n)));
  auto logits = s->logits.span<float>().subspan(0, static_cast<size_t>(n * v));
  RETURN_IF_ERROR(lm_head_.Forward(backend_, s->h.span<float>(), n, logits));
  if (!y.empty()) RETURN_IF_ERROR(backend_.CopyOnDevice(DeviceSpan<const float>(logits), y));
  if (!mb.argmax_out.empty()) RETURN_IF_ERROR(ArgMax(n, logits, mb.argmax_out));
  if (mb.targets.empty()) return absl::OkStatus();

  if (mb.losses_copied == nullptr) {
    return absl::InvalidArgumentError("head forward with targets needs somewhere to put the losses");
  }
  // A recycled slot's losses may still be on their way to the host.
  RETURN_IF_ERROR(backend_.AwaitOnDevice(std::exchange(s->losses_read, HostTransfer())));
  RETURN_IF_ERROR(Loss(mb, *s, logits));
  ASSIGN_OR_RETURN(*mb.losses_copied,
                   backend_.CopyToHostAsync(DeviceSpan<const float>(s->losses.span<float>().subspan(
                                                0, static_cast<size_t>(n))),
                                            mb.losses_out));
  s->losses_read = *mb.losses_copied;
  return absl::OkStatus();
}

absl::Status HeadLayer::Loss(const MicroBatch& mb, Saved& s, DeviceSpan<const float> logits) {
  const int64_t n = mb.rows();
  if (!tp_.vocab_split()) {
    return backend_.CrossEntropyForward(CrossEntropyShape{n, config_.vocab}, logits, mb.targets,
                                        s.losses.span<float>());
  }
  // Rank k's parts in chunk k; gathered, every rank combines them alike.
  const size_t chunk = static_cast<size_t>(3 * n);
  RETURN_IF_ERROR(EnsureFloats(backend_, parts_, chunk * tp_.size));
  RETURN_IF_ERROR(EnsureFloats(backend_, s.lse, static_cast<size_t>(n)));
  auto parts = parts_.span<float>().subspan(0, chunk * tp_.size);
  RETURN_IF_ERROR(backend_.CrossEntropyParts(Classes(n), logits, mb.targets,
                                             parts.subspan(chunk * tp_.rank, chunk)));
  RETURN_IF_ERROR(tp_.group->AllGather(parts));
  return backend_.CrossEntropyCombine(LossPartsShape{n, tp_.size}, parts, mb.targets, s.losses.span<float>(),
                                      s.lse.span<float>());
}

absl::Status HeadLayer::ArgMax(int64_t n, DeviceSpan<const float> logits, absl::Span<int32_t> out) {
  if (static_cast<int64_t>(out.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("argmax for ", out.size(), " rows of ", n));
  }
  const int64_t v = lm_head_.out(), first = Classes(n).first;
  std::vector<float> host(static_cast<size_t>(n * v));
  RETURN_IF_ERROR(backend_.CopyToHost(logits, absl::MakeSpan(host)));
  // [max of each row..., its first index...], indices as floats (exact: a vocabulary has at most 2^20).
  std::vector<float> best(static_cast<size_t>(2 * n));
  for (int64_t r = 0; r < n; ++r) {
    const float* row = host.data() + r * v;
    const int64_t j = std::max_element(row, row + v) - row;
    best[static_cast<size_t>(r)] = row[j];
    best[static_cast<size_t>(n + r)] = static_cast<float>(first + j);
  }
  if (tp_.vocab_split()) {
    // Every rank's bests gathered; the largest wins, the lowest rank (the
    // lowest classes) among equals, as over the whole row.
    const size_t chunk = best.size();
    RETURN_IF_ERROR(EnsureFloats(backend_, argmax_parts_, chunk * tp_.size));
    auto parts = argmax_parts_.span<float>().subspan(0, chunk * tp_.size);
    RETURN_IF_ERROR(backend_.CopyToDevice(absl::Span<const float>(best), parts.subspan(chunk * tp_.rank, chunk)));
    RETURN_IF_ERROR(tp_.group->AllGather(parts));
    std::vector<float> all(chunk * tp_.size);
    RETURN_IF_ERROR(backend_.CopyToHost(DeviceSpan<const float>(parts), absl::MakeSpan(all)));
    std::copy(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(chunk), best.begin());  // rank 0's
    for (int k = 1; k < tp_.size; ++k) {
      const float* theirs = all.data() + chunk * k;
      for (int64_t r = 0; r < n; ++r) {
        if (theirs[r] > best[static_cast<size_t>(r)]) {
          best[static_cast<size_t>(r)] = theirs[r];
          best[static_cast<size_t>(n + r)] = theirs[n + r];
        }
      }
    }
  }
  for (int64_t r = 0; r < n; ++r) out[static_cast<size_t>(r)] = static_cast<int32_t>(best[static_cast<size_t>(n + r)]);
  return absl::OkStatus();
}

absl::Status HeadLayer::Backward(const MicroBatch& mb, DeviceSpan<const float> x,
                                 DeviceSpan<const float> dy, DeviceSpan<float> dx) {
  if (mb.targets.empty()) {
    return absl::FailedPreconditionError("head backward needs the micro-batch's targets");
  }
  const int64_t n = mb.rows(), c = config_.d_model, v = lm_head_.out();
  ASSIGN_OR_RETURN(Saved * s, saved_.Find(mb.slot));
  RETURN_IF_ERROR(EnsureFloats(backend_, dlogits_, static_cast<size_t>(n * v)));
  RETURN_IF_ERROR(EnsureFloats(backend_, dh_, static_cast<size_t>(n * c)));
  auto dlogits = dlogits_.span<float>().subspan(0, static_cast<size_t>(n * v));
  auto dh = dh_.span<float>().subspan(0, static_cast<size_t>(n * c));
  RETURN_IF_ERROR(backend_.Fill(dlogits, 0.0f));
  RETURN_IF_ERROR(backend_.CrossEntropyBackward(Classes(n), s->logits.span<float>(), mb.targets, mb.loss_scale,
                                                dlogits,
                                                tp_.vocab_split() ? DeviceSpan<const float>(s->lse.span<float>())
                                                                  : DeviceSpan<const float>()));
  RETURN_IF_ERROR(lm_head_.Backward(backend_, s->h.span<float>(), dlogits, n, dh));
  // Each rank's classes give a part of dh: Megatron's f, before ln_f.
  if (tp_.vocab_split()) RETURN_IF_ERROR(tp_.AllReduce(dh));
  RETURN_IF_ERROR(backend_.Fill(dx.subspan(0, static_cast<size_t>(n * c)), 0.0f));
  auto stats = s->stats.span<float>();
  RETURN_IF_ERROR(backend_.LayerNormBackward(LayerNormShape{n, c, 1e-5f}, x, norm_weight_.v(),
                                             stats.subspan(0, n), stats.subspan(n, n), dh, dx,
                                             norm_weight_.g(), norm_bias_.g()));
  saved_.Release(mb.slot);
  return absl::OkStatus();
}

}  // namespace shardline::worker::nn
