// Helpers of the stage-link tests: a StageLinkService on a loopback server,
// link options for one job, and a raw Exchange peer (the generated stub:
// frames as ordinary protobuf) for playing a misbehaving neighbour.
#ifndef SHARDLINE_TESTS_WORKER_TRANSPORT_STAGE_LINK_TEST_UTIL_H_
#define SHARDLINE_TESTS_WORKER_TRANSPORT_STAGE_LINK_TEST_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shardline/v1/stage_link.grpc.pb.h"
#include "worker/transport/grpc_stage_link.h"
#include "worker/transport/stage_link_service.h"

namespace shardline::worker::transport {

struct Server {
  std::unique_ptr<StageLinkService> service = std::make_unique<StageLinkService>();
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

inline std::unique_ptr<Server> StartServer(const std::string& address = "127.0.0.1:0") {
  auto s = std::make_unique<Server>();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddChannelArgument("grpc.so_reuseport", 0);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  s->service->RegisterWith(builder);
  s->server = builder.BuildAndStart();
  EXPECT_NE(port, 0);
  s->address = absl::StrCat("127.0.0.1:", port);
  return s;
}

inline ExchangeOptions Exchange(absl::Duration timeout) {
  ExchangeOptions o;
  o.timeout = timeout;
  o.chunk_bytes = 1000;  // force many chunks per tensor
  return o;
}

inline GrpcStageLinkOptions Options(int stage, int stages, Server* own, Server* upstream,
                                    uint64_t epoch = 7, absl::Duration timeout = absl::Seconds(30)) {
  GrpcStageLinkOptions o;
  o.job_id = "job-1";
  o.plan_epoch = epoch;
  o.stage = stage;
  o.stages = stages;
  o.service = own->service.get();
  if (upstream != nullptr) o.upstream_address = upstream->address;
  o.exchange = Exchange(timeout);
  return o;
}

// A raw Exchange call, for playing a misbehaving peer.
class RawPeer {
 public:
  explicit RawPeer(const std::string& address)
      : stub_(shardline::v1::StageLink::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    stream_ = stub_->Exchange(&context_);
  }
  bool Write(const shardline::v1::StageFrame& frame) { return stream_->Write(frame); }
  grpc::Status Finish() {
    stream_->WritesDone();
    shardline::v1::StageFrame ignored;
    while (stream_->Read(&ignored)) {
    }
    return stream_->Finish();
  }

 private:
  std::unique_ptr<shardline::v1::StageLink::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<shardline::v1::StageFrame, shardline::v1::StageFrame>> stream_;
};

inline shardline::v1::StageFrame Hello(const std::string& job, uint64_t epoch, int stage) {
  shardline::v1::StageFrame f;
  f.mutable_hello()->set_job_id(job);
  f.mutable_hello()->set_plan_epoch(epoch);
  f.mutable_hello()->set_stage(stage);
  f.set_credit(4);
  return f;
}

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_TESTS_WORKER_TRANSPORT_STAGE_LINK_TEST_UTIL_H_
