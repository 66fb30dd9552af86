// bench_collective: all-reduce throughput of the data-parallel collective.
// d ranks (threads of this process, each with a CPU backend and a
// StageLinkService on a loopback server of its own, as on d workers) run
// GrpcCollective::AllReduceSum on buffers of each size; next to it, in the
// same run, raw TCP on loopback moving what the all-reduce moves: d streams
// at once, each with one rank's bytes (the bus's ceiling on this machine).
//
// Figures as nccl-tests defines them: algorithm bandwidth = bytes / time of
// one all-reduce; bus bandwidth = algbw · 2(d − 1)/d, what each rank's links
// carried, comparable across d and with the wire. Each figure is the median
// of --trials, each trial --reps calls; every result is checked (rank r
// holds r + 1 everywhere, so every element must sum to d(d + 1)/2). The
// rows also carry the raw timings. On loopback each size runs a second time
// on ranks whose every all-reduce takes two rounds (one_round_bytes 0):
// one_round says whether the default took one round at that size,
// one_round_speedup = two_rounds_s / allreduce_s (about 1 where it did not:
// the same path, a control for the noise).
//
// With --rank_ips (and --rank_netns) the ranks are processes in network
// namespaces of their own (SpreadRanks), so the bytes cross veth links, and
// the raw-TCP ring runs between the same namespaces;
// bench/bench_collective_netns.sh builds such a testbed (a bridge, a veth
// per rank capped by tc tbf) and runs it.
//
//   bench_collective [--ranks=2,4] [--sizes=16384,...] [--reps=N] [--trials=N] [--json=FILE]
//                    [--rank_ips=IP0,IP1,... --rank_netns=NS1,...]
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/barrier.h"
#include "bench/bench_report.h"
#include "bench/loopback_server.h"
#include "bench/spread_ranks.h"
#include "common/cost_model.h"
#include "common/init.h"
#include "worker/backend/backend_factory.h"
#include "worker/collective/grpc_collective.h"
#include "worker/transport/stage_link_service.h"

ABSL_FLAG(std::string, ranks, "2,4", "group sizes to measure");
ABSL_FLAG(std::string, sizes, "16384,65536,262144,1048576,4194304,16777216,67108864", "buffer bytes");
ABSL_FLAG(int, reps, 0, "all-reduces per trial (0: enough for ~128 MiB per rank, at least 4)");
ABSL_FLAG(int, trials, 3, "trials per figure (median)");
ABSL_FLAG(int, chunk_kib, 1024, "payload KiB per frame");
ABSL_FLAG(std::string, json, "", "write the rows as JSON to this file");
ABSL_FLAG(std::string, rank_ips, "",
          "spread the ranks over network namespaces: rank r on the r-th of these IPs (one group of that many "
          "ranks; --ranks is ignored)");
ABSL_FLAG(std::string, rank_netns, "",
          "with --rank_ips: the namespaces (/var/run/netns/NAME) of ranks 1, 2, …; rank 0 stays in this one");

namespace shardline::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

int RepsFor(size_t bytes) {
  if (absl::GetFlag(FLAGS_reps) > 0) return absl::GetFlag(FLAGS_reps);
  return static_cast<int>(std::max<size_t>(4, (size_t{128} << 20) / bytes));
}

// One rank: its server, service, backend, buffer and collective.
struct Rank {
  std::unique_ptr<worker::transport::StageLinkService> service = std::make_unique<worker::transport::StageLinkService>();
  std::unique_ptr<grpc::Server> server;
  std::string address;
  std::unique_ptr<worker::Backend> backend;
  std::unique_ptr<worker::collective::GrpcCollective> collective;
};

struct Timing {
  double median_s = 0;  // of one all-reduce: the median trial's time / reps
  double total_s = 0;   // all trials
  bool correct = true;
};

// Times `reps` all-reduces of `bytes` on every rank, `trials` times.
Timing MeasureAllReduce(std::vector<Rank>& ranks, size_t bytes, int reps, int trials) {
  const int d = static_cast<int>(ranks.size());
  const size_t n = bytes / sizeof(float);
  std::vector<double> trial_seconds;
  std::atomic<bool> correct{true};
  std::vector<worker::DeviceBuffer> buffers;
  for (Rank& r : ranks) {
    auto buffer = r.backend->Allocate(n * sizeof(float));
    BENCH_CHECK_OK(buffer.status());
    buffers.push_back(std::move(*buffer));
  }
  for (int t = -1; t < trials; ++t) {  // trial -1 warms up (connections, pools)
    absl::Barrier* start = new absl::Barrier(d + 1);
    std::vector<std::thread> threads;
    for (int r = 0; r < d; ++r) {
      threads.emplace_back([&, r, start] {
        if (start->Block()) delete start;
        if (!AllReduceReps(*ranks[r].backend, *ranks[r].collective, buffers[r], n, r, d, reps)) correct = false;
      });
    }
    const auto begin = Clock::now();
    if (start->Block()) delete start;
    for (auto& thread : threads) thread.join();
    if (t >= 0) trial_seconds.push_back(Seconds(begin));
  }
  Timing timing;
  for (double s : trial_seconds) timing.total_s += s;
  std::sort(trial_seconds.begin(), trial_seconds.end());
  timing.median_s = trial_seconds[trial_seconds.size() / 2] / reps;
  timing.correct = correct;
  return timing;
}

