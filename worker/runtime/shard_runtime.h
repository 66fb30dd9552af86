// ShardRuntime runs a contiguous range of the model's pipeline units on one
// backend: forward and backward per micro-batch (keeping each micro-batch's
// activations in its own slot between the two), gradient accumulation across
// micro-batches, and the optimizer step. The single-process reference trainer
// is a ShardRuntime holding every unit; a pipeline stage holds a range.
//
// Data crosses the runtime's edge as host memory: token ids (first stage),
// targets (last stage), activations in from the previous stage and out to
// the next, gradients back. Not thread-safe: one thread drives it.
#ifndef SHARDLINE_WORKER_RUNTIME_SHARD_RUNTIME_H_
#define SHARDLINE_WORKER_RUNTIME_SHARD_RUNTIME_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/tensor.h"
#include "worker/backend/backend.h"
#include "worker/collective/collective.h"
#include "worker/nn/layer.h"
#include "worker/nn/model_config.h"
#include "worker/nn/optimizer.h"
#include "worker/nn/slot_store.h"
#include "worker/nn/tensor_parallel.h"
#include "worker/runtime/host_staging_buffer.h"

namespace shardline::worker::runtime {

class ShardRuntime {
 public:
  // Host-side inputs of one micro-batch.
  struct Inputs {
    int64_t batch = 0;
    int64_t t = 0;
    absl::Span<const int32_t> ids;          // [batch·t]; read on the first stage
    absl::Span<const int32_t> targets;      // [batch·t], < 0 ignored; last stage; empty: no loss
    float loss_scale = 1.0f;                // per counted token (1 / tokens counted in the step)
    absl::Span<const float> activations;    // [batch·t·input_width]; stages after the first
    // Last stage, when not empty ([batch·t]): each row's most likely class,
    // the first of its largest logits over the whole vocabulary (gathered
    // over a vocabulary-parallel head: every rank of it must ask), written
    // before Forward returns (exact-match validation).
    absl::Span<int32_t> argmax;
  };

  // Units [unit_begin, unit_end) of the model (see nn/model_layers.h), this
  // rank's part of them when `tp` splits them.
  static absl::StatusOr<std::unique_ptr<ShardRuntime>> Create(Backend& backend,
                                                              const nn::ModelConfig& config,
                                                              int unit_begin, int unit_end,
                                                              uint64_t seed,
                                                              const nn::OptimizerConfig& optimizer,
                                                              const nn::TensorParallel& tp = {});
  // Waits for the copies still using the runtime's staging memory.
  ~ShardRuntime();

  Backend& backend() { return backend_; }
  bool is_first() const { return unit_begin_ == 0; }
  bool is_last() const { return unit_end_ == config_.units(); }
  int unit_begin() const { return unit_begin_; }
  int unit_end() const { return unit_end_; }
  int64_t input_width() const;   // floats per token in (0 on the first stage)
  int64_t output_width() const;  // floats per token out (vocab on the last stage: logits)

  // Tensor parallelism across hosts: the edge with the previous stage
  // (input activations in, grad_input out) and/or with the next one
  // (output out, grad_output in) carries this rank's part of each tensor
  // only, collective::ChunkOf(n, t, rank), the t ranks of the neighbouring
  // stage sending theirs: a tensor crosses between the stages once instead
  // of t times (Megatron-LM's scatter/gather). Parts coming in are put
  // together by an all-gather over the tensor group before use; going out,
  // the rank's part of its (replicated) tensor is all it sends. Needs a
  // split runtime (tp.size > 1) and the neighbour on that side.
  absl::Status SplitEdges(bool previous, bool next);
  // Floats of a micro-batch of `rows` tokens at the edges, as the host
  // passes them: the whole tensor, or this rank's part of a split edge.
  int64_t InputElements(int64_t rows) const;
  int64_t OutputElements(int64_t rows) const;

