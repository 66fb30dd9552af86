#include "worker/runtime/shard_runtime.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/nn/model_layers.h"

namespace shardline::worker::runtime {
namespace {

absl::Status SizeError(absl::string_view what, size_t got, int64_t want) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " has ", got, " elements, expected ", want));
}

template <typename T>
DeviceSpan<T> Prefix(DeviceBuffer& buffer, int64_t count) {
  return buffer.span<T>().subspan(0, static_cast<size_t>(count));
}

// Host → device and device → host, done on return when `wait`, queued
// otherwise (a copy in then starts once `after` is done: see
// Backend::CopyToDeviceAsync).
template <typename T>
absl::StatusOr<HostTransfer> CopyIn(Backend& backend, absl::Span<const T> src, DeviceSpan<T> dst,
                                    bool wait, const HostTransfer& after) {
  if (!wait) return backend.CopyToDeviceAsync(src, dst, after);
  RETURN_IF_ERROR(backend.CopyToDevice(src, dst));
  return HostTransfer();
}

template <typename T>
absl::StatusOr<HostTransfer> CopyOut(Backend& backend, DeviceSpan<const T> src, absl::Span<T> dst,
                                     bool wait) {
  if (!wait) return backend.CopyToHostAsync(src, dst);
  RETURN_IF_ERROR(backend.CopyToHost(src, dst));
  return HostTransfer();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardRuntime>> ShardRuntime::Create(
    Backend& backend, const nn::ModelConfig& config, int unit_begin, int unit_end, uint64_t seed,
    const nn::OptimizerConfig& optimizer, const nn::TensorParallel& tp) {
  std::unique_ptr<ShardRuntime> runtime(
      new ShardRuntime(backend, config, unit_begin, unit_end, optimizer, tp));
  ASSIGN_OR_RETURN(runtime->layers_,
                   nn::BuildLayers(backend, config, unit_begin, unit_end, seed, tp));
  return runtime;
}

ShardRuntime::~ShardRuntime() {
  for (auto& [slot, host] : host_) {
    (void)host.tokens_read.Wait();
    (void)host.losses_copied.Wait();
  }
}

int64_t ShardRuntime::input_width() const { return layers_.front()->input_width(); }
int64_t ShardRuntime::output_width() const { return layers_.back()->output_width(); }

std::vector<nn::Parameter*> ShardRuntime::parameters() {
  std::vector<nn::Parameter*> out;
  for (auto& layer : layers_) {
    for (nn::Parameter* p : layer->parameters()) out.push_back(p);
  }
  return out;
}

absl::Status ShardRuntime::CheckInputs(const Inputs& in) const {
  if (in.batch < 1 || in.t < 1 || in.t > config_.context || in.batch > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch of ", in.batch, " sequences × ",
                                                   in.t, " tokens (context ", config_.context, ")"));
  }
  const int64_t rows = in.batch * in.t;
  if (is_first() && static_cast<int64_t>(in.ids.size()) != rows) {
    return SizeError("token ids", in.ids.size(), rows);
  }
  if (!in.targets.empty() && static_cast<int64_t>(in.targets.size()) != rows) {
    return SizeError("targets", in.targets.size(), rows);
  }
  if (!in.targets.empty() && !is_last()) {
    return absl::InvalidArgumentError("targets given to a stage that has no head");
  }
  if (!in.argmax.empty() && !is_last()) return absl::InvalidArgumentError("argmax asked of a stage that has no head");
  if (!in.argmax.empty() && static_cast<int64_t>(in.argmax.size()) != rows) {
    return SizeError("argmax", in.argmax.size(), rows);
  }
  if (!is_first() && static_cast<int64_t>(in.activations.size()) != InputElements(rows)) {
    return SizeError("input activations", in.activations.size(), InputElements(rows));
  }
  if (!std::isfinite(in.loss_scale)) return absl::InvalidArgumentError("loss_scale is not finite");
  return absl::OkStatus();
}

