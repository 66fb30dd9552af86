// Backend is the compute device a worker runs its shard on: memory, GEMM and
// every kernel the GPT layers need. Implementations: the CPU backend (BLAS,
// the reference oracle) and the CUDA backend (cuBLAS + our kernels). Create
// one with CreateBackend() (backend_factory.h).
//
// Contract shared by every implementation:
// - All tensors are f32, row-major, in the backend's own memory, passed as
//   DeviceSpans with explicit dimensions. Ids and targets are i32.
// - Every public method validates its arguments first (dimensions, span
//   lengths, null data) and returns INVALID_ARGUMENT without touching memory
//   when they are wrong. Validation lives here, once, for every backend.
// - Work may run asynchronously on the backend's stream, in call order.
//   CopyToHost, SumOfSquares and Synchronize wait for it; CopyToHostAsync and
//   CopyToDeviceAsync do not (they return a HostTransfer to wait on). Errors found while
//   the work runs (a CUDA failure, a token id out of range on the GPU) are
//   reported by the next of those calls.
// - Backward ops ADD into every gradient they produce (dx, dweight, dbias),
//   so gradients accumulate across micro-batches; the caller zeroes them.
//   The one exception is CausalSoftmaxBackward, a building block of attention
//   that overwrites its output (and may run in place).
//
// A Backend is not thread-safe: one thread drives it (its stream is a queue).
#ifndef SHARDLINE_WORKER_BACKEND_BACKEND_H_
#define SHARDLINE_WORKER_BACKEND_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "worker/backend/backend_types.h"
#include "worker/backend/device_buffer.h"
#include "worker/backend/device_span.h"
#include "worker/backend/host_transfer.h"
#include "worker/backend/work_timer.h"

namespace shardline::worker {

// One GEMM's shape and operands, for Backend::GemmPair.
struct GemmCall {
  GemmShape shape;
  DeviceSpan<const float> a, b;
  DeviceSpan<float> c;
};

// A validated GEMM as the implementations get it (leading dimensions filled in).
struct GemmOperands {
  GemmShape shape;
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // "cpu" or "cuda:N".
  virtual std::string name() const = 0;
  // One line for logs and reports: library versions, device model, threads.
  virtual std::string description() const = 0;

  // Bytes this backend can still allocate (host: available RAM; GPU: free
  // device memory), for planning.
  virtual absl::StatusOr<int64_t> MemoryAvailable() = 0;

  // Host memory for tensors on their way between this device and the
  // network (stage-link staging slots): page-locked on CUDA devices, so
  // copies to and from it run at the bus's speed; 64-byte aligned heap
  // memory here. Allocated rarely (once per job), never on a hot path.
  virtual absl::StatusOr<void*> AllocateHostStaging(size_t bytes) { return AllocatePlainHost(bytes); }
  virtual void FreeHostStaging(void* memory) { FreePlainHost(memory); }
  // The plain kind, for callers without a backend too.
  static absl::StatusOr<void*> AllocatePlainHost(size_t bytes);
  static void FreePlainHost(void* memory);
  virtual bool host_staging_pinned() const { return false; }

  // ---- Memory ----
  // Uninitialised memory; RESOURCE_EXHAUSTED when the device is full.
  virtual absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) = 0;
  // Allocate() + Fill(0) for `count` floats.
  absl::StatusOr<DeviceBuffer> AllocateZeros(size_t count);

  template <typename T>
  absl::Status CopyToDevice(absl::Span<const T> src, DeviceSpan<T> dst) {
    return CopyToDeviceBytes(src.data(), src.size() * sizeof(T), dst.data(), dst.size() * sizeof(T));
  }
  // Waits for queued work, then copies; the host data is valid on return.
  template <typename T>
  absl::Status CopyToHost(DeviceSpan<const T> src, absl::Span<T> dst) {
    return CopyToHostBytes(src.data(), src.size() * sizeof(T), dst.data(), dst.size() * sizeof(T));
  }
  template <typename T>
  absl::Status CopyOnDevice(DeviceSpan<const T> src, DeviceSpan<T> dst) {
    return CopyOnDeviceBytes(src.data(), src.size() * sizeof(T), dst.data(), dst.size() * sizeof(T));
  }
  absl::Status Fill(DeviceSpan<float> x, float value);
  // Waits for all queued work and reports any error it raised (copies to
  // the host from CopyToHostAsync excepted: their transfers say when).
  virtual absl::Status Synchronize() = 0;

