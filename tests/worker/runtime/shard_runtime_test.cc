#include "worker/runtime/shard_runtime.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/deferred_copy_backend.h"
#include "tests/worker/runtime/shard_runtime_fixture.h"

namespace shardline::worker::runtime {
namespace {

using testing::ShardRuntimeTest;

TEST_F(ShardRuntimeTest, OneMicroBatchOrFourGiveTheSameLossAndGradients) {
  const float scale = static_cast<float>(1.0 / batch_.target_count());
  auto whole = Make(0, config_.units());
  ASSERT_TRUE(whole->Forward(0, Inputs(batch_, scale)).ok());
  const double loss = *whole->Loss(0);
  ASSERT_TRUE(whole->Backward(0, {}).ok());

  auto split = Make(0, config_.units());
  double split_loss = 0;
  for (int k = 0; k < 4; ++k) {  // one sequence per micro-batch
    data::Batch part = data_->TrainBatch(1, k, 1).value();
    ASSERT_TRUE(split->Forward(k, Inputs(part, scale)).ok());
    split_loss += *split->Loss(k);
    ASSERT_TRUE(split->Backward(k, {}).ok());
  }
  // Not the same arithmetic: the whole batch sums each GEMM over all four
  // sequences at once, the split run accumulates four partial gradients, so
  // float rounding differs (1e-5 relative).
  EXPECT_NEAR(split_loss, loss, 1e-5 * std::fabs(loss));
  const auto a = Grads(*whole), b = Grads(*split);
  for (const auto& [name, g] : a) {
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_NEAR(b.at(name)[i], g[i], 1e-5 + 1e-5 * std::fabs(g[i])) << name << "[" << i << "]";
    }
  }
}

TEST_F(ShardRuntimeTest, TwoStagesChainedMatchOneRuntimeExactly) {
  const float scale = static_cast<float>(1.0 / batch_.target_count());
  auto whole = Make(0, config_.units());
  ASSERT_TRUE(whole->Forward(0, Inputs(batch_, scale)).ok());
  const double loss = *whole->Loss(0);
  ASSERT_TRUE(whole->Backward(0, {}).ok());

  auto first = Make(0, 2), second = Make(2, config_.units());
  const size_t acts = static_cast<size_t>(batch_.batch * batch_.t * first->output_width());
  std::vector<float> activations(acts), grad(acts);
  ShardRuntime::Inputs in0 = Inputs(batch_, scale);
  in0.targets = {};
  ASSERT_TRUE(first->Forward(0, in0, absl::Span<float>(activations)).ok());
  ShardRuntime::Inputs in1 = Inputs(batch_, scale);
  in1.ids = {};
  in1.activations = activations;
  ASSERT_TRUE(second->Forward(0, in1).ok());
  EXPECT_EQ(*second->Loss(0), loss);
  ASSERT_TRUE(second->Backward(0, {}, absl::Span<float>(grad)).ok());
  ASSERT_TRUE(first->Backward(0, grad).ok());

  auto expected = Grads(*whole);
  auto got = Grads(*first);
  for (auto& [name, g] : Grads(*second)) got[name] = g;
  EXPECT_EQ(got, expected);
}

// The asynchronous edge (what pipeline stages use) computes exactly what the
// synchronous one does, micro-batch by micro-batch, with several in flight:
// a middle stage, so both the activation and the gradient edges are copied.
TEST_F(ShardRuntimeTest, AsyncEdgesMatchSynchronousOnesWithSeveralMicroBatchesInFlight) {
  auto sync = Make(1, 3), async = Make(1, 3);
  const int64_t rows = batch_.batch * batch_.t;
  const size_t in_n = static_cast<size_t>(rows * sync->input_width());
  const size_t out_n = static_cast<size_t>(rows * sync->output_width());
  constexpr int kMicroBatches = 3;
  std::vector<std::vector<float>> acts(kMicroBatches), grads(kMicroBatches);
  std::vector<std::vector<float>> out_sync(kMicroBatches, std::vector<float>(out_n));
  std::vector<std::vector<float>> out_async = out_sync;
  std::vector<std::vector<float>> gin_sync(kMicroBatches, std::vector<float>(in_n));
  std::vector<std::vector<float>> gin_async = gin_sync;
  std::vector<ShardRuntime::EdgeTransfers> transfers;
  for (int k = 0; k < kMicroBatches; ++k) {
    acts[k].resize(in_n);
    grads[k].resize(out_n);
    for (size_t i = 0; i < in_n; ++i) acts[k][i] = std::sin(0.01f * static_cast<float>(i + 97 * k));
    for (size_t i = 0; i < out_n; ++i) grads[k][i] = std::cos(0.02f * static_cast<float>(i + 31 * k));
    ShardRuntime::Inputs in{batch_.batch, batch_.t, {}, {}, 0.25f, acts[k]};
    ASSERT_TRUE(sync->Forward(k, in, absl::Span<float>(out_sync[k])).ok());
    auto edge = async->ForwardAsync(k, in, absl::Span<float>(out_async[k]));
    ASSERT_TRUE(edge.ok()) << edge.status();
    transfers.push_back(*edge);
  }
  for (int k = 0; k < kMicroBatches; ++k) {
    ASSERT_TRUE(sync->Backward(k, grads[k], absl::Span<float>(gin_sync[k])).ok());
    auto edge = async->BackwardAsync(k, grads[k], absl::Span<float>(gin_async[k]));
    ASSERT_TRUE(edge.ok()) << edge.status();
    transfers.push_back(*edge);
  }
  for (const auto& t : transfers) {
    ASSERT_TRUE(t.inputs_read.Wait().ok());
    ASSERT_TRUE(t.output_written.Wait().ok());
  }
  EXPECT_EQ(async->slots_held(), 0u);
  EXPECT_EQ(out_async, out_sync);
  EXPECT_EQ(gin_async, gin_sync);
  EXPECT_EQ(Grads(*async), Grads(*sync));
}

// On a device whose copies to the host finish later, memory a copy still
// reads is not overwritten: a recycled micro-batch slot waits for its last
// output's copy, and the input gradient buffer of two passes ago for its copy.
TEST_F(ShardRuntimeTest, PendingCopiesToTheHostSurviveTheReuseOfTheirMemory) {
  shardline::testing::DeferredCopyBackend late(absl::Milliseconds(20));
  auto async = Make(1, 3, &late);
  auto sync = Make(1, 3);
  const int64_t rows = batch_.batch * batch_.t;
  const size_t in_n = static_cast<size_t>(rows * sync->input_width());
  const size_t out_n = static_cast<size_t>(rows * sync->output_width());
  auto input = [&](int k) {
    std::vector<float> v(in_n);
    for (size_t i = 0; i < in_n; ++i) v[i] = std::sin(0.05f * static_cast<float>(i) + static_cast<float>(k));
    return v;
  };
  std::vector<std::vector<float>> acts;
  for (int k = 0; k < 5; ++k) acts.push_back(input(k));
  auto in = [&](int k) { return ShardRuntime::Inputs{batch_.batch, batch_.t, {}, {}, 0.5f, acts[k]}; };

  // Slot 0's storage goes to slot 1 while slot 0's output is on its way out.
  std::vector<float> want0(out_n), want1(out_n), got0(out_n), got1(out_n);
  ASSERT_TRUE(sync->Forward(0, in(0), absl::Span<float>(want0)).ok());
  ASSERT_TRUE(sync->Forward(1, in(1), absl::Span<float>(want1)).ok());
  auto f0 = async->ForwardAsync(0, in(0), absl::Span<float>(got0));
  ASSERT_TRUE(f0.ok()) << f0.status();
  async->Discard(0);
  auto f1 = async->ForwardAsync(1, in(1), absl::Span<float>(got1));
  ASSERT_TRUE(f1.ok()) << f1.status();
  ASSERT_TRUE(f0->output_written.Wait().ok() && f1->output_written.Wait().ok());
  EXPECT_EQ(got0, want0);
  EXPECT_EQ(got1, want1);

  // Three backward passes in a row: the third writes the buffer whose copy
  // the first queued.
  std::vector<float> grad(out_n);
  for (size_t i = 0; i < out_n; ++i) grad[i] = 1e-2f * std::cos(0.03f * static_cast<float>(i));
  for (int k = 2; k < 5; ++k) {
    ASSERT_TRUE(sync->Forward(k, in(k)).ok());
    ASSERT_TRUE(async->ForwardAsync(k, in(k), {}).ok());
  }
  std::vector<std::vector<float>> want_gin(5, std::vector<float>(in_n)), got_gin = want_gin;
  std::vector<HostTransfer> copies;
  for (int k = 2; k < 5; ++k) {
    ASSERT_TRUE(sync->Backward(k, grad, absl::Span<float>(want_gin[k])).ok());
    auto b = async->BackwardAsync(k, grad, absl::Span<float>(got_gin[k]));
    ASSERT_TRUE(b.ok()) << b.status();
    copies.push_back(b->output_written);
  }
  for (const HostTransfer& c : copies) ASSERT_TRUE(c.Wait().ok());
  EXPECT_EQ(got_gin, want_gin);
  EXPECT_GT(late.deferred_copies(), 0);
}

// Token ids and targets go up from host staging memory (on CUDA, a copy
// from pageable memory makes the host wait for the device), and a slot id
// run again writes that memory only once its last upload is done.
TEST_F(ShardRuntimeTest, TokensGoUpFromStagingMemoryThatOutlivesItsCopies) {
  shardline::testing::DeferredCopyBackend late(absl::Milliseconds(20));
  auto async = Make(0, config_.units(), &late);
  auto sync = Make(0, config_.units());
  HostTransfer last_upload;
  std::vector<data::Batch> parts;
  for (int k = 0; k < 3; ++k) parts.push_back(data_->TrainBatch(1, k, 1).value());
  for (const data::Batch& part : parts) {
    const float scale = static_cast<float>(1.0 / part.target_count());
    ASSERT_TRUE(sync->Forward(0, Inputs(part, scale)).ok());
    sync->Discard(0);
    // Slot 0 again, while the upload of its last tokens is still reading them.
    auto f = async->ForwardAsync(0, Inputs(part, scale), {});
    ASSERT_TRUE(f.ok()) << f.status();
    last_upload = f->inputs_read;
    async->Discard(0);
  }
  EXPECT_EQ(*async->Loss(0), *sync->Loss(0));
  ASSERT_TRUE(last_upload.Wait().ok());  // copies finish in order
  EXPECT_EQ(late.uploads_from_pageable(), 0);
  EXPECT_EQ(late.host_changes_seen(), 0);
}

// The last stage's forward pass queues its losses' copy to the host and
// returns; Loss waits for it, also after the backward pass has freed the
// slot, and a slot's storage recycled meanwhile leaves the losses alone.
TEST_F(ShardRuntimeTest, LossesArriveAfterTheForwardPassAndOutliveTheSlot) {
  shardline::testing::DeferredCopyBackend late(absl::Milliseconds(20));
  auto async = Make(0, config_.units(), &late);
  auto sync = Make(0, config_.units());
  std::vector<double> want;
  for (int k = 0; k < 3; ++k) {
    const data::Batch part = data_->TrainBatch(1, k, 1).value();
    const float scale = static_cast<float>(1.0 / part.target_count());
    ASSERT_TRUE(sync->Forward(k, Inputs(part, scale)).ok());
    want.push_back(*sync->Loss(k));
    ASSERT_TRUE(sync->Backward(k, {}).ok());
    // On a fresh slot nothing is waited for (a recycled one waits, on this
    // CPU-based backend, for the copies of its last owner): with the copies
    // held back, a forward pass that waited for its losses would fail.
    if (k == 0) late.Hold();
    ASSERT_TRUE(async->ForwardAsync(k, Inputs(part, scale), {}).ok());
    if (k == 0) {
      EXPECT_EQ(late.waits_while_held(), 0) << "the forward pass waited for its losses";
      EXPECT_EQ(late.deferred_copies(), 0);
      late.Release();
    }
    ASSERT_TRUE(async->BackwardAsync(k, {}, {}).ok());  // frees the slot for the next one
  }
  for (int k = 0; k < 3; ++k) {
    auto loss = async->Loss(k);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_EQ(*loss, want[k]) << "micro-batch " << k;
  }
  EXPECT_EQ(async->Loss(7).status().code(), absl::StatusCode::kFailedPrecondition);
  // A pass without targets leaves no loss behind, not even an earlier one's.
  ShardRuntime::Inputs no_targets = Inputs(batch_, 1.0f);
  no_targets.targets = {};
  ASSERT_TRUE(async->ForwardAsync(0, no_targets, {}).ok());
  async->Discard(0);
  EXPECT_EQ(async->Loss(0).status().code(), absl::StatusCode::kFailedPrecondition);
}

// The hook GradientBuckets starts its reductions from: after each layer,
// from the last to the first, the gradients from the named parameter on
// hold their values of the whole pass, and the earlier ones do not yet.
TEST_F(ShardRuntimeTest, GradientsFinalNamesEachLayersFirstParameterAsItsGradientsAreDone) {
  const float scale = static_cast<float>(1.0 / batch_.target_count());
  auto runtime = Make(0, config_.units());
  const std::vector<nn::Parameter*> params = runtime->parameters();
  std::vector<size_t> calls;
  std::vector<std::vector<std::vector<float>>> seen;  // at each call: every gradient from `first` on
  auto download = [&](size_t p) {
    std::vector<float> g(params[p]->count());
    EXPECT_TRUE(backend_->CopyToHost(DeviceSpan<const float>(params[p]->g()), absl::Span<float>(g)).ok());
    return g;
  };
  ASSERT_TRUE(runtime->ZeroGrads().ok());
  ASSERT_TRUE(runtime->ForwardAsync(0, Inputs(batch_, scale), {}).ok());
  ASSERT_TRUE(runtime->BackwardAsync(0, {}, {}, [&](size_t first) {
    calls.push_back(first);
    seen.emplace_back();
    for (size_t p = first; p < params.size(); ++p) seen.back().push_back(download(p));
    // The parameter just before `first` still waits for its layer.
    if (first > 0) {
      EXPECT_EQ(download(first - 1), std::vector<float>(params[first - 1]->count(), 0.0f));
    }
    return absl::OkStatus();
  }).ok());
  ASSERT_EQ(calls.size(), static_cast<size_t>(config_.units()));  // one layer per unit here
  EXPECT_EQ(calls.back(), 0u);
  for (size_t c = 1; c < calls.size(); ++c) EXPECT_LT(calls[c], calls[c - 1]);
  for (size_t c = 0; c < calls.size(); ++c) {
    for (size_t p = calls[c]; p < params.size(); ++p) {
      EXPECT_EQ(seen[c][p - calls[c]], download(p)) << params[p]->name << " after call " << c;
    }
  }
  // An error from the hook fails the pass.
  ASSERT_TRUE(runtime->ForwardAsync(0, Inputs(batch_, scale), {}).ok());
  EXPECT_EQ(runtime->BackwardAsync(0, {}, {}, [](size_t) { return absl::AbortedError("no"); }).status().code(),
            absl::StatusCode::kAborted);
}

// The backward pass in two parts, the weight parts run later and after
// other micro-batches' input parts, gives every gradient the bits of whole
// backward passes; the slot is held until its weight part, which is where
// the gradients become final; parts out of order are refused.
TEST_F(ShardRuntimeTest, BackwardInTwoPartsGivesTheWholePassesBits) {
  const float scale = static_cast<float>(1.0 / batch_.target_count());
  auto whole = Make(0, config_.units());
  auto split = Make(0, config_.units());
  ASSERT_TRUE(whole->ZeroGrads().ok() && split->ZeroGrads().ok());
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(whole->Forward(k, Inputs(batch_, scale)).ok());
    ASSERT_TRUE(split->Forward(k, Inputs(batch_, scale)).ok());
  }
  for (int k = 0; k < 2; ++k) ASSERT_TRUE(whole->Backward(k, {}).ok());
  ASSERT_TRUE(split->BackwardInputAsync(0, {}, {}).ok());
  EXPECT_EQ(split->BackwardInputAsync(0, {}, {}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(split->BackwardAsync(0, {}, {}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(split->BackwardWeights(1).code(), absl::StatusCode::kFailedPrecondition) << "no input part yet";
  ASSERT_TRUE(split->BackwardInputAsync(1, {}, {}).ok());
  EXPECT_EQ(split->slots_held(), 2u) << "held until the weight parts";
  std::vector<size_t> calls;
  ASSERT_TRUE(split->BackwardWeights(0).ok());
  ASSERT_TRUE(split->BackwardWeights(1, [&](size_t first) {
    calls.push_back(first);
    return absl::OkStatus();
  }).ok());
  EXPECT_EQ(split->slots_held(), 0u);
  ASSERT_EQ(calls.size(), static_cast<size_t>(config_.units()));
  EXPECT_EQ(calls.back(), 0u);
  EXPECT_EQ(split->BackwardWeights(1).code(), absl::StatusCode::kFailedPrecondition) << "freed";
  EXPECT_EQ(Grads(*split), Grads(*whole));
  // A slot discarded between the parts is free for the next forward pass.
  ASSERT_TRUE(split->Forward(0, Inputs(batch_, scale)).ok());
  ASSERT_TRUE(split->BackwardInputAsync(0, {}, {}).ok());
  split->Discard(0);
  ASSERT_TRUE(split->Forward(0, Inputs(batch_, scale)).ok());
  EXPECT_TRUE(split->Backward(0, {}).ok());
}

TEST_F(ShardRuntimeTest, CountsHeldMicroBatches) {
  auto runtime = Make(0, config_.units());
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(runtime->Forward(k, Inputs(batch_, 0.1f)).ok());
  EXPECT_EQ(runtime->slots_held(), 3u);
  ASSERT_TRUE(runtime->Backward(1, {}).ok());
  EXPECT_EQ(runtime->slots_held(), 2u);
  EXPECT_EQ(runtime->peak_slots_held(), 3u);
  runtime->ResetPeakSlots();
  EXPECT_EQ(runtime->peak_slots_held(), 2u);
}

TEST_F(ShardRuntimeTest, BadInputsAreRefusedAndTheRuntimeKeepsWorking) {
  auto runtime = Make(0, config_.units());
  ShardRuntime::Inputs in = Inputs(batch_, 0.1f);
  in.t = config_.context + 1;
  EXPECT_EQ(runtime->Forward(0, in).code(), absl::StatusCode::kInvalidArgument);
  in = Inputs(batch_, 0.1f);
  in.ids = absl::Span<const int32_t>(batch_.ids).subspan(1);
  EXPECT_EQ(runtime->Forward(0, in).code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> bad_ids = batch_.ids;
  bad_ids[3] = 99;  // outside the vocabulary
  in = Inputs(batch_, 0.1f);
  in.ids = bad_ids;
  EXPECT_EQ(runtime->Forward(0, in).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime->slots_held(), 0u) << "a failed forward frees its slot";
  EXPECT_EQ(runtime->Backward(7, {}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(runtime->Forward(0, Inputs(batch_, 0.1f)).ok());
  EXPECT_EQ(runtime->Forward(0, Inputs(batch_, 0.1f)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(runtime->Backward(0, {}).ok());

  auto middle = Make(1, 2);
  ShardRuntime::Inputs targets_in_middle{1, 3, {}, {}, 1.0f, {}};
  std::vector<float> x(3 * config_.d_model);
  std::vector<int32_t> targets(3, 1);
  targets_in_middle.activations = x;
  targets_in_middle.targets = targets;
  EXPECT_EQ(middle->Forward(0, targets_in_middle).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardRuntime::Create(*backend_, config_, 0, config_.units() + 1, 5, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardline::worker::runtime
