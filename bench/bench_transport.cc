// bench_transport: how fast tensors cross a stage link, against the wire.
// Two processes on loopback (this one forks a receiver). For each tensor
// size it sends `--reps` tensors and times until the receiver has acked the
// last one, three ways in the same run:
//   stagelink: our StageLink path (GrpcStageLink ↔ StageLinkService: frames
//              aliasing the tensor, one write in flight under the receiver's
//              credit, received into staging slots);
//   tcp:       a raw TCP socket carrying the same bytes in 1 MiB writes (the ceiling);
//   protobuf:  a plain gRPC stream, one protobuf message with a `bytes`
//              payload per tensor (the naive baseline).
// Channels are warmed before timing; each figure is the median of `--trials`.
// Next to each path's GB/s, the CPU time both processes spent per GB it
// moved (all trials together): on a machine where the path is CPU-bound,
// this is what sets its speed. Each row also carries the raw timings the
// figures come from (per path: the median and total trial seconds and the
// CPU seconds), so a reader can recompute them.
//
// With --receiver_netns the receiver runs in another network namespace and
// the bytes cross a veth pair, which bench/capped_veth.sh caps with
// a token bucket: how close each path gets to a wire slower than the CPUs.
//
//   bench_transport [--sizes=65536,...] [--reps=N] [--trials=N] [--json=FILE]
//                   [--chunk_kib=N] [--window_frames=N] [--wire=f32|bf16|f16]
//                   [--receiver_netns=NAME --receiver_ip=A --sender_ip=B] [--tls_dir=DIR]
//
// With --tls_dir (deploy/certs.sh DIR bench) a fourth path, stagelink_tls:
// the same StageLink pair under mutual TLS, and its ratio to plaintext.
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_report.h"
#include "bench/net_util.h"
#include "bench/transport_receiver.h"
#include "shardline/v1/stage_link.grpc.pb.h"
#include "common/dtype.h"
#include "common/half.h"
#include "common/init.h"
#include "worker/transport/grpc_stage_link.h"
#include "worker/transport/stage_link_service.h"

ABSL_FLAG(std::string, sizes, "65536,262144,1048576,4194304,16777216,67108864", "tensor bytes");
ABSL_FLAG(int, reps, 0, "tensors per measurement (0: enough for ~256 MiB, at least 8)");
ABSL_FLAG(int, trials, 5, "measurements per figure (median)");
ABSL_FLAG(std::string, json, "", "write the rows as JSON to this file");
ABSL_FLAG(int, chunk_kib, 1024, "StageLink payload KiB per frame");
ABSL_FLAG(int, window_frames, 16, "StageLink frames the receiver lets the sender have in flight");
ABSL_FLAG(std::string, receiver_netns, "",
          "run the receiver in this network namespace (/var/run/netns/NAME; empty: this one)");
ABSL_FLAG(std::string, receiver_ip, "127.0.0.1", "the receiver's IPv4 address, in its namespace");
ABSL_FLAG(std::string, sender_ip, "127.0.0.1", "this process's IPv4 address, as the receiver reaches it");
ABSL_FLAG(std::string, tls_dir, "",
          "DIR with ca.pem, bench.pem, bench.key (deploy/certs.sh DIR bench): also time the StageLink path under "
          "mutual TLS (stagelink_tls)");
ABSL_FLAG(std::string, wire, "f32",
          "StageLink wire precision: f32, bf16 or f16 (the tensor is narrowed once, as a stage's "
          "device does; GB/s count its f32 bytes)");

namespace shardline::bench {
namespace {

using worker::transport::StageMessage;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

worker::transport::ExchangeOptions LinkOptions() {
  worker::transport::ExchangeOptions options;
  options.timeout = absl::Seconds(120);
  options.chunk_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_kib)) << 10;
  options.window_frames = static_cast<uint32_t>(absl::GetFlag(FLAGS_window_frames));
  return options;
}

int RepsFor(size_t bytes) {
  if (absl::GetFlag(FLAGS_reps) > 0) return absl::GetFlag(FLAGS_reps);
  return static_cast<int>(std::max<size_t>(8, (size_t{256} << 20) / bytes));
}

// ---- The sender ------------------------------------------------------------

