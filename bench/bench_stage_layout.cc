// bench_stage_layout: how a tensor-parallel stage hands its activations to
// the next stage's tensor group (bench/stage_layout_group.h: same_rank,
// scatter_gather, broadcast), measured with real StageLinks and
// GrpcCollectives. This process is the sending stage's t ranks (threads,
// each with its own StageLink service and gRPC server, as workers); it
// forks the receiving stage's t ranks, into another network namespace with
// --receiver_netns (bench/capped_veth.sh: the two stages on
// two "hosts" joined by a capped veth, each group's own traffic on its
// host's loopback).
//
// Per group size, tensor size and layout: each round streams `reps`
// tensors (every receiving rank acks each once it holds the whole tensor),
// timed from the first send to the last ack; the figure is the median
// round / reps, after one warm-up round. Rows carry the bytes the stage
// links and the receiving group's collective received per tensor
// (measured), next to the count (same_rank: t·S between the stages;
// scatter_gather: S between them and (t − 1)·S within the group;
// broadcast: S and (t − 1)·S), and the time next to same_rank's (same run).
//
//   bench_stage_layout [--ranks=2,4] [--sizes=524288,4194304,16777216] [--reps=N] [--trials=N]
//                      [--json=FILE] [--receiver_netns=NAME --receiver_ip=A --sender_ip=B]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/barrier.h"
#include "bench/bench_report.h"
#include "bench/loopback_server.h"
#include "bench/net_util.h"
#include "bench/stage_layout_group.h"
#include "common/init.h"
#include "worker/collective/collective.h"
#include "worker/transport/grpc_stage_link.h"

ABSL_FLAG(std::string, ranks, "2,4", "tensor group sizes t to measure");
ABSL_FLAG(std::string, sizes, "524288,4194304,16777216",
          "activation bytes per micro-batch (524288: bench_pipeline's model, 2 × 128 tokens × 512)");
ABSL_FLAG(int, reps, 0, "tensors per round (0: enough for ~64 MiB, at least 4)");
ABSL_FLAG(int, trials, 3, "timed rounds per figure (median), after one warm-up round");
ABSL_FLAG(std::string, json, "", "write the rows as JSON to this file");
ABSL_FLAG(std::string, receiver_netns, "",
          "run the receiving group in this network namespace (/var/run/netns/NAME; empty: this one)");
ABSL_FLAG(std::string, receiver_ip, "127.0.0.1", "the receiving group's IPv4 address, in its namespace");
ABSL_FLAG(std::string, sender_ip, "127.0.0.1", "this process's IPv4 address, as the receiving group reaches it");

