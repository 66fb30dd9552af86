// bench_stage_layout's two sides. A tensor-parallel stage boundary: the t
// ranks of stage s (the sending group, in bench_stage_layout's process)
// hand a micro-batch's activation, the same tensor on every rank, to the t
// ranks of stage s + 1 (the receiving group, a process it forks, optionally
// into another network namespace), in one of three layouts:
//   same_rank:      rank k sends the whole tensor to rank k (what the
//                   pipeline does);
//   scatter_gather: rank k sends its 1/t of the tensor to rank k, and the
//                   receiving group all-gathers (Megatron-LM's
//                   scatter/gather optimisation): the wire between the
//                   stages carries the tensor once;
//   broadcast:      rank 0 sends the whole tensor to rank 0, which
//                   broadcasts it to its group.
// Each receiving rank acks every tensor to the sending rank of its own
// index once it holds the whole tensor, and checks the last tensor of each
// trial value by value.
#ifndef SHARDLINE_BENCH_STAGE_LAYOUT_GROUP_H_
#define SHARDLINE_BENCH_STAGE_LAYOUT_GROUP_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "worker/transport/exchange_stream.h"

namespace shardline::bench {

enum class StageLayout { kSameRank, kScatterGather, kBroadcast };
const char* StageLayoutName(StageLayout layout);

// One figure: a group size, a tensor size and a layout, measured in
// `trials` + 1 rounds (the first warms up) of `reps` tensors each.
struct LayoutCase {
  int ranks = 2;
  size_t bytes = 0;
  StageLayout layout = StageLayout::kSameRank;
  int reps = 4;
};

struct StageLayoutConfig {
  std::vector<LayoutCase> cases;  // both sides run them in this order
  int trials = 3;
  int largest_ranks = 2;   // links exist for this many ranks
  size_t largest_bytes = 0;
  worker::transport::ExchangeOptions exchange;
  std::string netns;       // the receiving group's namespace (/var/run/netns/NAME); empty: this one
  std::string ip;          // the receiving group's IPv4 address
  std::string sender_ip;   // the sending group's, as the receiving group reaches it
};

// Tensor values: element i of the tensor sent in round `round`, rep `rep`.
inline float LayoutValue(size_t i, int round, int rep) {
  return static_cast<float>(i % 4099) + 0.25f * static_cast<float>((round * 7 + rep) % 8);
}

// What the receiving group reports per case through the pipe: bytes its
// stage links and its collective received in the whole case (every
// round), and whether every check passed.
struct LayoutCounts {
  uint64_t link_bytes = 0;
  uint64_t collective_bytes = 0;
  int correct = 1;
};

// The receiving group's process: reads the sending ranks' StageLink ports
// (largest_ranks ints) from `ports_pipe`, connects, runs every case and
// writes a LayoutCounts per case to `counts_pipe`. Its exit code: 0, or 1
// when something could not start or failed.
int RunReceivingGroup(const StageLayoutConfig& config, int ports_pipe, int counts_pipe);

}  // namespace shardline::bench

#endif  // SHARDLINE_BENCH_STAGE_LAYOUT_GROUP_H_
