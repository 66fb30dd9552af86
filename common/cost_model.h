// The model cost model: FLOPs, parameters and memory of each pipeline unit
// of the GPT model (embedding, blocks, head), as pure functions of the model
// spec and the sequence length. The planner cuts the unit list into stages
// with these numbers; benchmarks compare them with measured time.
#ifndef SHARDLINE_COMMON_COST_MODEL_H_
#define SHARDLINE_COMMON_COST_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shardline/v1/job.pb.h"

namespace shardline::common {

struct UnitCost {
  double flops_per_token = 0;         // forward + backward (≈ 3× forward)
  int64_t parameters = 0;             // f32 parameters
  double saved_bytes_per_token = 0;   // activations kept from forward to backward
  double output_bytes_per_token = 0;  // what the unit sends on (f32 activations)
  // One pass's temporaries, per token of the micro-batch in the pass: held
  // once per stage whatever is in flight, and a stage's blocks share one
  // set (BlockLayer::Scratch), so a stage counts a block's once.
  double scratch_bytes_per_token = 0;
};

// One entry per unit, in order; `t` is the sequence length. A block's saved
// bytes count its attention weights (heads · t floats a token); its scratch
// does not count the composed attention's backward scratch (the weights'
// size again, AttentionSavedBytesPerToken unrecomputed), which only
// backends without an attention kernel need.
std::vector<UnitCost> ModelUnitCosts(const shardline::v1::ModelSpec& model, int64_t t);

// Sequences longer than this many keys make the CPU backend's attention keep
// each query's log-sum-exp instead of its weights, and recompute them in the
// backward pass (worker/backend/cpu/cpu_attention.cc).
inline constexpr int64_t kCpuAttentionKeyTile = 256;

// Whether a worker on `device` ("cpu", "cuda:0") keeps one float per head and
// token for a block's attention rather than its heads · t weights.
bool RecomputesAttentionWeights(const std::string& device, int64_t t);

// Whether a worker on `device` runs attention as one kernel (the CPU
// backend); others compose it from GEMMs and keep a backward scratch of the
// weights' size (worker/backend/attention.h AttentionScratchFloats).
bool HasAttentionKernel(const std::string& device);

// The bytes a block keeps per token for its attention's backward pass: the
// weights, or where recomputed the log-sum-exp.
double AttentionSavedBytesPerToken(const shardline::v1::ModelSpec& model, int64_t t, bool recomputed);

// The f32 parameters of units [begin, end) (a stage's, in the global
// layout), clamped to the model's units.
int64_t UnitRangeParameters(const shardline::v1::ModelSpec& model, int begin, int end);

// The bytes one rank of a stage holding units [begin, end) receives per
// training step in its tensor group's collectives (t =
// parallel.tensor_parallel ranks; 0 for t = 1), sequences at full context
// (shorter ones move less). Per micro-batch of N tokens: 4 all-reduces of
// N·C floats per block; vocabulary-parallel (VocabParallel), one for the
// embedding's rows and one for the head's input gradient, and the loss
// parts' all-gather (3 floats per token from each other rank). Per step,
// the gradient norm's all-gather (a double from each other rank). Each
// all-reduce brings a rank AllReduceBytesReceived.
double TensorGroupBytesPerRank(const shardline::v1::JobSpec& spec, int begin, int end);

// How GrpcCollective all-reduces a buffer of `bytes` (f32) among `ranks`: in
// two rounds (a reduce-scatter, then an all-gather: each rank sends and
// receives 2(d − 1)/d of the buffer) or in one (each rank sends its whole
// buffer to every other rank and adds all d itself: (d − 1) buffers, the
// same for a pair, in half the round trips). One round when the buffer is
// at most `one_round_bytes` and one round moves at most
// kOneRoundExtraBytes more than two.
inline constexpr size_t kOneRoundAllReduceBytes = size_t{1} << 20;  // the default one_round_bytes
inline constexpr size_t kOneRoundExtraBytes = size_t{64} << 10;     // about a round trip's worth on a LAN
bool AllReduceInOneRound(size_t bytes, int ranks, size_t one_round_bytes = kOneRoundAllReduceBytes);
// The bytes one rank receives in such an all-reduce (the default one_round_bytes).
double AllReduceBytesReceived(size_t bytes, int ranks);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_COST_MODEL_H_