  // ---- Copies that overlap compute (the stage links' staging) ----
  // Queues a copy of `src` into host memory `dst` that starts once the work
  // queued so far has run and runs on a copy engine of its own, alongside
  // the work queued after it; returns without waiting. `src` must keep its
  // values until the transfer is done: work that overwrites it is queued
  // after AwaitOnDevice(transfer). From page-locked memory
  // (AllocateHostStaging) the copy runs at the bus's speed. Errors of the
  // kernels before it (a token id out of range) are reported by the next
  // CopyToHost, SumOfSquares or Synchronize, not by the transfer.
  template <typename T>
  absl::StatusOr<HostTransfer> CopyToHostAsync(DeviceSpan<const T> src, absl::Span<T> dst) {
    return CopyToHostAsyncBytes(src.data(), src.size() * sizeof(T), dst.data(), dst.size() * sizeof(T));
  }
  // Queues a copy of host `src` into `dst` in order with the other work
  // (work queued after it sees the values); returns without waiting. `src`
  // must stay allocated and unchanged until the transfer is done.
  template <typename T>
  absl::StatusOr<HostTransfer> CopyToDeviceAsync(absl::Span<const T> src, DeviceSpan<T> dst) {
    return CopyToDeviceAsyncBytes(src.data(), src.size() * sizeof(T), dst.data(), dst.size() * sizeof(T),
                                  nullptr);
  }
  // The same, but the copy may start as soon as `after` is done (a
  // MarkQueued() taken once the last work reading `dst` was queued) instead
  // of after all the work queued so far: on CUDA it runs on a copy engine
  // alongside that work. Work queued after it still sees the values.
  template <typename T>
  absl::StatusOr<HostTransfer> CopyToDeviceAsync(absl::Span<const T> src, DeviceSpan<T> dst,
                                                 const HostTransfer& after) {
    return CopyToDeviceAsyncBytes(src.data(), src.size() * sizeof(T), dst.data(), dst.size() * sizeof(T),
                                  &after);
  }
  // Done once the work queued so far has run (on the CPU: at once).
  virtual absl::StatusOr<HostTransfer> MarkQueued() { return HostTransfer(); }
  // Work queued from now on starts only after `transfer` has finished. The
  // host waits only on backends that run work as it is queued (the CPU).
  virtual absl::Status AwaitOnDevice(const HostTransfer& transfer) { return transfer.Wait(); }

  // ---- Timing ----
  // Starts timing the work queued from now until the timer's Stop(). By
  // default the wall time between the calls (right where work runs as it is
  // queued).
  virtual absl::StatusOr<std::unique_ptr<WorkTimer>> StartTimer();

  // ---- Dense algebra ----
  absl::Status Gemm(const GemmShape& shape, DeviceSpan<const float> a, DeviceSpan<const float> b,
                    DeviceSpan<float> c);
  // Two independent GEMMs, each as Gemm: neither C may overlap the other
  // call's A, B or C. A backend may run them at once (the CPU backend on an
  // even number of threads gives each half of them: on two, each GEMM runs
  // whole on one thread and no operand is packed twice). Each C gets the
  // same bits on every run with the same thread count.
  absl::Status GemmPair(const GemmCall& first, const GemmCall& second);

