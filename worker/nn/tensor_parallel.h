// TensorParallel is the tensor-parallel group a layer's matrices are split
// over (Megatron-LM's scheme): rank `rank` of `size`, and the collective
// whose AllReduceSum is Megatron's g operator (after a row-parallel layer in
// the forward pass) and f operator (before a column-parallel layer in the
// backward pass): every sum in rank order, so the same grid gives the same
// bits. size 1 is the unsplit model and makes no collective call.
//
// Column-parallel (output features split; in torch's [out × in] layout, the
// weight's rows): attn.qkv by heads (each rank n_heads/t of them: its q, k
// and v rows), mlp.fc by blocks of 4·C/t. Row-parallel (input features
// split: the weight's columns): attn.proj and mlp.proj, their bias added
// once, after the sum. LayerNorms, row-parallel biases and the position
// embedding are replicated: every rank holds and updates the same values
// from the same (all-reduced) gradients. The token embedding and the LM
// head are vocabulary-parallel when `split_vocab` (each rank vocab/t rows
// of each: EmbeddingLayer, HeadLayer), replicated otherwise.
#ifndef SHARDLINE_WORKER_NN_TENSOR_PARALLEL_H_
#define SHARDLINE_WORKER_NN_TENSOR_PARALLEL_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/backend/device_span.h"
#include "worker/collective/collective.h"

namespace shardline::worker::nn {

// Ranges [begin, end) along one dimension.
using Ranges = std::vector<std::pair<int64_t, int64_t>>;

struct TensorParallel {
  int rank = 0;
  int size = 1;
  collective::Collective* group = nullptr;  // required when size > 1; size() == size, rank() == rank
  bool split_vocab = false;                 // vocabulary-parallel embedding and head (common::VocabParallel)

  bool split() const { return size > 1; }
  bool vocab_split() const { return split() && split_vocab; }
  // The vocabulary's rows this rank holds, [first, first + rows): all of
  // them unless vocab_split().
  int64_t VocabFirst(int64_t vocab) const { return vocab_split() ? rank * (vocab / size) : 0; }
  int64_t VocabRows(int64_t vocab) const { return vocab_split() ? vocab / size : vocab; }
  // The sum over the group (nothing to do unsplit).
  absl::Status AllReduce(DeviceSpan<float> data) const {
    return split() ? group->AllReduceSum(data) : absl::OkStatus();
  }
  // OK when `size` divides what a model of `heads` heads and width `d_model`
  // splits (the heads, and the MLP's 4·d_model), and the group fits.
  absl::Status Check(int64_t heads, int64_t d_model) const {
    if (size < 1 || rank < 0 || rank >= size) {
      return absl::InvalidArgumentError(absl::StrCat("tensor rank ", rank, " of ", size));
    }
    if (heads % size != 0 || (4 * d_model) % size != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor_parallel ", size, " must divide n_heads (", heads,
                                                     ") and 4·d_model (", 4 * d_model, ")"));
    }
    if (split() && (group == nullptr || group->size() != size || group->rank() != rank)) {
      return absl::InvalidArgumentError("a split layer needs its tensor-parallel group");
    }
    return absl::OkStatus();
  }
  // The same for a layer of the vocabulary (`vocab` rows): split, t divides it.
  absl::Status CheckVocab(int64_t vocab) const {
    if (size < 1 || rank < 0 || rank >= size) {
      return absl::InvalidArgumentError(absl::StrCat("tensor rank ", rank, " of ", size));
    }
    if (!vocab_split()) return absl::OkStatus();
    if (vocab % size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("a vocabulary-parallel layer needs tensor_parallel ", size, " to divide the vocabulary (", vocab, ")"));
    }
    if (group == nullptr || group->size() != size || group->rank() != rank) {
      return absl::InvalidArgumentError("a split layer needs its tensor-parallel group");
    }
    return absl::OkStatus();
  }
};

}  // namespace shardline::worker::nn

#endif  // SHARDLINE_WORKER_NN_TENSOR_PARALLEL_H_
