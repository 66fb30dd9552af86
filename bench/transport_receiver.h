// The receiving side of bench_transport: a process (forked by the sender,
// optionally moved into another network namespace) that serves a plain gRPC
// sink, a raw TCP sink and the downstream end of a StageLink pair, acking
// every tensor, so that the sender can time each path to its last ack.
#ifndef SHARDLINE_BENCH_TRANSPORT_RECEIVER_H_
#define SHARDLINE_BENCH_TRANSPORT_RECEIVER_H_

#include <netinet/in.h>

#include <cstddef>
#include <string>

#include <memory>

#include "absl/status/statusor.h"
#include "common/transport_security.h"
#include "worker/transport/exchange_stream.h"

namespace shardline::bench {

struct TransportReceiverConfig {
  std::string netns;      // /var/run/netns/NAME to enter first; empty: stay
  std::string ip;         // the receiver's IPv4 address, in its namespace
  std::string sender_ip;  // the sender's, as the receiver reaches it
  worker::transport::ExchangeOptions exchange;
  size_t largest_bytes = 0;  // the largest tensor: the size of the link's staging slots
  // With DIR/ca.pem, DIR/bench.pem, DIR/bench.key: a second StageLink pair
  // under mutual TLS (job "bench-tls"); empty: none.
  std::string tls_dir;
};

// The sender's StageLink ports (the TLS one 0 without TLS), through a pipe.
struct SenderPorts {
  int link = 0;
  int tls_link = 0;
};

// Mutual TLS from bench_transport's --tls_dir (deploy/certs.sh DIR bench).
absl::StatusOr<std::shared_ptr<common::TransportSecurity>> BenchTls(const std::string& dir);

// The receiver's listening ports, sent to the sender through a pipe.
struct ReceiverPorts {
  int sink = 0;
  int tcp = 0;
};

// Writes its ReceiverPorts to `ports_pipe`, reads the sender's SenderPorts
// from `link_port_pipe`, connects and serves until the sender is done.
// The process's exit code: 0, or 1 when something could not start.
int RunTransportReceiver(const TransportReceiverConfig& config, int ports_pipe, int link_port_pipe);

}  // namespace shardline::bench

#endif  // SHARDLINE_BENCH_TRANSPORT_RECEIVER_H_