nn::MicroBatch ShardRuntime::MicroBatchOf(int slot, Slot& s) {
  nn::MicroBatch mb;
  mb.slot = slot;
  mb.batch = s.batch;
  mb.t = s.t;
  const int64_t rows = s.batch * s.t;
  if (is_first()) mb.ids = Prefix<int32_t>(s.ids, rows);
  if (s.has_targets) mb.targets = Prefix<int32_t>(s.targets, rows);
  mb.loss_scale = s.loss_scale;
  return mb;
}

absl::Status ShardRuntime::set_edge_dtype(common::DType dtype) {
  if (dtype != common::DType::kF32 && dtype != common::DType::kBF16 && dtype != common::DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("edge precision must be f32, bf16 or f16, got ", common::DTypeName(dtype)));
  }
  edge_dtype_ = dtype;
  return absl::OkStatus();
}

absl::StatusOr<HostTransfer> ShardRuntime::UploadEdge(absl::Span<const float> host,
                                                      DeviceSpan<float> dst, DeviceBuffer& narrow,
                                                      bool wait, const HostTransfer& after) {
  if (edge_dtype_ == common::DType::kF32) return CopyIn(backend_, host, dst, wait, after);
  // The host holds host.size() 16-bit values: half the bytes cross the bus,
  // and the device widens them.
  const absl::Span<const uint16_t> halves(reinterpret_cast<const uint16_t*>(host.data()), host.size());
  RETURN_IF_ERROR(nn::EnsureFloats(backend_, narrow, (host.size() + 1) / 2));
  const DeviceSpan<uint16_t> staged = narrow.span<uint16_t>().subspan(0, host.size());
  ASSIGN_OR_RETURN(HostTransfer transfer, CopyIn(backend_, halves, staged, wait, after));
  RETURN_IF_ERROR(backend_.ConvertToF32(DeviceSpan<const uint16_t>(staged), edge_dtype_, dst));
  return transfer;
}

absl::StatusOr<HostTransfer> ShardRuntime::DownloadEdge(DeviceSpan<const float> src, DeviceBuffer& narrow,
                                                        absl::Span<float> host, bool wait) {
  if (edge_dtype_ == common::DType::kF32) return CopyOut(backend_, src, host, wait);
  // Narrowed on the device, so half the bytes cross the bus.
  RETURN_IF_ERROR(nn::EnsureFloats(backend_, narrow, (src.size() + 1) / 2));
  const DeviceSpan<uint16_t> narrowed = narrow.span<uint16_t>().subspan(0, src.size());
  RETURN_IF_ERROR(backend_.ConvertFromF32(src, edge_dtype_, narrowed));
  const absl::Span<uint16_t> halves(reinterpret_cast<uint16_t*>(host.data()), host.size());
  return CopyOut(backend_, DeviceSpan<const uint16_t>(narrowed), halves, wait);
}

absl::Status ShardRuntime::Forward(int slot, const Inputs& in, absl::Span<float> output) {
  return ForwardImpl(slot, in, output, /*wait=*/true).status();
}

absl::StatusOr<ShardRuntime::EdgeTransfers> ShardRuntime::ForwardAsync(int slot, const Inputs& in,
                                                                       absl::Span<float> output) {
  return ForwardImpl(slot, in, output, /*wait=*/false);
}

