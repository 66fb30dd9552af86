#include "bench/loopback_server.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace shardline::bench {

LoopbackServer StartLoopbackServer(worker::transport::StageLinkService& service, const std::string& ip) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddChannelArgument("grpc.so_reuseport", 0);
  builder.AddListeningPort(absl::StrCat(ip, ":0"), grpc::InsecureServerCredentials(), &port);
  service.RegisterWith(builder);
  LoopbackServer out;
  out.server = builder.BuildAndStart();
  CHECK(out.server != nullptr && port != 0) << "no StageLink server on " << ip;
  out.address = absl::StrCat(ip, ":", port);
  out.port = port;
  return out;
}

}  // namespace shardline::bench
