// Layer is one pipeline unit of the GPT model: the embedding, one transformer
// block, or the head (final norm, LM head, loss). A stage holds a contiguous
// range of layers. Each layer is a Forward/Backward pair over [batch·t, width]
// activations on one backend, and keeps what its backward pass needs per
// micro-batch slot between the two calls. Not thread-safe.
#ifndef SHARDLINE_WORKER_NN_LAYER_H_
#define SHARDLINE_WORKER_NN_LAYER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/backend/device_span.h"
#include "worker/backend/host_transfer.h"
#include "worker/nn/parameter.h"

namespace shardline::worker::nn {

// One micro-batch as the layers see it.
struct MicroBatch {
  int slot = 0;         // which saved activations to use (micro-batch index in the step)
  int64_t batch = 0;    // sequences
  int64_t t = 0;        // tokens per sequence (≤ context)
  DeviceSpan<const int32_t> ids;      // [batch·t] token ids, read by the embedding
  DeviceSpan<const int32_t> targets;  // [batch·t], < 0 ignored; empty: the head computes no loss
  float loss_scale = 1.0f;            // each counted token's loss is multiplied by this
  // With targets: host memory for each row's loss (rows floats; staging
  // memory, so the copy does not make the host wait), which the head fills
  // by a copy it queues, and where it puts that copy's transfer.
  absl::Span<float> losses_out;
  HostTransfer* losses_copied = nullptr;
  // When not empty (rows ints, host memory): the head writes each row's most
  // likely class, the first of its largest logits over the whole vocabulary
  // (exact-match validation); it waits for the logits to do so.
  absl::Span<int32_t> argmax_out;
  int64_t rows() const { return batch * t; }
};

class Layer {
 public:
  virtual ~Layer() = default;

  // "embedding", "blocks.N" or "head".
  virtual const std::string& name() const = 0;
  virtual std::vector<Parameter*> parameters() = 0;
  // Floats per token of the input (0 for the embedding, which reads ids) and output.
  virtual int64_t input_width() const = 0;
  virtual int64_t output_width() const = 0;

  // y = layer(x); saves what Backward needs under mb.slot.
  virtual absl::Status Forward(const MicroBatch& mb, DeviceSpan<const float> x,
                               DeviceSpan<float> y) = 0;
  // Writes dx (empty for the embedding) and adds parameter gradients; x is the
  // forward input, dy the gradient of the output (unused by the head, which
  // starts from its loss). Frees the slot.
  virtual absl::Status Backward(const MicroBatch& mb, DeviceSpan<const float> x,
                                DeviceSpan<const float> dy, DeviceSpan<float> dx) = 0;
  // Backward in two parts, for schedules that run the weight gradients later
  // (zero-bubble): BackwardInput writes dx and the parameter gradients that
  // are not deferred, keeping the slot (x and dy need not outlive the call);
  // BackwardWeights adds the rest and frees it. Every gradient gets the same
  // terms as from Backward, so the bits are the same. The default runs all of
  // Backward in the first part.
  virtual absl::Status BackwardInput(const MicroBatch& mb, DeviceSpan<const float> x,
                                     DeviceSpan<const float> dy, DeviceSpan<float> dx) {
    return Backward(mb, x, dy, dx);
  }
  virtual absl::Status BackwardWeights(int /*slot*/) { return absl::OkStatus(); }
  // Drops the slot's saved activations without a backward pass (evaluation).
  virtual void Discard(int slot) = 0;
};

}  // namespace shardline::worker::nn

#endif  // SHARDLINE_WORKER_NN_LAYER_H_