absl::StatusOr<ShardRuntime::EdgeTransfers> ShardRuntime::ForwardImpl(int slot, const Inputs& in,
                                                                      absl::Span<float> output,
                                                                      bool wait) {
  RETURN_IF_ERROR(CheckInputs(in));
  const int64_t rows = in.batch * in.t;
  if (!output.empty() && static_cast<int64_t>(output.size()) != OutputElements(rows)) {
    return SizeError("output", output.size(), OutputElements(rows));
  }
  ASSIGN_OR_RETURN(Slot * s, slots_.Acquire(slot));
  s->weights_pending = false;  // a recycled slot's, discarded between the two parts
  s->batch = in.batch;
  s->t = in.t;
  s->loss_scale = in.loss_scale;
  s->has_targets = !in.targets.empty();
  EdgeTransfers edge;  // copies in are queued in order: the last one's completion covers all
  SlotHostMemory& host = host_[slot];
  host.loss_rows = 0;  // until this pass has queued its losses
  absl::Status status = [&]() -> absl::Status {
    // A recycled slot's output may still be on its way to the host.
    RETURN_IF_ERROR(backend_.AwaitOnDevice(std::exchange(s->output_read, HostTransfer())));
    const size_t n = static_cast<size_t>(rows);
    if (is_first() || s->has_targets) {
      ASSIGN_OR_RETURN(edge.inputs_read, UploadTokens(in, *s, host, wait));
    }
    s->acts.resize(layers_.size() + 1);
    if (!is_first()) {
      RETURN_IF_ERROR(nn::EnsureFloats(backend_, s->acts[0], static_cast<size_t>(rows * input_width())));
      ASSIGN_OR_RETURN(edge.inputs_read,
                       UploadEdgeParts(in.activations, Prefix<float>(s->acts[0], rows * input_width()),
                                       s->narrow_input, wait, s->released, split_previous_));
    }
    nn::MicroBatch mb = MicroBatchOf(slot, *s);
    mb.argmax_out = in.argmax;
    if (s->has_targets) {
      RETURN_IF_ERROR(std::exchange(host.losses_copied, HostTransfer()).Wait());  // a step old
      ASSIGN_OR_RETURN(mb.losses_out, host.losses.Get<float>(backend_, n));
      mb.losses_copied = &host.losses_copied;
    }
    for (size_t i = 0; i < layers_.size(); ++i) {
      nn::Layer& layer = *layers_[i];
      const DeviceSpan<const float> x = Prefix<float>(s->acts[i], rows * layer.input_width());
      DeviceSpan<float> y;
      // The head needs no output buffer while training: it keeps its logits.
      const bool head_output_unused = i + 1 == layers_.size() && is_last() && output.empty();
      if (!head_output_unused) {
        const int64_t n = rows * layer.output_width();
        RETURN_IF_ERROR(nn::EnsureFloats(backend_, s->acts[i + 1], static_cast<size_t>(n)));
        y = Prefix<float>(s->acts[i + 1], n);
      }
      RETURN_IF_ERROR(layer.Forward(mb, x, y));
    }
    if (!output.empty()) {
      DeviceSpan<const float> y = Prefix<float>(s->acts.back(), rows * output_width());
      if (split_next_) {
        const collective::Chunk part = EdgePart(rows * output_width());
        y = y.subspan(part.begin, part.size());
      }
      // The last stage's output (logits) is no edge tensor: always f32.
      ASSIGN_OR_RETURN(edge.output_written,
                       is_last() ? CopyOut(backend_, y, output, wait) : DownloadEdge(y, s->narrow_output, output, wait));
      s->output_read = edge.output_written;
    }
    // Forward's contract reports bad targets now (the asynchronous pass: by
    // the step's next synchronising call).
    if (wait && s->has_targets) RETURN_IF_ERROR(backend_.Synchronize());
    if (s->has_targets) {
      host.loss_rows = n;
      host.loss_scale = in.loss_scale;
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    // The inputs must outlive every copy queued from them.
    (void)edge.inputs_read.Wait();
    Discard(slot);
    return status;
  }
  peak_slots_ = std::max(peak_slots_, slots_.live());
  return edge;
}

absl::StatusOr<HostTransfer> ShardRuntime::UploadTokens(const Inputs& in, Slot& s,
                                                        SlotHostMemory& host, bool wait) {
  const size_t n = static_cast<size_t>(in.batch * in.t);
  // The slot id's last upload, a step ago: long done.
  RETURN_IF_ERROR(std::exchange(host.tokens_read, HostTransfer()).Wait());
  ASSIGN_OR_RETURN(absl::Span<int32_t> staged,
                   host.tokens.Get<int32_t>(backend_, (is_first() ? n : 0) + (s.has_targets ? n : 0)));
  if (is_first()) {
    std::copy(in.ids.begin(), in.ids.end(), staged.begin());
    RETURN_IF_ERROR(nn::EnsureFloats(backend_, s.ids, n));
    ASSIGN_OR_RETURN(host.tokens_read, CopyIn(backend_, absl::Span<const int32_t>(staged.subspan(0, n)),
                                              Prefix<int32_t>(s.ids, n), wait, s.released));
    staged.remove_prefix(n);
  }
  if (s.has_targets) {
    std::copy(in.targets.begin(), in.targets.end(), staged.begin());
    RETURN_IF_ERROR(nn::EnsureFloats(backend_, s.targets, n));
    ASSIGN_OR_RETURN(host.tokens_read, CopyIn(backend_, absl::Span<const int32_t>(staged),
                                              Prefix<int32_t>(s.targets, n), wait, s.released));
  }
  return host.tokens_read;
}

absl::StatusOr<double> ShardRuntime::Loss(int slot) {
  auto it = host_.find(slot);
  if (it == host_.end() || it->second.loss_rows == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("slot ", slot, " has no loss: its last forward pass had no targets or failed"));
  }
  SlotHostMemory& host = it->second;
  RETURN_IF_ERROR(host.losses_copied.Wait());
  ASSIGN_OR_RETURN(absl::Span<float> rows, host.losses.Get<float>(backend_, host.loss_rows));
  // Ignored tokens have loss 0, so the plain sum counts only the targets.
  double sum = 0.0;
  for (float loss : rows) sum += loss;
  return sum * host.loss_scale;
}