  // Precision of the stage's edge tensors on the host (input activations,
  // the output but the last stage's logits, grad_output, grad_input): f32
  // (the default), or bf16 / f16, in which case a host tensor of n elements
  // holds n 16-bit values at the start of its n-float buffer, converted on
  // the device (round to nearest even), so half the bytes cross the bus.
  // Ids and targets stay i32.
  absl::Status set_edge_dtype(common::DType dtype);
  common::DType edge_dtype() const { return edge_dtype_; }

  // Runs the forward pass of micro-batch `slot`. When `output` is not empty it
  // receives the stage's output ([batch·t·output_width]: activations, or
  // logits on the last stage). ALREADY_EXISTS if the slot is already held.
  absl::Status Forward(int slot, const Inputs& inputs, absl::Span<float> output = {});
  // The loss of the last forward pass run on `slot` with targets (last
  // stage), Σ token loss · loss_scale, also after its backward pass: the
  // forward pass only queues the losses' copy to the host, and this waits
  // for it, so a stage can read its losses at the end of the step instead
  // of waiting for the device after each forward pass. FAILED_PRECONDITION
  // when that pass had no targets or failed.
  absl::StatusOr<double> Loss(int slot);
  // Runs the backward pass of `slot` and frees it. grad_output is the
  // gradient of this stage's output (empty on the last stage); grad_input
  // receives the gradient of its input (stages after the first).
  absl::Status Backward(int slot, absl::Span<const float> grad_output,
                        absl::Span<float> grad_input = {});
  // What ForwardAsync and BackwardAsync queued at the runtime's edge: the
  // host inputs (ids, targets, activations; grad_output) may be released or
  // reused once `inputs_read` is done, and the host output holds its values
  // once `output_written` is done.
  struct EdgeTransfers {
    HostTransfer inputs_read;
    HostTransfer output_written;
  };
  // Forward and Backward that queue the work and return without waiting for
  // the device: the output's copy to the host runs alongside the work queued
  // after it (on a GPU: the next micro-batch's). The caller keeps the input
  // memory and the output memory as they are until the transfers are done.
  // On the CPU backend everything has run when they return.
  absl::StatusOr<EdgeTransfers> ForwardAsync(int slot, const Inputs& inputs, absl::Span<float> output);
  // `gradients_final`, when set, is called after each layer's backward
  // work is queued with the index (in parameters() order) of the layer's
  // first parameter: on the step's last backward pass, the gradients from
  // there on are final (GradientBuckets starts their reduction); an error
  // it returns fails the pass.
  using GradientsFinal = std::function<absl::Status(size_t first_parameter)>;
  absl::StatusOr<EdgeTransfers> BackwardAsync(int slot, absl::Span<const float> grad_output,
                                              absl::Span<float> grad_input,
                                              const GradientsFinal& gradients_final = nullptr);
  // The backward pass in two parts (zero-bubble schedules): BackwardInputAsync
  // is BackwardAsync running each layer's input part only
  // (nn::Layer::BackwardInput) and keeping the slot; BackwardWeights adds the
  // deferred weight gradients, layer by layer from the last, calling
  // `gradients_final` as BackwardAsync does, and frees the slot. The
  // gradients' bits are BackwardAsync's.
  absl::StatusOr<EdgeTransfers> BackwardInputAsync(int slot, absl::Span<const float> grad_output,
                                                   absl::Span<float> grad_input);
  absl::Status BackwardWeights(int slot, const GradientsFinal& gradients_final = nullptr);
  // Tokens (batch·t) of a held slot; FAILED_PRECONDITION if it is not held.
  absl::StatusOr<int64_t> SlotTokens(int slot);
  // Frees a slot without a backward pass (evaluation).
  void Discard(int slot);

  absl::Status ZeroGrads();
  // This shard's parameters' gradient buffers, in parameter order.
  std::vector<DeviceSpan<float>> Gradients();
  // The Σ grad² of each of this shard's norm pieces (norm_pieces.h), in
  // parameter order, piece order.
  absl::StatusOr<std::vector<double>> GradSumsOfSquares();
  // Those terms added one by one, in order (the global grad norm of a shard
  // holding every layer). A pipeline stage adds its terms the same way onto
  // the sum carried in from the earlier stages, so that any cut gives the
  // same bits (PipelineStage::ReduceGradNorm).
  absl::StatusOr<double> GradSquaredNorm();
  // One optimizer update for `step` (1-based), gradients multiplied by grad_factor.
  absl::Status ApplyOptimizer(int64_t step, double grad_factor);
  // The same on `owned[i]` of parameter i only (ZeRO-1: nn::Optimizer::StepShares).
  absl::Status ApplyOptimizer(int64_t step, double grad_factor, const std::vector<nn::Optimizer::Share>& owned);
  // The optimizer state this shard holds now (bytes, on the backend).
  size_t optimizer_state_bytes();