  // ---- Element-wise ----
  absl::Status Axpy(float alpha, DeviceSpan<const float> x, DeviceSpan<float> y);  // y += alpha·x
  absl::Status Scale(DeviceSpan<float> x, float alpha);                           // x *= alpha
  absl::Status Add(DeviceSpan<const float> a, DeviceSpan<const float> b,
                   DeviceSpan<float> out);  // out = a + b (out may alias a or b)
  // x[r, :] += bias for every row r of x [rows × cols].
  absl::Status BiasAdd(DeviceSpan<float> x, DeviceSpan<const float> bias, int64_t rows, int64_t cols);
  // out[c] += Σ_r x[r, c]: the bias gradient.
  absl::Status SumRows(DeviceSpan<const float> x, DeviceSpan<float> out, int64_t rows, int64_t cols);
  // GELU, tanh approximation (GPT-2). y = gelu(x); dx += dy · gelu'(x).
  absl::Status GeluForward(DeviceSpan<const float> x, DeviceSpan<float> y);
  absl::Status GeluBackward(DeviceSpan<const float> x, DeviceSpan<const float> dy,
                            DeviceSpan<float> dx);

  // ---- Normalisation and attention pieces ----
  absl::Status LayerNormForward(const LayerNormShape& shape, DeviceSpan<const float> x,
                                DeviceSpan<const float> gamma, DeviceSpan<const float> beta,
                                DeviceSpan<float> y, DeviceSpan<float> mean, DeviceSpan<float> rstd);
  absl::Status LayerNormBackward(const LayerNormShape& shape, DeviceSpan<const float> x,
                                 DeviceSpan<const float> gamma, DeviceSpan<const float> mean,
                                 DeviceSpan<const float> rstd, DeviceSpan<const float> dy,
                                 DeviceSpan<float> dx, DeviceSpan<float> dgamma,
                                 DeviceSpan<float> dbeta);
  // probs[b, i, j] = softmax_j≤i(scale · scores[b, i, j]), 0 for j > i.
  // scores and probs are [batch, t, t] and may be the same memory.
  absl::Status CausalSoftmaxForward(const SoftmaxShape& shape, DeviceSpan<const float> scores,
                                    DeviceSpan<float> probs);
  // dscores = scale · probs ⊙ (dprobs − Σ_j dprobs ⊙ probs). Overwrites
  // dscores, which may be the same memory as dprobs.
  absl::Status CausalSoftmaxBackward(const SoftmaxShape& shape, DeviceSpan<const float> probs,
                                     DeviceSpan<const float> dprobs, DeviceSpan<float> dscores);

  // ---- Embedding and loss ----
  // out[r, :] (+)= table[ids[r], :]; `accumulate` adds instead of writing.
  absl::Status EmbeddingForward(const EmbeddingShape& shape, DeviceSpan<const int32_t> ids,
                                DeviceSpan<const float> table, DeviceSpan<float> out,
                                bool accumulate);
  // dtable[ids[r], :] += dout[r, :], in row order (deterministic).
  absl::Status EmbeddingBackward(const EmbeddingShape& shape, DeviceSpan<const int32_t> ids,
                                 DeviceSpan<const float> dout, DeviceSpan<float> dtable);
  // losses[r] = −log softmax(logits[r, :])[targets[r]], or 0 where
  // targets[r] < 0 (ignored position).
  absl::Status CrossEntropyForward(const CrossEntropyShape& shape, DeviceSpan<const float> logits,
                                   DeviceSpan<const int32_t> targets, DeviceSpan<float> losses);
  // dlogits[r, :] += grad_scale · (softmax(logits[r, :]) − onehot(targets[r]))
  // for every row whose target is not ignored. With `lse` ([rows]) the
  // softmax's denominator is exp(lse[r]), the log-sum-exp over all classes
  // (CrossEntropyCombine's), so a slice of the classes (shape.first,
  // shape.total) gets its part of the whole row's gradient; without it the
  // logits must be whole rows.
  absl::Status CrossEntropyBackward(const CrossEntropyShape& shape, DeviceSpan<const float> logits,
                                    DeviceSpan<const int32_t> targets, float grad_scale,
                                    DeviceSpan<float> dlogits, DeviceSpan<const float> lse = {});
  // Vocabulary-parallel cross-entropy (Megatron-LM's, without gathering the
  // logits), step 1: a slice of each row's classes gives parts[r] = (max_j
  // x_j, Σ_j exp(x_j − max), x[target − first] where this slice holds the
  // target, else 0); parts: [rows × 3]. Targets are checked against
  // shape.total.
  absl::Status CrossEntropyParts(const CrossEntropyShape& shape, DeviceSpan<const float> logits,
                                 DeviceSpan<const int32_t> targets, DeviceSpan<float> parts);
  // Step 2, from every slice's parts, added in slice order (the same bits
  // on every rank): lse[r] = M + log Σ_k s_k·exp(m_k − M) with M = max_k
  // m_k, and losses[r] = lse[r] − Σ_k z_k, or 0 where targets[r] < 0.
  absl::Status CrossEntropyCombine(const LossPartsShape& shape, DeviceSpan<const float> parts,
                                   DeviceSpan<const int32_t> targets, DeviceSpan<float> losses,
                                   DeviceSpan<float> lse);