absl::Status ShardRuntime::Backward(int slot, absl::Span<const float> grad_output,
                                    absl::Span<float> grad_input) {
  return BackwardImpl(slot, grad_output, grad_input, /*wait=*/true, nullptr).status();
}

absl::StatusOr<ShardRuntime::EdgeTransfers> ShardRuntime::BackwardAsync(
    int slot, absl::Span<const float> grad_output, absl::Span<float> grad_input,
    const GradientsFinal& gradients_final) {
  return BackwardImpl(slot, grad_output, grad_input, /*wait=*/false, gradients_final);
}

absl::StatusOr<ShardRuntime::EdgeTransfers> ShardRuntime::BackwardInputAsync(
    int slot, absl::Span<const float> grad_output, absl::Span<float> grad_input) {
  return BackwardImpl(slot, grad_output, grad_input, /*wait=*/false, nullptr, /*defer_weights=*/true);
}

absl::Status ShardRuntime::BackwardWeights(int slot, const GradientsFinal& gradients_final) {
  ASSIGN_OR_RETURN(Slot * s, slots_.Find(slot));
  if (!s->weights_pending) {
    return absl::FailedPreconditionError(
        absl::StrCat("micro-batch slot ", slot, " has no backward input part to finish"));
  }
  size_t first_parameter = gradients_final ? parameters().size() : 0;
  for (size_t i = layers_.size(); i-- > 0;) {
    RETURN_IF_ERROR(layers_[i]->BackwardWeights(slot));
    if (gradients_final) {
      first_parameter -= layers_[i]->parameters().size();
      RETURN_IF_ERROR(gradients_final(first_parameter));
    }
  }
  s->weights_pending = false;
  MarkReleased(*s);
  slots_.Release(slot);
  return absl::OkStatus();
}