  // Micro-batches whose activations are held now, and the most held at once
  // since the last ResetPeakSlots().
  size_t slots_held() const { return slots_.live(); }
  size_t peak_slots_held() const { return peak_slots_; }
  void ResetPeakSlots() { peak_slots_ = slots_.live(); }

  // The shard's parameters by global name, copied to the host (f32). The
  // tensors of `reuse` whose name, dtype and shape fit are taken from it and
  // written over instead of allocated (a checkpoint's snapshot memory, kept
  // from the last one: fresh pages cost far more than the copy).
  using HostTensors = std::map<std::string, common::Tensor>;
  absl::StatusOr<HostTensors> ExportWeights(HostTensors* reuse = nullptr);
  // ExportWeights plus the optimizer state, as "optimizer.m.<name>" and
  // "optimizer.v.<name>" (AdamW) or "optimizer.m.<name>" (SGD momentum),
  // once the optimizer has stepped; a ZeRO-1 share of the state is left
  // out (PipelineStage::ExportState gathers it).
  absl::StatusOr<HostTensors> ExportState(HostTensors* reuse = nullptr);
  // The names and shapes ExportState gives once the optimizer has stepped:
  // what a checkpoint holds.
  std::map<std::string, std::vector<int64_t>> StateLayout();
  // Sets this shard's parameters from `weights` (by global name, f32, same
  // shapes); extra names are ignored. NOT_FOUND / INVALID_ARGUMENT name the
  // parameter that is missing or does not fit.
  absl::Status ImportWeights(const std::map<std::string, common::Tensor>& weights);
  // ImportWeights plus the optimizer state ExportState writes, all of it
  // required (a restart from a committed version, after the optimizer has
  // stepped); with `owned` (ZeRO-1), only parameter i's elements owned[i]
  // are kept, end to end, as Optimizer::StepShares holds them.
  absl::Status ImportState(const std::map<std::string, common::Tensor>& state,
                           const std::vector<nn::Optimizer::Share>* owned = nullptr);
  std::vector<nn::Parameter*> parameters();
  const nn::OptimizerConfig& optimizer_config() const { return optimizer_.config(); }

 private:
  struct Slot {
    int64_t batch = 0, t = 0;
    float loss_scale = 1.0f;
    bool has_targets = false;
    DeviceBuffer ids, targets;
    std::vector<DeviceBuffer> acts;  // acts[i]: input of layer i; acts.back(): output
    DeviceBuffer grad_output;        // the gradient of the output, copied in for Backward
    DeviceBuffer narrow_input, narrow_grad, narrow_output;  // at a 16-bit edge precision
    HostTransfer output_read;        // the output's copy to the host, until the slot is reused
    // Done once the work of the slot's last owner has run: copies into a
    // recycled slot may start then, alongside later work (a fresh slot: at once).
    HostTransfer released;
    bool weights_pending = false;  // between BackwardInputAsync and BackwardWeights
  };
  // Host staging memory of one slot id. Ids are micro-batch indices, reused
  // step after step, while the store recycles a slot's storage at once (a
  // last stage's next forward pass takes what its backward pass just freed),
  // so memory kept here is free again long before it is reused. It holds the
  // token ids and targets on their way up (on CUDA a copy from pageable
  // memory makes the host wait for the device) and the per-row losses of the
  // last forward pass with targets on their way down, kept past the backward
  // pass for Loss.
  struct SlotHostMemory {
    HostStagingBuffer tokens;
    HostTransfer tokens_read;  // the last upload from `tokens`
    HostStagingBuffer losses;
    size_t loss_rows = 0;  // 0: no loss to read
    float loss_scale = 1.0f;
    HostTransfer losses_copied;
  };
  // One of the two buffers the stage's input gradient is written to in turn,
  // and the copy to the host that last read it.
  struct GradIn {
    DeviceBuffer buffer;
    DeviceBuffer narrow;  // at a 16-bit edge precision
    HostTransfer read;
  };

