#include "bench/spread_ranks.h"

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/bench_report.h"
#include "bench/loopback_server.h"
#include "bench/net_util.h"
#include "worker/backend/backend_factory.h"
#include "worker/collective/grpc_collective.h"
#include "worker/transport/stage_link_service.h"

namespace shardline::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

bool WriteAll(int fd, const void* data, size_t bytes) {
  return ::write(fd, data, bytes) == static_cast<ssize_t>(bytes);
}
bool ReadAll(int fd, void* data, size_t bytes) {
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::read(fd, static_cast<char*>(data) + got, bytes - got);
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

// Every rank's ports: [2r] its StageLink server, [2r + 1] its TCP listener.
using Ports = std::vector<int32_t>;

// Streams `total` bytes to the next rank while taking as many from the
// previous one, then acks what it took and waits for the next rank's ack.
void TcpRingPass(int to_next, int from_previous, size_t total) {
  std::thread receive([from_previous, total] {
    std::vector<char> buffer(1 << 20);
    for (size_t got = 0; got < total;) {
      const ssize_t r = ::recv(from_previous, buffer.data(), std::min(buffer.size(), total - got), 0);
      if (r <= 0) std::abort();
      got += static_cast<size_t>(r);
    }
    const char ack = 1;
    if (::send(from_previous, &ack, 1, 0) != 1) std::abort();
  });
  std::vector<char> data(1 << 20, 'x');
  for (size_t sent = 0; sent < total;) {
    const ssize_t s = ::send(to_next, data.data(), std::min(data.size(), total - sent), 0);
    if (s <= 0) std::abort();
    sent += static_cast<size_t>(s);
  }
  char ack = 0;
  if (::recv(to_next, &ack, 1, MSG_WAITALL) != 1) std::abort();
  receive.join();
}

// Rank `r`'s whole run, once its server and listener are up and it knows
// every rank's ports. Timings count on rank 0.
std::vector<SpreadResult> RunRank(int r, const SpreadConfig& config, worker::transport::StageLinkService& service,
                                  int tcp_listener, const Ports& ports) {
  const int d = static_cast<int>(config.ips.size());
  const size_t largest = *std::max_element(config.sizes.begin(), config.sizes.end());
  auto backend = worker::CreateBackend("cpu", {1});
  BENCH_CHECK_OK(backend.status());
  worker::collective::GrpcCollectiveOptions o;
  o.job_id = "bench";
  o.plan_epoch = 1;
  o.group = "stage-0";
  o.rank = r;
  for (int q = 0; q < d; ++q) o.peer_addresses.push_back(absl::StrCat(config.ips[q], ":", ports[2 * q]));
  o.service = &service;
  o.exchange.timeout = absl::Seconds(300);
  o.exchange.chunk_bytes = config.chunk_bytes;
  o.staging_slot_bytes = (largest + d - 1) / d;
  auto collective = worker::collective::GrpcCollective::Create(**backend, o);
  BENCH_CHECK_OK(collective.status());
  // The ring: to rank r + 1, from rank r − 1.
  const int next = (r + 1) % d;
  const int to_next = ConnectTcp(config.ips[next], ports[2 * next + 1]);
  const int from_previous = ::accept(tcp_listener, nullptr, nullptr);
  if (to_next < 0 || from_previous < 0) std::abort();
  float token = 0;
  auto barrier = [&] { BENCH_CHECK_OK((*collective)->AllReduceSumHost(absl::Span<float>(&token, 1))); };

  std::vector<SpreadResult> results;
  for (size_t bytes : config.sizes) {
    SpreadResult result;
    result.bytes = bytes;
    result.reps = config.reps(bytes);
    const size_t n = bytes / sizeof(float);
    auto buffer = (*backend)->Allocate(n * sizeof(float));
    BENCH_CHECK_OK(buffer.status());
    std::vector<double> trials, tcp;
    for (int t = -1; t < config.trials; ++t) {  // trial -1 warms up (connections, pools)
      barrier();
      const auto start = Clock::now();
      result.correct &= AllReduceReps(**backend, **collective, *buffer, n, r, d, result.reps);
      if (t >= 0) trials.push_back(Seconds(start));
    }
    const size_t per_rank = 2 * (static_cast<size_t>(d) - 1) * bytes / static_cast<size_t>(d);
    for (int t = -1; t < config.trials; ++t) {
      barrier();
      const auto start = Clock::now();
      TcpRingPass(to_next, from_previous, per_rank * static_cast<size_t>(result.reps));
      if (t >= 0) tcp.push_back(Seconds(start) / result.reps);
    }
    for (double s : trials) result.allreduce_total_s += s;
    std::sort(trials.begin(), trials.end());
    std::sort(tcp.begin(), tcp.end());
    result.allreduce_s = trials[trials.size() / 2] / result.reps;
    result.tcp_s = tcp[tcp.size() / 2];
    results.push_back(result);
  }
  barrier();
  // In order: a peer still waiting for this rank's part of the final
  // barrier gets it (destroying the collective alone would abort its streams).
  (*collective)->Leave();
  collective->reset();
  ::close(to_next);
  ::close(from_previous);
  return results;
}

// A forked rank: enters its namespace, starts its server and listener,
// sends their ports, takes everyone's, runs, and sends its checks.
int RankProcess(int r, const SpreadConfig& config, int from_parent, int to_parent) {
  int32_t own[2] = {-1, -1};
  if (!config.netns[r].empty() && !EnterNetns(config.netns[r])) {
    (void)WriteAll(to_parent, own, sizeof(own));
    return 1;
  }
  worker::transport::StageLinkService service;
  LoopbackServer server = StartLoopbackServer(service, config.ips[r]);
  int tcp_port = 0;
  const int listener = ListenTcp(config.ips[r], &tcp_port);
  own[0] = server.port;
  own[1] = listener < 0 ? -1 : tcp_port;
  Ports ports(2 * config.ips.size());
  if (!WriteAll(to_parent, own, sizeof(own)) || listener < 0 ||
      !ReadAll(from_parent, ports.data(), ports.size() * sizeof(int32_t))) {
    return 1;
  }
  const std::vector<SpreadResult> results = RunRank(r, config, service, listener, ports);
  std::vector<uint8_t> correct;
  for (const SpreadResult& result : results) correct.push_back(result.correct ? 1 : 0);
  server.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return WriteAll(to_parent, correct.data(), correct.size()) ? 0 : 1;
}

}  // namespace