// Raw TCP on loopback, the bus's ceiling: d streams at once (rank r to
// rank r + 1, a ring), each carrying what one rank's links carry in an
// all-reduce of `bytes` (2(d − 1)/d of it), `reps` times, acked once at the
// end; seconds per all-reduce's worth, median of `trials`.
double MeasureTcp(int d, size_t bytes, int reps, int trials) {
  struct Pair {
    int sender = -1, receiver = -1;
  };
  std::vector<Pair> pairs(static_cast<size_t>(d));
  for (Pair& pair : pairs) {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listener, 1) != 0 || ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      std::perror("tcp");
      std::abort();
    }
    pair.sender = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(pair.sender, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) std::abort();
    pair.receiver = ::accept(listener, nullptr, nullptr);
    const int one = 1;
    ::setsockopt(pair.receiver, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::close(listener);
  }
  const size_t per_rank = 2 * (static_cast<size_t>(d) - 1) * bytes / static_cast<size_t>(d);
  const size_t total = per_rank * static_cast<size_t>(reps);
  std::vector<double> seconds;
  for (int t = -1; t < trials; ++t) {
    std::vector<std::thread> threads;
    const auto begin = Clock::now();
    for (Pair& pair : pairs) {
      threads.emplace_back([&pair, total] {
        std::vector<char> buffer(1 << 20);
        for (size_t got = 0; got < total;) {
          const ssize_t r = ::recv(pair.receiver, buffer.data(), std::min(buffer.size(), total - got), 0);
          if (r <= 0) std::abort();
          got += static_cast<size_t>(r);
        }
        const char ack = 1;
        if (::send(pair.receiver, &ack, 1, 0) != 1) std::abort();
      });
      threads.emplace_back([&pair, total] {
        std::vector<char> data(1 << 20, 'x');
        for (size_t sent = 0; sent < total;) {
          const ssize_t s = ::send(pair.sender, data.data(), std::min(data.size(), total - sent), 0);
          if (s <= 0) std::abort();
          sent += static_cast<size_t>(s);
        }
        char ack = 0;
        if (::recv(pair.sender, &ack, 1, MSG_WAITALL) != 1) std::abort();
      });
    }
    for (auto& thread : threads) thread.join();
    if (t >= 0) seconds.push_back(Seconds(begin) / reps);
  }
  for (Pair& pair : pairs) {
    ::close(pair.sender);
    ::close(pair.receiver);
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

std::vector<Rank> StartRanks(int d, size_t largest_bytes, size_t one_round_bytes) {
  std::vector<Rank> ranks(static_cast<size_t>(d));
  std::vector<std::string> addresses;
  for (Rank& r : ranks) {
    LoopbackServer server = StartLoopbackServer(*r.service);
    r.server = std::move(server.server);
    r.address = server.address;
    addresses.push_back(r.address);
    auto backend = worker::CreateBackend("cpu", {1});
    BENCH_CHECK_OK(backend.status());
    r.backend = std::move(*backend);
  }
  for (int q = 0; q < d; ++q) {
    worker::collective::GrpcCollectiveOptions o;
    o.job_id = "bench";
    o.plan_epoch = 1;
    o.group = "stage-0";
    o.rank = q;
    o.peer_addresses = addresses;
    o.service = ranks[q].service.get();
    o.exchange.timeout = absl::Seconds(300);
    o.exchange.chunk_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_kib)) << 10;
    o.staging_slot_bytes = (largest_bytes + d - 1) / d;  // a chunk of the largest buffer
    o.one_round_bytes = one_round_bytes;
    auto c = worker::collective::GrpcCollective::Create(*ranks[q].backend, o);
    BENCH_CHECK_OK(c.status());
    ranks[q].collective = std::move(*c);
  }
  return ranks;
}