  ShardRuntime(Backend& backend, const nn::ModelConfig& config, int begin, int end,
               const nn::OptimizerConfig& optimizer, const nn::TensorParallel& tp)
      : backend_(backend), config_(config), unit_begin_(begin), unit_end_(end),
        optimizer_(backend, optimizer), tp_(tp) {}
  // The part of an edge tensor of `n` floats a split edge carries.
  collective::Chunk EdgePart(int64_t n) const;
  // Uploads `host` (the whole tensor, or this rank's part when `split`)
  // into `dst` and, split, all-gathers the parts over the tensor group.
  absl::StatusOr<HostTransfer> UploadEdgeParts(absl::Span<const float> host, DeviceSpan<float> dst,
                                               DeviceBuffer& narrow, bool wait, const HostTransfer& after,
                                               bool split);
  nn::MicroBatch MicroBatchOf(int slot, Slot& s);
  // `wait`: the synchronous edge copies (Forward, Backward); otherwise the
  // asynchronous ones, returned.
  absl::StatusOr<EdgeTransfers> ForwardImpl(int slot, const Inputs& inputs, absl::Span<float> output,
                                            bool wait);
  // `defer_weights`: the input parts only (BackwardInputAsync).
  absl::StatusOr<EdgeTransfers> BackwardImpl(int slot, absl::Span<const float> grad_output,
                                             absl::Span<float> grad_input, bool wait,
                                             const GradientsFinal& gradients_final, bool defer_weights = false);
  // One edge tensor between the host (at edge_dtype_) and the device (f32);
  // `narrow` is the device buffer a 16-bit tensor lands in (upload) or is
  // converted into (download). The transfer is done at once when `wait`; an
  // upload may start once `after` is done.
  absl::StatusOr<HostTransfer> UploadEdge(absl::Span<const float> host, DeviceSpan<float> dst,
                                          DeviceBuffer& narrow, bool wait, const HostTransfer& after);
  // Copies the token ids (first stage) and targets into `host`'s staging
  // memory and queues their uploads into the slot; the last upload.
  absl::StatusOr<HostTransfer> UploadTokens(const Inputs& in, Slot& s, SlotHostMemory& host, bool wait);
  // Marks the end of the work queued for `s` (before it goes back to the store).
  void MarkReleased(Slot& s);
  absl::StatusOr<HostTransfer> DownloadEdge(DeviceSpan<const float> src, DeviceBuffer& narrow,
                                            absl::Span<float> host, bool wait);
  absl::Status CheckInputs(const Inputs& inputs) const;

  Backend& backend_;
  const nn::ModelConfig config_;
  const int unit_begin_, unit_end_;
  nn::Optimizer optimizer_;
  const nn::TensorParallel tp_;
  bool split_previous_ = false, split_next_ = false;  // SplitEdges
  std::vector<std::unique_ptr<nn::Layer>> layers_;
  nn::SlotStore<Slot> slots_;
  std::map<int, SlotHostMemory> host_;  // by slot id
  size_t peak_slots_ = 0;
  DeviceBuffer grad_a_, grad_b_;  // ping-pong gradients between layers in Backward
  GradIn grad_in_[2];
  int grad_in_next_ = 0;
  common::DType edge_dtype_ = common::DType::kF32;
};

// The f32 tensor `name` of `shape`: moved out of `reuse` when one fits,
// else a new one (zeros).
absl::StatusOr<common::Tensor> TakeHostTensor(ShardRuntime::HostTensors& reuse, const std::string& name,
                                              const std::vector<int64_t>& shape);

}  // namespace shardline::worker::runtime

#endif  // SHARDLINE_WORKER_RUNTIME_SHARD_RUNTIME_H_