// Seconds the live threads of process `pid` have run on a CPU so far; NaN
// where the kernel does not say (no schedstat).
double ProcessCpuSeconds(pid_t pid) {
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  DIR* dir = ::opendir(tasks.c_str());
  if (dir == nullptr) return std::nan("");
  uint64_t total_ns = 0;
  bool read_any = false;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream schedstat(absl::StrCat(tasks, "/", entry->d_name, "/schedstat"));
    uint64_t on_cpu_ns = 0;
    if (schedstat >> on_cpu_ns) {
      total_ns += on_cpu_ns;
      read_any = true;
    }
  }
  ::closedir(dir);
  return read_any ? static_cast<double>(total_ns) / 1e9 : std::nan("");
}

// One path's figures, and the raw timings they come from (in the JSON, so
// that a reader can recompute them).
struct PathFigures {
  double median_s = 0;        // the median trial's seconds for `reps` tensors
  double total_s = 0;         // all trials' seconds
  double cpu_s = 0;           // CPU seconds of both processes over all trials (NaN: unknown)
  double gbps = 0;            // bytes × reps / median_s
  double cpu_s_per_gb = 0;    // cpu_s per GB moved in all trials
};

PathFigures Measure(size_t bytes, int reps, pid_t receiver, const std::function<void()>& run_reps) {
  std::vector<double> seconds;
  const double cpu_before = ProcessCpuSeconds(::getpid()) + ProcessCpuSeconds(receiver);
  for (int t = 0; t < absl::GetFlag(FLAGS_trials); ++t) {
    const auto start = Clock::now();
    run_reps();
    seconds.push_back(Seconds(start));
  }
  const double cpu_after = ProcessCpuSeconds(::getpid()) + ProcessCpuSeconds(receiver);
  std::sort(seconds.begin(), seconds.end());
  PathFigures f;
  f.median_s = seconds[seconds.size() / 2];
  for (double s : seconds) f.total_s += s;
  f.cpu_s = cpu_after - cpu_before;
  f.gbps = static_cast<double>(bytes) * reps / f.median_s / 1e9;
  f.cpu_s_per_gb = f.cpu_s / (static_cast<double>(bytes) * reps * static_cast<double>(seconds.size()) / 1e9);
  return f;
}