int Main() {
  std::vector<int> group_sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',', absl::SkipEmpty())) {
    int d = 0;
    if (!absl::SimpleAtoi(s, &d) || d < 2 || d > 16) {
      std::fprintf(stderr, "Error: bad --ranks entry '%s' (2..16)\n", std::string(s).c_str());
      return 3;
    }
    group_sizes.push_back(d);
  }
  std::vector<size_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    size_t n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 64 || n > (size_t{1} << 30)) {
      std::fprintf(stderr, "Error: bad --sizes entry '%s' (64 B to 1 GiB)\n", std::string(s).c_str());
      return 3;
    }
    sizes.push_back(n / 4 * 4);
  }
  const int trials = absl::GetFlag(FLAGS_trials);
  if (group_sizes.empty() || sizes.empty() || trials < 1 || absl::GetFlag(FLAGS_reps) < 0 ||
      absl::GetFlag(FLAGS_chunk_kib) < 1 || absl::GetFlag(FLAGS_chunk_kib) > 16384) {
    std::fprintf(stderr, "Error: --ranks and --sizes need entries, --trials ≥ 1, --reps ≥ 0, --chunk_kib in [1, 16384]\n");
    return 3;
  }
  BenchReport report;
  auto add_row = [&report, trials](int d, size_t bytes, int reps, double allreduce_s, double total_s, double tcp_s,
                                   bool correct, bool spread, BenchReport::Row extra) {
    const double algbw = static_cast<double>(bytes) / allreduce_s / 1e9;
    const double busbw = algbw * 2.0 * (d - 1) / d;
    const double tcp = static_cast<double>(bytes) / tcp_s / 1e9 * 2.0 * (d - 1) / d;  // as a bus bandwidth
    BenchReport::Row row = {{"ranks", static_cast<double>(d)},
                {"bytes", static_cast<double>(bytes)},
                {"netns", spread ? 1.0 : 0.0},
                {"reps", static_cast<double>(reps)},
                {"trials", static_cast<double>(trials)},
                {"algbw_gbps", algbw},
                {"busbw_gbps", busbw},
                {"tcp_busbw_gbps", tcp},
                {"busbw_vs_tcp", busbw / tcp},
                {"correct", correct ? 1.0 : 0.0},
                {"allreduce_s", allreduce_s},
                {"allreduce_total_s", total_s},
                {"tcp_s", tcp_s}};
    row.insert(row.end(), extra.begin(), extra.end());
    report.Add(std::move(row));
  };
  if (!absl::GetFlag(FLAGS_rank_ips).empty()) {
    SpreadConfig config;
    config.ips = absl::StrSplit(absl::GetFlag(FLAGS_rank_ips), ',', absl::SkipEmpty());
    config.netns = {""};
    for (absl::string_view ns : absl::StrSplit(absl::GetFlag(FLAGS_rank_netns), ',', absl::SkipEmpty())) {
      config.netns.emplace_back(ns);
    }
    if (config.ips.size() < 2 || config.netns.size() != config.ips.size()) {
      std::fprintf(stderr, "Error: --rank_ips needs two or more IPs and --rank_netns one namespace for each rank after rank 0\n");
      return 3;
    }
    config.sizes = sizes;
    config.trials = trials;
    config.chunk_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_kib)) << 10;
    config.reps = RepsFor;
    absl::StatusOr<std::vector<SpreadResult>> results = RunSpreadRanks(config);
    if (!results.ok()) {
      std::fprintf(stderr, "Error: %s\n", results.status().ToString().c_str());
      return 2;
    }
    for (const SpreadResult& r : *results) {
      add_row(static_cast<int>(config.ips.size()), r.bytes, r.reps, r.allreduce_s, r.allreduce_total_s, r.tcp_s,
              r.correct, true, {});
    }
    BENCH_CHECK_OK(report.Publish(absl::GetFlag(FLAGS_json)));
    return 0;
  }
  const size_t one_round_bytes = worker::collective::GrpcCollectiveOptions().one_round_bytes;
  for (int d : group_sizes) {
    const size_t largest = *std::max_element(sizes.begin(), sizes.end());
    std::vector<Rank> ranks = StartRanks(d, largest, one_round_bytes);
    std::vector<Rank> two_round_ranks = StartRanks(d, largest, 0);  // every all-reduce in two rounds
    for (size_t bytes : sizes) {
      const int reps = RepsFor(bytes);
      const Timing t = MeasureAllReduce(ranks, bytes, reps, trials);
      // The same calls in two rounds (the same path where one round is not
      // taken: a control for the noise).
      const Timing two = MeasureAllReduce(two_round_ranks, bytes, reps, trials);
      const double tcp_s = MeasureTcp(d, bytes, reps, trials);
      const bool one_round = common::AllReduceInOneRound(bytes, d, one_round_bytes);
      add_row(d, bytes, reps, t.median_s, t.total_s, tcp_s, t.correct && two.correct, false,
              {{"one_round", one_round ? 1.0 : 0.0},
               {"two_rounds_s", two.median_s},
               {"two_rounds_total_s", two.total_s},
               {"one_round_speedup", two.median_s / t.median_s}});
    }
    for (std::vector<Rank>* set : {&ranks, &two_round_ranks}) {
      for (Rank& r : *set) r.collective.reset();
      for (Rank& r : *set) r.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    }
  }
  BENCH_CHECK_OK(report.Publish(absl::GetFlag(FLAGS_json)));
  return 0;
}

}  // namespace
}  // namespace shardline::bench

int main(int argc, char** argv) {
  shardline::common::InitProcess(argc, argv, "all-reduce throughput of the gRPC collective against raw TCP");
  return shardline::bench::Main();
}
