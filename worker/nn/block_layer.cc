#include "worker/nn/block_layer.h"

#include "common/status_macros.h"
#include "worker/backend/attention.h"

namespace shardline::worker::nn {

absl::StatusOr<std::unique_ptr<BlockLayer>> BlockLayer::Create(Backend& backend, const ModelConfig& config,
                                                               int index, uint64_t seed, const TensorParallel& tp,
                                                               std::shared_ptr<Scratch> scratch) {
  RETURN_IF_ERROR(tp.Check(config.heads, config.d_model));
  std::unique_ptr<BlockLayer> layer(new BlockLayer(backend, config, index, tp));
  layer->scratch_ = scratch != nullptr ? std::move(scratch) : std::make_shared<Scratch>();
  const std::string& p = layer->name_;
  const int64_t c = config.d_model;
  // Megatron's splits (whole when unsplit): qkv by heads, its q, k and v
  // rows of this rank's heads; fc by blocks of 4·C/t; proj and mlp.proj by
  // the matching input features.
  using Kind = LinearSplit::Kind;
  LinearSplit qkv_split, proj_split, fc_split, mlp_proj_split;
  if (tp.split()) {
    qkv_split = {Kind::kColumns, {{0, c}, {c, 2 * c}, {2 * c, 3 * c}}, tp.rank, tp.size};
    proj_split = {Kind::kRows, {{0, c}}, tp.rank, tp.size};
    fc_split = {Kind::kColumns, {{0, 4 * c}}, tp.rank, tp.size};
    mlp_proj_split = {Kind::kRows, {{0, 4 * c}}, tp.rank, tp.size};
  }
  ASSIGN_OR_RETURN(layer->ln1_weight_, CreateParameter(backend, seed, p + ".ln1.weight", {c},
                                                       InitKind::kOnes, 0.0f, false));
  ASSIGN_OR_RETURN(layer->ln1_bias_, CreateParameter(backend, seed, p + ".ln1.bias", {c},
                                                     InitKind::kZeros, 0.0f, false));
  ASSIGN_OR_RETURN(layer->qkv_, Linear::Create(backend, seed, p + ".attn.qkv", c, 3 * c, true,
                                               config.init_std(), qkv_split));
  ASSIGN_OR_RETURN(layer->proj_, Linear::Create(backend, seed, p + ".attn.proj", c, c, true,
                                                config.residual_std(), proj_split));
  ASSIGN_OR_RETURN(layer->ln2_weight_, CreateParameter(backend, seed, p + ".ln2.weight", {c},
                                                       InitKind::kOnes, 0.0f, false));
  ASSIGN_OR_RETURN(layer->ln2_bias_, CreateParameter(backend, seed, p + ".ln2.bias", {c},
                                                     InitKind::kZeros, 0.0f, false));
  ASSIGN_OR_RETURN(layer->fc_, Linear::Create(backend, seed, p + ".mlp.fc", c, 4 * c, true,
                                              config.init_std(), fc_split));
  ASSIGN_OR_RETURN(layer->mlp_proj_, Linear::Create(backend, seed, p + ".mlp.proj", 4 * c, c, true,
                                                    config.residual_std(), mlp_proj_split));
  return layer;
}

std::vector<Parameter*> BlockLayer::parameters() {
  std::vector<Parameter*> out = {&ln1_weight_, &ln1_bias_};
  qkv_.AppendParameters(out);
  proj_.AppendParameters(out);
  out.push_back(&ln2_weight_);
  out.push_back(&ln2_bias_);
  fc_.AppendParameters(out);
  mlp_proj_.AppendParameters(out);
  return out;
}

absl::Status BlockLayer::EnsureScratch(int64_t rows, const AttentionShape& attn) {
  const size_t c = static_cast<size_t>(config_.d_model), n = static_cast<size_t>(rows);
  const size_t a = static_cast<size_t>(attention_width()), f = static_cast<size_t>(mlp_width());
  RETURN_IF_ERROR(EnsureFloats(backend_, scratch_->c, n * c));
  RETURN_IF_ERROR(EnsureFloats(backend_, scratch_->three_c, n * 3 * a));
  RETURN_IF_ERROR(EnsureFloats(backend_, scratch_->mlp_a, n * f));
  RETURN_IF_ERROR(EnsureFloats(backend_, scratch_->mlp_b, n * f));
  ASSIGN_OR_RETURN(const int64_t attention_scratch, AttentionScratchFloats(backend_, attn));
  return EnsureFloats(backend_, scratch_->attention, static_cast<size_t>(attention_scratch));
}

absl::Status BlockLayer::Forward(const MicroBatch& mb, DeviceSpan<const float> x,
                                 DeviceSpan<float> y) {
  const int64_t n = mb.rows(), c = config_.d_model;
  const size_t nc = static_cast<size_t>(n * c);
  const size_t na = static_cast<size_t>(n * attention_width()), nf = static_cast<size_t>(n * mlp_width());
  const AttentionShape attn{mb.batch, mb.t, heads(), config_.head_dim()};
  RETURN_IF_ERROR(EnsureScratch(n, attn));
  ASSIGN_OR_RETURN(const int64_t attention_saved, AttentionSavedFloats(backend_, attn));
  if (pending_.holds(mb.slot)) {
    return absl::AlreadyExistsError(absl::StrCat("micro-batch slot ", mb.slot, " is already held"));
  }
  ASSIGN_OR_RETURN(PassSaved * s, pass_.Acquire(mb.slot));
  absl::StatusOr<LinearInputs*> acquired = inputs_.Acquire(mb.slot);
  if (!acquired.ok()) {
    pass_.Release(mb.slot);
    return acquired.status();
  }
  LinearInputs* li = *acquired;
  for (auto [buffer, floats] : {std::pair{&li->h1, nc}, {&s->stats1, 2 * static_cast<size_t>(n)},
                                {&s->qkv, 3 * na}, {&s->attention, static_cast<size_t>(attention_saved)},
                                {&li->att, na}, {&s->r1, nc}, {&li->h2, nc},
                                {&s->stats2, 2 * static_cast<size_t>(n)}, {&s->f, nf},
                                {&li->g, nf}}) {
    RETURN_IF_ERROR(EnsureFloats(backend_, *buffer, floats));
  }
  auto f32 = [](DeviceBuffer& b) { return b.span<float>(); };
  const LayerNormShape ln{n, c, 1e-5f};
  auto mean1 = f32(s->stats1).subspan(0, n), rstd1 = f32(s->stats1).subspan(n, n);
  auto mean2 = f32(s->stats2).subspan(0, n), rstd2 = f32(s->stats2).subspan(n, n);
  DeviceSpan<float> tmp = f32(scratch_->c);

  RETURN_IF_ERROR(backend_.LayerNormForward(ln, x, ln1_weight_.v(), ln1_bias_.v(), f32(li->h1),
                                            mean1, rstd1));
  RETURN_IF_ERROR(qkv_.Forward(backend_, f32(li->h1), n, f32(s->qkv)));
  RETURN_IF_ERROR(AttentionForward(backend_, attn, f32(s->qkv), f32(li->att), f32(s->attention)));
  RETURN_IF_ERROR(proj_.Forward(backend_, f32(li->att), n, tmp));
  if (tp_.split()) {  // Megatron's g: the ranks' parts summed, then the bias once
    RETURN_IF_ERROR(tp_.AllReduce(tmp.subspan(0, nc)));
    RETURN_IF_ERROR(proj_.AddBias(backend_, tmp, n));
  }
  RETURN_IF_ERROR(backend_.Add(x, tmp.subspan(0, nc), f32(s->r1)));
  RETURN_IF_ERROR(backend_.LayerNormForward(ln, f32(s->r1), ln2_weight_.v(), ln2_bias_.v(),
                                            f32(li->h2), mean2, rstd2));
  RETURN_IF_ERROR(fc_.Forward(backend_, f32(li->h2), n, f32(s->f)));
  RETURN_IF_ERROR(backend_.GeluForward(f32(s->f).subspan(0, nf), f32(li->g)));
  RETURN_IF_ERROR(mlp_proj_.Forward(backend_, f32(li->g), n, tmp));
  if (tp_.split()) {
    RETURN_IF_ERROR(tp_.AllReduce(tmp.subspan(0, nc)));
    RETURN_IF_ERROR(mlp_proj_.AddBias(backend_, tmp, n));
  }
  return backend_.Add(f32(s->r1).subspan(0, nc), tmp.subspan(0, nc), y);
}

absl::Status BlockLayer::Backward(const MicroBatch& mb, DeviceSpan<const float> x,
                                  DeviceSpan<const float> dy, DeviceSpan<float> dx) {
  return BackwardPass(mb, x, dy, dx, /*defer=*/false);
}

absl::Status BlockLayer::BackwardInput(const MicroBatch& mb, DeviceSpan<const float> x,
                                       DeviceSpan<const float> dy, DeviceSpan<float> dx) {
  return BackwardPass(mb, x, dy, dx, /*defer=*/true);
}

absl::Status BlockLayer::BackwardPass(const MicroBatch& mb, DeviceSpan<const float> x,
                                      DeviceSpan<const float> dy, DeviceSpan<float> dx, bool defer) {
  const int64_t n = mb.rows(), c = config_.d_model;
  const size_t nc = static_cast<size_t>(n * c);
  const size_t na = static_cast<size_t>(n * attention_width()), nf = static_cast<size_t>(n * mlp_width());
  const AttentionShape attn{mb.batch, mb.t, heads(), config_.head_dim()};
  RETURN_IF_ERROR(EnsureScratch(n, attn));
  if (pending_.holds(mb.slot)) {
    return absl::FailedPreconditionError(
        absl::StrCat(name_, ": micro-batch slot ", mb.slot, " already had its backward pass"));
  }
  ASSIGN_OR_RETURN(PassSaved * s, pass_.Find(mb.slot));
  ASSIGN_OR_RETURN(LinearInputs * li, inputs_.Find(mb.slot));
  PendingGrads* pg = nullptr;
  if (defer) {
    ASSIGN_OR_RETURN(pg, pending_.Acquire(mb.slot));
  }
  auto f32 = [](DeviceBuffer& b) { return b.span<float>(); };
  const LayerNormShape ln{n, c, 1e-5f};
  auto mean1 = f32(s->stats1).subspan(0, n), rstd1 = f32(s->stats1).subspan(n, n);
  auto mean2 = f32(s->stats2).subspan(0, n), rstd2 = f32(s->stats2).subspan(n, n);
  DeviceSpan<float> dc = f32(scratch_->c).subspan(0, nc);
  DeviceSpan<float> dg = f32(scratch_->mlp_a).subspan(0, nf), df = f32(scratch_->mlp_b).subspan(0, nf);
  DeviceSpan<float> dqkv = f32(scratch_->three_c).subspan(0, 3 * na);
  if (defer) {  // the gradients BackwardWeights reads, kept in the slot
    for (auto [buffer, floats] : {std::pair{&pg->dy, nc}, {&pg->df, nf}, {&pg->dr1, nc}, {&pg->dqkv, 3 * na}}) {
      RETURN_IF_ERROR(EnsureFloats(backend_, *buffer, floats));
    }
    pg->rows = n;
    df = f32(pg->df).subspan(0, nf);
    dqkv = f32(pg->dqkv).subspan(0, 3 * na);
    RETURN_IF_ERROR(backend_.CopyOnDevice(dy.subspan(0, nc), f32(pg->dy).subspan(0, nc)));
  }
  // Linear layer `l`'s backward pass, or its input part only.
  auto linear_backward = [&](Linear& l, DeviceBuffer& input, DeviceSpan<const float> grad, DeviceSpan<float> out) {
    return defer ? l.BackwardInput(backend_, grad, n, out) : l.Backward(backend_, f32(input), grad, n, out);
  };

  // dx accumulates the residual stream's gradient: dy, then both branches.
  RETURN_IF_ERROR(backend_.CopyOnDevice(dy.subspan(0, nc), dx));
  // MLP branch.
  RETURN_IF_ERROR(linear_backward(mlp_proj_, li->g, dy, dg));
  RETURN_IF_ERROR(backend_.Fill(df, 0.0f));
  RETURN_IF_ERROR(backend_.GeluBackward(f32(s->f).subspan(0, nf), dg, df));
  RETURN_IF_ERROR(linear_backward(fc_, li->h2, df, dc));
  RETURN_IF_ERROR(tp_.AllReduce(dc));  // Megatron's f, backwards: the ranks' parts of ln2's output gradient
  RETURN_IF_ERROR(backend_.LayerNormBackward(ln, f32(s->r1), ln2_weight_.v(), mean2, rstd2, dc,
                                             dx, ln2_weight_.g(), ln2_bias_.g()));
  // Attention branch; dx now holds the full gradient of r1.
  if (defer) RETURN_IF_ERROR(backend_.CopyOnDevice(DeviceSpan<const float>(dx), f32(pg->dr1).subspan(0, nc)));
  RETURN_IF_ERROR(linear_backward(proj_, li->att, dx, dc));
  RETURN_IF_ERROR(backend_.Fill(dqkv, 0.0f));
  RETURN_IF_ERROR(AttentionBackward(backend_, attn, f32(s->qkv), f32(li->att), f32(s->attention), dc, dqkv,
                                    f32(scratch_->attention)));
  RETURN_IF_ERROR(linear_backward(qkv_, li->h1, dqkv, dc));
  RETURN_IF_ERROR(tp_.AllReduce(dc));
  RETURN_IF_ERROR(backend_.LayerNormBackward(ln, x, ln1_weight_.v(), mean1, rstd1, dc, dx,
                                             ln1_weight_.g(), ln1_bias_.g()));
  pass_.Release(mb.slot);
  if (!defer) inputs_.Release(mb.slot);
  return absl::OkStatus();
}

absl::Status BlockLayer::BackwardWeights(int slot) {
  if (!pending_.holds(slot)) {
    return absl::FailedPreconditionError(
        absl::StrCat(name_, ": micro-batch slot ", slot, " has no backward input part to finish"));
  }
  ASSIGN_OR_RETURN(PendingGrads * pg, pending_.Find(slot));
  ASSIGN_OR_RETURN(LinearInputs * li, inputs_.Find(slot));
  const int64_t n = pg->rows;
  const size_t nc = static_cast<size_t>(n * config_.d_model);
  const size_t na = static_cast<size_t>(n * attention_width()), nf = static_cast<size_t>(n * mlp_width());
  auto f32 = [](DeviceBuffer& b) { return b.span<float>(); };
  RETURN_IF_ERROR(mlp_proj_.BackwardWeights(backend_, f32(li->g), f32(pg->dy).subspan(0, nc), n));
  RETURN_IF_ERROR(fc_.BackwardWeights(backend_, f32(li->h2), f32(pg->df).subspan(0, nf), n));
  RETURN_IF_ERROR(proj_.BackwardWeights(backend_, f32(li->att), f32(pg->dr1).subspan(0, nc), n));
  RETURN_IF_ERROR(qkv_.BackwardWeights(backend_, f32(li->h1), f32(pg->dqkv).subspan(0, 3 * na), n));
  pending_.Release(slot);
  inputs_.Release(slot);
  return absl::OkStatus();
}

void BlockLayer::Discard(int slot) {
  pass_.Release(slot);
  inputs_.Release(slot);
  pending_.Release(slot);
}

}  // namespace shardline::worker::nn