namespace shardline::bench {
namespace {

using Clock = std::chrono::steady_clock;
using worker::transport::StageMessage;

// One rank of the sending stage.
struct Sender {
  std::unique_ptr<worker::transport::StageLinkService> service =
      std::make_unique<worker::transport::StageLinkService>();
  LoopbackServer server;
  std::unique_ptr<worker::transport::GrpcStageLink> link;
};

// The bytes a tensor of `bytes` puts between the stages and within the
// receiving group, by layout.
std::pair<double, double> Counted(const LayoutCase& c) {
  const double s = static_cast<double>(c.bytes), t = c.ranks;
  if (c.layout == StageLayout::kSameRank) return {t * s, 0.0};
  return {s, (t - 1) * s};
}

// One round on sending rank k: its tensors (or parts) sent back to back,
// then its acks taken.
void SendRound(Sender& me, int k, const LayoutCase& c, const std::vector<float>& tensor, int round) {
  const size_t n = c.bytes / sizeof(float);
  worker::collective::Chunk part{0, n};
  if (c.layout == StageLayout::kScatterGather) part = worker::collective::ChunkOf(n, c.ranks, k);
  const bool sends = c.layout != StageLayout::kBroadcast || k == 0;
  std::thread acks([&] {
    for (int rep = 0; rep < c.reps; ++rep) BENCH_CHECK_OK(me.link->ReceiveFromNext().status());
  });
  for (int rep = 0; sends && rep < c.reps; ++rep) {
    StageMessage m;
    m.kind = StageMessage::Kind::kActivation;
    m.step = round;
    m.micro_batch = rep;
    m.values = me.link->OutgoingBuffer(m.kind, part.size());
    // Only the last tensor of a round is checked: the others carry it too.
    std::memcpy(m.values.data(), tensor.data() + part.begin, part.size() * sizeof(float));
    BENCH_CHECK_OK(me.link->SendToNext(std::move(m)));
  }
  acks.join();
}

std::vector<int> ParseList(const std::string& flag, const char* name, int lo, int hi, bool* ok) {
  std::vector<int> out;
  for (absl::string_view s : absl::StrSplit(flag, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(s, &v) || v < lo || v > hi) {
      std::fprintf(stderr, "Error: bad --%s entry '%s' (%d to %d)\n", name, std::string(s).c_str(), lo, hi);
      *ok = false;
    }
    out.push_back(v);
  }
  *ok = *ok && !out.empty();
  return out;
}

int Main() {
  bool ok = true;
  const std::vector<int> group_sizes = ParseList(absl::GetFlag(FLAGS_ranks), "ranks", 2, 16, &ok);
  const std::vector<int> sizes = ParseList(absl::GetFlag(FLAGS_sizes), "sizes", 1024, 1 << 28, &ok);
  if (!ok || absl::GetFlag(FLAGS_trials) < 1 || absl::GetFlag(FLAGS_reps) < 0) {
    std::fprintf(stderr, "Error: --ranks and --sizes need entries, --trials ≥ 1, --reps ≥ 0\n");
    return 3;
  }
  StageLayoutConfig config;
  config.trials = absl::GetFlag(FLAGS_trials);
  config.exchange.timeout = absl::Seconds(120);
  config.netns = absl::GetFlag(FLAGS_receiver_netns);
  config.ip = absl::GetFlag(FLAGS_receiver_ip);
  config.sender_ip = absl::GetFlag(FLAGS_sender_ip);
  for (int t : group_sizes) {
    for (int bytes : sizes) {
      const size_t b = static_cast<size_t>(bytes) / 4 * 4;
      const int reps = absl::GetFlag(FLAGS_reps) > 0 ? absl::GetFlag(FLAGS_reps)
                                                     : static_cast<int>(std::max<size_t>(4, (size_t{64} << 20) / b));
      for (StageLayout layout : {StageLayout::kSameRank, StageLayout::kScatterGather, StageLayout::kBroadcast}) {
        config.cases.push_back({t, b, layout, reps});
      }
      config.largest_ranks = std::max(config.largest_ranks, t);
      config.largest_bytes = std::max(config.largest_bytes, b);
    }
  }
  ::signal(SIGPIPE, SIG_IGN);
  // Fork before this process touches gRPC (gRPC does not survive a fork).
  int to_child[2], to_parent[2];
  if (::pipe(to_child) != 0 || ::pipe(to_parent) != 0) return 2;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(RunReceivingGroup(config, to_child[0], to_parent[1]));
  ::close(to_child[0]);
  ::close(to_parent[1]);

  std::vector<Sender> senders(static_cast<size_t>(config.largest_ranks));
  std::vector<int> ports;
  for (Sender& me : senders) {
    me.server = StartLoopbackServer(*me.service, config.sender_ip);
    ports.push_back(me.server.port);
    worker::transport::GrpcStageLinkOptions link;
    link.job_id = "bench";
    link.plan_epoch = 1;
    link.stage = 0;
    link.stages = 2;
    link.service = me.service.get();
    link.exchange = config.exchange;
    link.staging_slot_bytes = config.largest_bytes;
    auto created = worker::transport::GrpcStageLink::Create(link);
    BENCH_CHECK_OK(created.status());
    me.link = std::move(*created);
  }
  const ssize_t port_bytes = static_cast<ssize_t>(ports.size() * sizeof(int));
  if (::write(to_child[1], ports.data(), static_cast<size_t>(port_bytes)) != port_bytes) return 2;

  BenchReport report;
  std::map<std::pair<int, size_t>, double> same_rank_s;  // by (t, bytes)
  for (const LayoutCase& c : config.cases) {
    std::vector<double> rounds;
    for (int round = 0; round <= config.trials; ++round) {
      std::vector<float> tensor(c.bytes / sizeof(float));
      for (size_t i = 0; i < tensor.size(); ++i) tensor[i] = LayoutValue(i, round, c.reps - 1);
      auto* start = new absl::Barrier(c.ranks + 1);
      std::vector<std::thread> threads;
      for (int k = 0; k < c.ranks; ++k) {
        threads.emplace_back([&, k, start] {
          if (start->Block()) delete start;
          SendRound(senders[static_cast<size_t>(k)], k, c, tensor, round);
        });
      }
      const auto begin = Clock::now();
      if (start->Block()) delete start;
      for (auto& thread : threads) thread.join();
      if (round > 0) rounds.push_back(std::chrono::duration<double>(Clock::now() - begin).count());
    }
    LayoutCounts counts;
    if (::read(to_parent[0], &counts, sizeof(counts)) != sizeof(counts)) {
      std::fprintf(stderr, "Error: the receiving group stopped (see above)\n");
      return 2;
    }
    if (!counts.correct) {
      std::fprintf(stderr, "Error: the receiving group got wrong values (see above)\n");
      return 2;
    }
    double total = 0;
    for (double s : rounds) total += s;
    std::sort(rounds.begin(), rounds.end());
    const double seconds = rounds[rounds.size() / 2] / c.reps;
    if (c.layout == StageLayout::kSameRank) same_rank_s[{c.ranks, c.bytes}] = seconds;
    const double tensors = static_cast<double>(c.reps) * (config.trials + 1);
    const auto [between, within] = Counted(c);
    report.Add({{"ranks", static_cast<double>(c.ranks)},
                {"bytes", static_cast<double>(c.bytes)},
                {"layout", std::string(StageLayoutName(c.layout))},
                {"ms_per_tensor", seconds * 1e3},
                {"gbps", static_cast<double>(c.bytes) / seconds / 1e9},
                {"vs_same_rank", same_rank_s[{c.ranks, c.bytes}] / seconds},
                {"between_stages_bytes", static_cast<double>(counts.link_bytes) / tensors},
                {"between_stages_counted", between},
                {"within_group_bytes", static_cast<double>(counts.collective_bytes) / tensors},
                {"within_group_counted", within},
                {"reps", static_cast<double>(c.reps)},
                {"trials", static_cast<double>(config.trials)},
                {"median_round_s", rounds[rounds.size() / 2]},
                {"total_s", total}});
  }
  for (Sender& me : senders) me.link->Close("done");
  ReapChild(child);
  for (Sender& me : senders) {
    me.link.reset();
    me.server.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  BENCH_CHECK_OK(report.Publish(absl::GetFlag(FLAGS_json)));
  return 0;
}

}  // namespace
}  // namespace shardline::bench

int main(int argc, char** argv) {
  shardline::common::InitProcess(argc, argv, "how a tensor-parallel stage hands activations to the next");
  return shardline::bench::Main();
}
