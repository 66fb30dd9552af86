#include "bench/loopback_server.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace shardline::bench {

LoopbackServer StartLoopbackServer(worker::transport::StageLinkService& service) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddChannelArgument("grpc.so_reuseport", 0);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  service.RegisterWith(builder);
  LoopbackServer out;
  out.server = builder.BuildAndStart();
  CHECK(out.server != nullptr && port != 0) << "no StageLink server on 127.0.0.1";
  out.address = absl::StrCat("127.0.0.1:", port);
  return out;
}

}  // namespace shardline::bench
