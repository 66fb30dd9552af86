// A gRPC server for tests on a free loopback port (port 0; SO_REUSEPORT off,
// so that a port in use is never shared), serving `services` (which must
// outlive it), insecure.
#ifndef SHARDLINE_TESTS_TESTING_LOOPBACK_SERVER_H_
#define SHARDLINE_TESTS_TESTING_LOOPBACK_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <initializer_list>
#include <memory>
#include <string>

namespace shardline::testing {

struct LoopbackServer {
  std::unique_ptr<grpc::Server> server;  // null when it did not start
  int port = 0;
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

inline LoopbackServer StartLoopbackServer(std::initializer_list<grpc::Service*> services) {
  LoopbackServer out;
  grpc::ServerBuilder builder;
  builder.AddChannelArgument("grpc.so_reuseport", 0);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &out.port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  out.server = builder.BuildAndStart();
  if (out.port == 0) out.server.reset();
  return out;
}

}  // namespace shardline::testing

#endif  // SHARDLINE_TESTS_TESTING_LOOPBACK_SERVER_H_