absl::StatusOr<ShardRuntime::EdgeTransfers> ShardRuntime::BackwardImpl(
    int slot, absl::Span<const float> grad_output, absl::Span<float> grad_input, bool wait,
    const GradientsFinal& gradients_final, bool defer_weights) {
  ASSIGN_OR_RETURN(Slot * s, slots_.Find(slot));
  if (s->weights_pending) {
    return absl::FailedPreconditionError(absl::StrCat("micro-batch slot ", slot, " already had its backward pass"));
  }
  const int64_t rows = s->batch * s->t;
  if (is_last() && !grad_output.empty()) {
    return absl::InvalidArgumentError("the last stage starts backward from its loss: no grad_output");
  }
  if (!is_last() && static_cast<int64_t>(grad_output.size()) != OutputElements(rows)) {
    return SizeError("grad_output", grad_output.size(), OutputElements(rows));
  }
  if (!is_first() && static_cast<int64_t>(grad_input.size()) != InputElements(rows)) {
    return SizeError("grad_input", grad_input.size(), InputElements(rows));
  }
  EdgeTransfers edge;
  absl::Status status = [&]() -> absl::Status {
    DeviceBuffer* dy_buffer = &grad_a_;
    DeviceBuffer* dx_buffer = &grad_b_;
    DeviceSpan<const float> dy;
    if (!is_last()) {
      // Into the slot, so the copy may overlap the work still queued.
      RETURN_IF_ERROR(nn::EnsureFloats(backend_, s->grad_output, static_cast<size_t>(rows * output_width())));
      const DeviceSpan<float> dst = Prefix<float>(s->grad_output, rows * output_width());
      ASSIGN_OR_RETURN(edge.inputs_read,
                       UploadEdgeParts(grad_output, dst, s->narrow_grad, wait, s->released, split_next_));
      dy = dst;
    }
    // The stage's input gradient goes to one of two buffers in turn, so the
    // copy of the last one to the host overlaps this backward pass.
    GradIn& out = grad_in_[grad_in_next_];
    grad_in_next_ ^= 1;
    const nn::MicroBatch mb = MicroBatchOf(slot, *s);
    size_t first_parameter = 0;  // of layer i, in parameters() order; counted for the hook only
    if (gradients_final) first_parameter = parameters().size();
    for (size_t i = layers_.size(); i-- > 0;) {
      nn::Layer& layer = *layers_[i];
      DeviceSpan<float> dx;
      if (layer.input_width() > 0) {
        const int64_t n = rows * layer.input_width();
        DeviceBuffer& target = i == 0 ? out.buffer : *dx_buffer;
        if (i == 0) RETURN_IF_ERROR(backend_.AwaitOnDevice(std::exchange(out.read, HostTransfer())));
        RETURN_IF_ERROR(nn::EnsureFloats(backend_, target, static_cast<size_t>(n)));
        dx = Prefix<float>(target, n);
      }
      const DeviceSpan<const float> x = Prefix<float>(s->acts[i], rows * layer.input_width());
      RETURN_IF_ERROR(defer_weights ? layer.BackwardInput(mb, x, dy, dx) : layer.Backward(mb, x, dy, dx));
      if (gradients_final) {
        first_parameter -= layer.parameters().size();
        RETURN_IF_ERROR(gradients_final(first_parameter));
      }
      dy = dx;
      std::swap(dy_buffer, dx_buffer);
    }
    if (is_first()) return absl::OkStatus();
    if (split_previous_) {
      const collective::Chunk part = EdgePart(rows * input_width());
      dy = dy.subspan(part.begin, part.size());
    }
    ASSIGN_OR_RETURN(edge.output_written, DownloadEdge(dy, out.narrow, grad_input, wait));
    out.read = edge.output_written;
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    (void)edge.inputs_read.Wait();  // grad_output must outlive its copy
    return status;
  }
  if (defer_weights) {
    s->weights_pending = true;
    return edge;
  }
  MarkReleased(*s);
  slots_.Release(slot);
  return edge;
}

void ShardRuntime::MarkReleased(Slot& s) {
  absl::StatusOr<HostTransfer> mark = backend_.MarkQueued();
  if (mark.ok()) {
    s.released = *std::move(mark);
    return;
  }
  // Without a mark the next owner's copies could overtake the work still
  // reading this slot: let that work finish instead.
  (void)backend_.Synchronize();
  s.released = HostTransfer();
}

absl::StatusOr<int64_t> ShardRuntime::SlotTokens(int slot) {
  ASSIGN_OR_RETURN(Slot * s, slots_.Find(slot));
  return s->batch * s->t;
}

void ShardRuntime::Discard(int slot) {
  for (auto& layer : layers_) layer->Discard(slot);
  if (absl::StatusOr<Slot*> s = slots_.Find(slot); s.ok()) MarkReleased(**s);
  slots_.Release(slot);
}

}  // namespace shardline::worker::runtime
