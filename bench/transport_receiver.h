// The receiving side of bench_transport: a process (forked by the sender,
// optionally moved into another network namespace) that serves a plain gRPC
// sink, a raw TCP sink and the downstream end of a StageLink pair, acking
// every tensor, so that the sender can time each path to its last ack.
#ifndef SHARDLINE_BENCH_TRANSPORT_RECEIVER_H_
#define SHARDLINE_BENCH_TRANSPORT_RECEIVER_H_

#include <netinet/in.h>

#include <cstddef>
#include <string>

#include "worker/transport/exchange_stream.h"

namespace shardline::bench {

struct TransportReceiverConfig {
  std::string netns;      // /var/run/netns/NAME to enter first; empty: stay
  std::string ip;         // the receiver's IPv4 address, in its namespace
  std::string sender_ip;  // the sender's, as the receiver reaches it
  worker::transport::ExchangeOptions exchange;
  size_t largest_bytes = 0;  // the largest tensor: the size of the link's staging slots
};

// The receiver's listening ports, sent to the sender through a pipe.
struct ReceiverPorts {
  int sink = 0;
  int tcp = 0;
};

// Writes its ReceiverPorts to `ports_pipe`, reads the sender's StageLink
// port from `link_port_pipe`, connects and serves until the sender is done.
// The process's exit code: 0, or 1 when something could not start.
int RunTransportReceiver(const TransportReceiverConfig& config, int ports_pipe, int link_port_pipe);

}  // namespace shardline::bench

#endif  // SHARDLINE_BENCH_TRANSPORT_RECEIVER_H_