bool AllReduceReps(worker::Backend& backend, worker::collective::Collective& collective,
                   worker::DeviceBuffer& buffer, size_t n, int rank, int ranks, int reps) {
  const std::vector<float> values(n, static_cast<float>(rank + 1));
  for (int i = 0; i < reps; ++i) {
    if (i == 0 || i + 1 == reps) {
      BENCH_CHECK_OK(backend.CopyToDevice(absl::Span<const float>(values), buffer.span<float>()));
    }
    BENCH_CHECK_OK(collective.AllReduceSum(buffer.span<float>()));
  }
  std::vector<float> out(n);
  BENCH_CHECK_OK(backend.CopyToHost(worker::DeviceSpan<const float>(buffer.span<float>()), absl::Span<float>(out)));
  const float want = static_cast<float>(ranks * (ranks + 1) / 2);
  return std::all_of(out.begin(), out.end(), [want](float x) { return x == want; });
}

absl::StatusOr<std::vector<SpreadResult>> RunSpreadRanks(const SpreadConfig& config) {
  const int d = static_cast<int>(config.ips.size());
  if (d < 2 || config.netns.size() != config.ips.size() || !config.netns[0].empty() || config.sizes.empty()) {
    return absl::InvalidArgumentError("spread ranks: two or more ranks, a namespace and an IP each, rank 0 here");
  }
  struct Child {
    pid_t pid = -1;
    int to = -1, from = -1;
  };
  std::vector<Child> children(static_cast<size_t>(d));
  for (int r = 1; r < d; ++r) {
    int down[2], up[2];
    if (::pipe(down) != 0 || ::pipe(up) != 0) return absl::InternalError("pipe failed");
    const pid_t pid = ::fork();
    if (pid < 0) return absl::InternalError("fork failed");
    if (pid == 0) {
      ::close(down[1]);
      ::close(up[0]);
      std::fflush(stdout);
      ::_exit(RankProcess(r, config, down[0], up[1]));
    }
    ::close(down[0]);
    ::close(up[1]);
    children[r] = {pid, down[1], up[0]};
  }
  // Rank 0 here; then everyone's ports to everyone.
  worker::transport::StageLinkService service;
  LoopbackServer server = StartLoopbackServer(service, config.ips[0]);
  int tcp_port = 0;
  const int listener = ListenTcp(config.ips[0], &tcp_port);
  Ports ports(2 * static_cast<size_t>(d), -1);
  ports[0] = server.port;
  ports[1] = listener < 0 ? -1 : tcp_port;
  bool started = listener >= 0;
  for (int r = 1; r < d; ++r) {
    started &= ReadAll(children[r].from, &ports[2 * r], 2 * sizeof(int32_t)) && ports[2 * r] > 0 &&
               ports[2 * r + 1] > 0;
  }
  absl::Status status;
  std::vector<SpreadResult> results;
  if (!started) {
    status = absl::UnavailableError(absl::StrCat("a rank did not start on its address (", config.ips[0], "…)"));
  } else {
    for (int r = 1; r < d; ++r) (void)WriteAll(children[r].to, ports.data(), ports.size() * sizeof(int32_t));
    results = RunRank(0, config, service, listener, ports);
    for (int r = 1; r < d; ++r) {
      std::vector<uint8_t> correct(results.size(), 0);
      if (!ReadAll(children[r].from, correct.data(), correct.size())) {
        status = absl::InternalError(absl::StrCat("rank ", r, " did not finish"));
      }
      for (size_t i = 0; i < results.size(); ++i) results[i].correct &= correct[i] == 1;
    }
  }
  for (int r = 1; r < d; ++r) {
    ::close(children[r].to);  // a child still waiting for the ports gives up
    ::close(children[r].from);
    int exit_status = 0;
    ::waitpid(children[r].pid, &exit_status, 0);
    if (status.ok() && !(WIFEXITED(exit_status) && WEXITSTATUS(exit_status) == 0)) {
      status = absl::InternalError(absl::StrCat("rank ", r, " failed"));
    }
  }
  if (listener >= 0) ::close(listener);
  server.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (!status.ok()) return status;
  return results;
}

}  // namespace shardline::bench