  // ---- Optimizers and reductions ----
  absl::Status AdamWUpdate(const AdamWStep& step, DeviceSpan<float> params,
                           DeviceSpan<const float> grads, DeviceSpan<float> m, DeviceSpan<float> v);
  absl::Status SgdMomentumUpdate(const SgdStep& step, DeviceSpan<float> params,
                                 DeviceSpan<const float> grads, DeviceSpan<float> momentum);
  // Σ x², accumulated in double. Waits for queued work.
  absl::StatusOr<double> SumOfSquares(DeviceSpan<const float> x);
  // SumOfSquares of each span, the same values, waiting for the device once
  // for all of them instead of once each (a stage's gradient norm).
  absl::StatusOr<std::vector<double>> SumsOfSquares(absl::Span<const DeviceSpan<const float>> xs);

  // ---- A backend's own attention kernel ----
  // attention.h's AttentionForward/Backward validate their arguments and
  // then call these where has_attention_kernel() (else they compose the
  // attention from the operations above). Pointers as in attention.h;
  // batch > 0.
  virtual bool has_attention_kernel() const { return false; }
  // Floats the kernel's forward pass keeps for its backward pass (`saved`).
  virtual int64_t AttentionKernelSavedFloats(const AttentionShape& shape) const {
    return shape.batch * shape.heads * shape.t * shape.t;
  }
  virtual absl::Status AttentionForwardKernel(const AttentionShape& shape, const float* qkv, float* out,
                                              float* saved);
  virtual absl::Status AttentionBackwardKernel(const AttentionShape& shape, const float* qkv, const float* out,
                                               const float* saved, const float* dout, float* dqkv);

  // ---- Precision conversion (round to nearest even) ----
  // dtype is kBF16 or kF16; dst/src hold the 16-bit patterns.
  absl::Status ConvertFromF32(DeviceSpan<const float> src, common::DType dtype,
                              DeviceSpan<uint16_t> dst);
  absl::Status ConvertToF32(DeviceSpan<const uint16_t> src, common::DType dtype,
                            DeviceSpan<float> dst);

 protected:
  Backend() = default;

