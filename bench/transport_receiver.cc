#include "bench/transport_receiver.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/net_util.h"
#include "shardline/v1/stage_link.grpc.pb.h"
#include "worker/transport/grpc_stage_link.h"

namespace shardline::bench {
namespace {

using worker::transport::StageMessage;

// Plain gRPC: reads whole-tensor frames, acks each `reps`-th with a tiny frame.
class SinkService final : public shardline::v1::StageLink::Service {
 public:
  grpc::Status Exchange(grpc::ServerContext*,
                        grpc::ServerReaderWriter<shardline::v1::StageFrame, shardline::v1::StageFrame>* stream) override {
    shardline::v1::StageFrame frame, ack;
    while (stream->Read(&frame)) {
      if (frame.chunk_index() + 1 == frame.chunk_count()) stream->Write(ack);  // chunk_count carries the ack cadence
    }
    return grpc::Status::OK;
  }
};

void TcpSink(int listener) {
  while (true) {
    const int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    // Acks go out at once: with Nagle's algorithm the last one of a batch
    // waits for the sender's delayed ACK (up to 40 ms), as gRPC's never do.
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::vector<char> buffer(1 << 20);
    uint64_t expected = 0;
    while (::recv(fd, &expected, sizeof(expected), MSG_WAITALL) == sizeof(expected)) {
      uint64_t got = 0;
      while (got < expected) {
        const ssize_t n = ::recv(fd, buffer.data(), std::min<uint64_t>(buffer.size(), expected - got), 0);
        if (n <= 0) break;
        got += static_cast<uint64_t>(n);
      }
      const char ack = 1;
      if (::send(fd, &ack, 1, 0) != 1) break;
    }
    ::close(fd);
  }
}

}  // namespace

// Serves the sinks, then acts as the downstream stage of the StageLink pair
// (it acks every message with an empty gradient).
int RunTransportReceiver(const TransportReceiverConfig& config, int ports_pipe, int link_port_pipe) {
  if (!config.netns.empty() && !EnterNetns(config.netns)) return 1;
  const std::string& ip = config.ip;
  ReceiverPorts ports;
  const int tcp_listener = ListenTcp(ip, &ports.tcp);
  if (tcp_listener < 0) return 1;
  SinkService sink;
  grpc::ServerBuilder builder;
  builder.AddChannelArgument("grpc.so_reuseport", 0);
  builder.SetMaxReceiveMessageSize(-1);
  builder.AddListeningPort(absl::StrCat(ip, ":0"), grpc::InsecureServerCredentials(), &ports.sink);
  builder.RegisterService(&sink);
  auto server = builder.BuildAndStart();
  if (server == nullptr) return 1;
  if (::write(ports_pipe, &ports, sizeof(ports)) != sizeof(ports)) return 1;
  std::thread tcp([tcp_listener] { TcpSink(tcp_listener); });
  tcp.detach();
  SenderPorts sender;
  if (::read(link_port_pipe, &sender, sizeof(sender)) != sizeof(sender)) return 1;
  // The downstream stage of a pair: acks every message with an empty gradient.
  auto serve = [&](const std::string& job, int port, std::shared_ptr<grpc::ChannelCredentials> credentials) {
    worker::transport::GrpcStageLinkOptions options;
    options.job_id = job;
    options.plan_epoch = 1;
    options.stage = 1;
    options.stages = 2;
    options.upstream_address = absl::StrCat(config.sender_ip, ":", port);
    options.exchange = config.exchange;
    options.exchange.channel_credentials = std::move(credentials);
    options.staging_slot_bytes = config.largest_bytes;  // as a worker sizes them for its job
    auto link = worker::transport::GrpcStageLink::Create(options);
    if (!link.ok()) return false;
    while (true) {
      absl::StatusOr<StageMessage> m = (*link)->ReceiveFromPrevious();
      if (!m.ok()) break;  // the sender is done
      StageMessage ack;
      ack.kind = StageMessage::Kind::kGradient;
      ack.step = m->step;
      ack.micro_batch = m->micro_batch;
      if (!(*link)->SendToPrevious(ack).ok()) break;
    }
    return true;
  };
  std::thread tls_link;
  if (sender.tls_link != 0) {
    absl::StatusOr<std::shared_ptr<common::TransportSecurity>> tls = BenchTls(config.tls_dir);
    if (!tls.ok()) return 1;
    tls_link = std::thread([&, credentials = (*tls)->ChannelCredentials()] {
      serve("bench-tls", sender.tls_link, credentials);
    });
  }
  const bool served = serve("bench", sender.link, nullptr);
  if (tls_link.joinable()) tls_link.join();
  server->Shutdown();
  return served ? 0 : 1;
}

absl::StatusOr<std::shared_ptr<common::TransportSecurity>> BenchTls(const std::string& dir) {
  common::TlsFiles files;
  files.cert = dir + "/bench.pem";
  files.key = dir + "/bench.key";
  files.ca = dir + "/ca.pem";
  return common::TransportSecurity::Create(files);
}


}  // namespace shardline::bench
