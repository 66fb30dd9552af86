// A gRPC server on 127.0.0.1, or `ip` (a port the kernel picks), serving a
// worker's StageLink service, as the benchmarks' ranks and stages need.
// Stops the process when it cannot listen: a benchmark without its server
// would measure nothing.
#ifndef SHARDLINE_BENCH_LOOPBACK_SERVER_H_
#define SHARDLINE_BENCH_LOOPBACK_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "worker/transport/stage_link_service.h"

namespace shardline::bench {

struct LoopbackServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;  // "IP:PORT"
  int port = 0;
};

LoopbackServer StartLoopbackServer(worker::transport::StageLinkService& service,
                                   const std::string& ip = "127.0.0.1");

}  // namespace shardline::bench

#endif  // SHARDLINE_BENCH_LOOPBACK_SERVER_H_