  // The implementations. Arguments are already validated.
  virtual absl::Status CopyToDeviceImpl(const void* src, void* dst, size_t bytes) = 0;
  virtual absl::Status CopyToHostImpl(const void* src, void* dst, size_t bytes) = 0;
  virtual absl::Status CopyOnDeviceImpl(const void* src, void* dst, size_t bytes) = 0;
  // By default the asynchronous copies are the synchronous ones, done when
  // they return.
  virtual absl::StatusOr<HostTransfer> CopyToHostAsyncImpl(const void* src, void* dst, size_t bytes);
  // `after`: null for "after the work queued so far"; see CopyToDeviceAsync.
  virtual absl::StatusOr<HostTransfer> CopyToDeviceAsyncImpl(const void* src, void* dst, size_t bytes,
                                                             const HostTransfer* after);
  virtual absl::Status FillImpl(float* x, size_t n, float value) = 0;
  virtual absl::Status GemmImpl(const GemmShape& shape, const float* a, const float* b,
                                float* c) = 0;
  // By default one GemmImpl after the other.
  virtual absl::Status GemmPairImpl(const GemmOperands& first, const GemmOperands& second);
  virtual absl::Status AxpyImpl(float alpha, const float* x, float* y, size_t n) = 0;
  virtual absl::Status ScaleImpl(float* x, size_t n, float alpha) = 0;
  virtual absl::Status AddImpl(const float* a, const float* b, float* out, size_t n) = 0;
  virtual absl::Status BiasAddImpl(float* x, const float* bias, int64_t rows, int64_t cols) = 0;
  virtual absl::Status SumRowsImpl(const float* x, float* out, int64_t rows, int64_t cols) = 0;
  virtual absl::Status GeluForwardImpl(const float* x, float* y, size_t n) = 0;
  virtual absl::Status GeluBackwardImpl(const float* x, const float* dy, float* dx, size_t n) = 0;
  virtual absl::Status LayerNormForwardImpl(const LayerNormShape& shape, const float* x,
                                            const float* gamma, const float* beta, float* y,
                                            float* mean, float* rstd) = 0;
  virtual absl::Status LayerNormBackwardImpl(const LayerNormShape& shape, const float* x,
                                             const float* gamma, const float* mean,
                                             const float* rstd, const float* dy, float* dx,
                                             float* dgamma, float* dbeta) = 0;
  virtual absl::Status CausalSoftmaxForwardImpl(const SoftmaxShape& shape, const float* scores,
                                                float* probs) = 0;
  virtual absl::Status CausalSoftmaxBackwardImpl(const SoftmaxShape& shape, const float* probs,
                                                 const float* dprobs, float* dscores) = 0;
  virtual absl::Status EmbeddingForwardImpl(const EmbeddingShape& shape, const int32_t* ids,
                                            const float* table, float* out, bool accumulate) = 0;
  virtual absl::Status EmbeddingBackwardImpl(const EmbeddingShape& shape, const int32_t* ids,
                                             const float* dout, float* dtable) = 0;
  virtual absl::Status CrossEntropyForwardImpl(const CrossEntropyShape& shape, const float* logits,
                                               const int32_t* targets, float* losses) = 0;
  // `lse` may be null (whole rows: the kernel computes it).
  virtual absl::Status CrossEntropyBackwardImpl(const CrossEntropyShape& shape,
                                                const float* logits, const int32_t* targets,
                                                const float* lse, float grad_scale, float* dlogits) = 0;
  virtual absl::Status CrossEntropyPartsImpl(const CrossEntropyShape& shape, const float* logits,
                                             const int32_t* targets, float* parts) = 0;
  virtual absl::Status CrossEntropyCombineImpl(const LossPartsShape& shape, const float* parts,
                                               const int32_t* targets, float* losses, float* lse) = 0;
  virtual absl::Status AdamWUpdateImpl(const AdamWStep& step, float* params, const float* grads,
                                       float* m, float* v, size_t n) = 0;
  virtual absl::Status SgdMomentumUpdateImpl(const SgdStep& step, float* params,
                                             const float* grads, float* momentum, size_t n) = 0;
  virtual absl::StatusOr<double> SumOfSquaresImpl(const float* x, size_t n) = 0;
  // `xs` validated (an empty one has a null or any pointer). Default:
  // SumOfSquaresImpl of each.
  virtual absl::StatusOr<std::vector<double>> SumsOfSquaresImpl(
      absl::Span<const DeviceSpan<const float>> xs);
  virtual absl::Status ConvertFromF32Impl(const float* src, common::DType dtype, uint16_t* dst,
                                          size_t n) = 0;
  virtual absl::Status ConvertToF32Impl(const uint16_t* src, common::DType dtype, float* dst,
                                        size_t n) = 0;

 private:
  absl::Status CopyToDeviceBytes(const void* src, size_t src_bytes, void* dst, size_t dst_bytes);
  absl::Status CopyToHostBytes(const void* src, size_t src_bytes, void* dst, size_t dst_bytes);
  absl::Status CopyOnDeviceBytes(const void* src, size_t src_bytes, void* dst, size_t dst_bytes);
  absl::StatusOr<HostTransfer> CopyToHostAsyncBytes(const void* src, size_t src_bytes, void* dst,
                                                     size_t dst_bytes);
  absl::StatusOr<HostTransfer> CopyToDeviceAsyncBytes(const void* src, size_t src_bytes, void* dst,
                                                       size_t dst_bytes, const HostTransfer* after);
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_BACKEND_BACKEND_H_