int Main() {
  std::vector<size_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    size_t n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 4 || n > (size_t{1} << 30)) {
      std::fprintf(stderr, "Error: bad size '%s'\n", std::string(s).c_str());
      return 3;
    }
    sizes.push_back(n / 4 * 4);
  }
  if (sizes.empty() || absl::GetFlag(FLAGS_trials) < 1 || absl::GetFlag(FLAGS_reps) < 0) {
    std::fprintf(stderr, "Error: --sizes needs a size, --trials must be at least 1 and --reps at least 0\n");
    return 3;
  }
  const std::string receiver_ip = absl::GetFlag(FLAGS_receiver_ip);
  const std::string sender_ip = absl::GetFlag(FLAGS_sender_ip);
  sockaddr_in addr;
  for (const std::string& ip : {receiver_ip, sender_ip}) {
    if (!Ipv4(ip, 0, &addr)) {
      std::fprintf(stderr, "Error: '%s' is not an IPv4 address\n", ip.c_str());
      return 3;
    }
  }
  // A receiver that died is an error to report, not a signal that kills us.
  ::signal(SIGPIPE, SIG_IGN);
  // Fork before this process touches gRPC (gRPC does not survive a fork).
  int to_parent[2], to_child[2];
  if (::pipe(to_parent) != 0 || ::pipe(to_child) != 0) return 2;
  const pid_t child = ::fork();
  if (child == 0) {
    TransportReceiverConfig config;
    config.netns = absl::GetFlag(FLAGS_receiver_netns);
    config.ip = receiver_ip;
    config.sender_ip = sender_ip;
    config.exchange = LinkOptions();
    config.largest_bytes = *std::max_element(sizes.begin(), sizes.end());
    config.tls_dir = absl::GetFlag(FLAGS_tls_dir);
    ::_exit(RunTransportReceiver(config, to_parent[1], to_child[0]));
  }
  // Only the child writes there: if it dies, our read sees the end.
  ::close(to_parent[1]);
  ::close(to_child[0]);
  // The StageLink upstream (us) serves; the receiver connects to it.
  worker::transport::StageLinkService link_service;
  grpc::ServerBuilder builder;
  int link_port = 0;
  builder.AddChannelArgument("grpc.so_reuseport", 0);
  builder.AddListeningPort(absl::StrCat(sender_ip, ":0"), grpc::InsecureServerCredentials(), &link_port);
  link_service.RegisterWith(builder);
  auto link_server = builder.BuildAndStart();
  if (link_server == nullptr) return 2;
  auto downstream = link_service.Expect("bench", 1, 0, LinkOptions());
  SenderPorts sender_ports;
  sender_ports.link = link_port;
  // The same pair under mutual TLS, on a server of its own.
  const bool tls = !absl::GetFlag(FLAGS_tls_dir).empty();
  worker::transport::StageLinkService tls_link_service;
  std::unique_ptr<grpc::Server> tls_link_server;
  std::shared_ptr<worker::transport::ExchangeStream> tls_downstream;
  if (tls) {
    absl::StatusOr<std::shared_ptr<common::TransportSecurity>> security = BenchTls(absl::GetFlag(FLAGS_tls_dir));
    BENCH_CHECK_OK(security.status());
    grpc::ServerBuilder tls_builder;
    tls_builder.AddChannelArgument("grpc.so_reuseport", 0);
    tls_builder.AddListeningPort(absl::StrCat(sender_ip, ":0"), (*security)->ServerCredentials(),
                                 &sender_ports.tls_link);
    tls_link_service.RegisterWith(tls_builder);
    tls_link_server = tls_builder.BuildAndStart();
    if (tls_link_server == nullptr) return 2;
    tls_downstream = tls_link_service.Expect("bench-tls", 1, 0, LinkOptions());
  }
  ReceiverPorts ports;
  if (::write(to_child[1], &sender_ports, sizeof(sender_ports)) != sizeof(sender_ports) ||
      ::read(to_parent[0], &ports, sizeof(ports)) != sizeof(ports)) {
    std::fprintf(stderr, "Error: the receiver did not start (see above)\n");
    return 2;
  }

  // TCP client.
  const int tcp = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(tcp, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  Ipv4(receiver_ip, ports.tcp, &addr);
  if (::connect(tcp, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("tcp connect");
    return 2;
  }
  // Plain gRPC client.
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetMaxReceiveMessageSize(-1);
  auto stub = shardline::v1::StageLink::NewStub(
      grpc::CreateCustomChannel(absl::StrCat(receiver_ip, ":", ports.sink), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext sink_context;
  auto sink = stub->Exchange(&sink_context);

  absl::StatusOr<common::DType> parsed_wire = common::ParseDType(absl::GetFlag(FLAGS_wire));
  BENCH_CHECK_OK(parsed_wire.status());
  const common::DType wire = *parsed_wire;
  BenchReport report;
  int64_t step = 0;
  for (size_t bytes : sizes) {
    const int reps = RepsFor(bytes);
    // One tensor sent `reps` times: the frames alias it, as a stage's do.
    auto message = std::make_shared<StageMessage>();
    message->kind = StageMessage::Kind::kActivation;
    message->step = ++step;
    message->values = std::vector<float>(bytes / 4, 0.5f);
    // A 16-bit wire: the stage's device narrowed the tensor (as
    // ShardRuntime does before the copy to the host); the link moves half
    // the bytes. GB/s still count the tensor's f32 bytes.
    message->dtype = wire;
    if (wire != common::DType::kF32) {
      std::vector<uint16_t> halves(bytes / 4);
      if (wire == common::DType::kBF16) {
        common::ConvertF32ToBf16(message->values.data(), halves.data(), halves.size());
      } else {
        common::ConvertF32ToF16(message->values.data(), halves.data(), halves.size());
      }
      std::memcpy(message->values.data(), halves.data(), halves.size() * sizeof(uint16_t));
    }
    auto link_reps = [&](worker::transport::ExchangeStream& stream) {
      // Acks are taken as they come (a stage that stopped receiving would,
      // by design, stop being sent to).
      std::thread acks([&] {
        for (int r = 0; r < reps; ++r) BENCH_CHECK_OK(stream.Receive().status());
      });
      for (int r = 0; r < reps; ++r) BENCH_CHECK_OK(stream.Send(message));
      acks.join();
    };
    auto stagelink_reps = [&] { link_reps(*downstream); };
    auto stagelink_tls_reps = [&] { link_reps(*tls_downstream); };
    std::vector<char> data(bytes, 'x');
    // Every path sends all `reps` tensors back to back and then waits for
    // the receiver's per-tensor acks, so each measures streaming, not latency.
    auto tcp_reps = [&] {
      for (int r = 0; r < reps; ++r) {
        const uint64_t n = bytes;
        if (::send(tcp, &n, sizeof(n), 0) != sizeof(n)) std::abort();
        for (size_t off = 0; off < bytes;) {
          const ssize_t sent = ::send(tcp, data.data() + off, std::min<size_t>(1 << 20, bytes - off), 0);
          if (sent <= 0) std::abort();
          off += static_cast<size_t>(sent);
        }
      }
      std::vector<char> acks(static_cast<size_t>(reps));
      if (::recv(tcp, acks.data(), acks.size(), MSG_WAITALL) != static_cast<ssize_t>(acks.size())) std::abort();
    };
    shardline::v1::StageFrame frame;
    frame.set_payload(std::string(bytes, 'x'));
    frame.set_chunk_count(1);
    auto protobuf_reps = [&] {
      std::thread reader([&] {
        shardline::v1::StageFrame ack;
        for (int r = 0; r < reps; ++r) {
          if (!sink->Read(&ack)) std::abort();
        }
      });
      for (int r = 0; r < reps; ++r) {
        if (!sink->Write(frame)) std::abort();
      }
      reader.join();
    };
    stagelink_reps();  // warm every path first
    tcp_reps();
    protobuf_reps();
    if (tls) stagelink_tls_reps();
    const PathFigures stagelink = Measure(bytes, reps, child, stagelink_reps);
    const PathFigures raw = Measure(bytes, reps, child, tcp_reps);
    const PathFigures plain = Measure(bytes, reps, child, protobuf_reps);
    BenchReport::Row row = {{"bytes", static_cast<double>(bytes)},
                            {"reps", static_cast<double>(reps)},
                            {"trials", static_cast<double>(absl::GetFlag(FLAGS_trials))},
                            {"stagelink_gbps", stagelink.gbps},
                            {"tcp_gbps", raw.gbps},
                            {"protobuf_gbps", plain.gbps},
                            {"stagelink_vs_tcp", stagelink.gbps / raw.gbps},
                            {"stagelink_vs_protobuf", stagelink.gbps / plain.gbps},
                            {"stagelink_cpu_s_per_gb", stagelink.cpu_s_per_gb},
                            {"tcp_cpu_s_per_gb", raw.cpu_s_per_gb},
                            {"protobuf_cpu_s_per_gb", plain.cpu_s_per_gb}};
    for (const auto& [path, f] : {std::pair<const char*, const PathFigures&>{"stagelink", stagelink},
                                  {"tcp", raw}, {"protobuf", plain}}) {
      row.emplace_back(absl::StrCat(path, "_median_s"), f.median_s);
      row.emplace_back(absl::StrCat(path, "_total_s"), f.total_s);
      row.emplace_back(absl::StrCat(path, "_cpu_s"), f.cpu_s);
    }
    if (tls) {
      const PathFigures secured = Measure(bytes, reps, child, stagelink_tls_reps);
      row.emplace_back("stagelink_tls_gbps", secured.gbps);
      row.emplace_back("stagelink_tls_vs_stagelink", secured.gbps / stagelink.gbps);
      row.emplace_back("stagelink_tls_cpu_s_per_gb", secured.cpu_s_per_gb);
      row.emplace_back("stagelink_tls_median_s", secured.median_s);
      row.emplace_back("stagelink_tls_total_s", secured.total_s);
      row.emplace_back("stagelink_tls_cpu_s", secured.cpu_s);
    }
    report.Add(std::move(row));
  }
  sink->WritesDone();
  (void)sink->Finish();
  ::close(tcp);
  downstream->Close("done");
  link_service.Forget("bench", 0);
  downstream.reset();
  if (tls) {
    tls_downstream->Close("done");
    tls_link_service.Forget("bench-tls", 0);
    tls_downstream.reset();
    tls_link_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  link_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  // The receiver ends when its link closes; make sure it does.
  ReapChild(child);
  BENCH_CHECK_OK(report.Publish(absl::GetFlag(FLAGS_json)));
  return 0;
}

}  // namespace
}  // namespace shardline::bench

int main(int argc, char** argv) {
  shardline::common::InitProcess(argc, argv, "stage-link throughput against raw TCP and plain gRPC");
  return shardline::bench::Main();
}
