#include "worker/runtime/grpc_stage_link.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"
#include "shardline/v1/stage_link.grpc.pb.h"

namespace shardline::worker::runtime {
namespace {

using shardline::v1::StageFrame;

absl::Status NoNeighbour(absl::string_view side) {
  return absl::FailedPreconditionError(absl::StrCat("this stage has no ", side, " stage"));
}

}  // namespace

// The Exchange call to the previous stage. The hello goes out first; the
// ExchangeStream is attached (and may write) only once it is on the wire.
// A hold keeps the call open while the stage thread may still start writes.
class GrpcStageLink::UpstreamCall final : public grpc::ClientBidiReactor<StageFrame, StageFrame>,
                                          public FrameWriter {
 public:
  UpstreamCall(const std::string& address, const shardline::v1::StageHello& hello,
               absl::Duration timeout, size_t chunk_bytes)
      : stream_(std::make_shared<ExchangeStream>(timeout, chunk_bytes)) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.enable_retries", 0);  // we recover at micro-batch level, not per message
    args.SetMaxReceiveMessageSize(static_cast<int>(chunk_bytes) + (1 << 20));
    stub_ = shardline::v1::StageLink::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    *hello_.mutable_hello() = hello;
    context_.set_wait_for_ready(true);  // the upstream worker may start after us
  }

  void Start() {
    stub_->async()->Exchange(&context_, this);
    StartWrite(&hello_);
    StartRead(&in_);
    AddHold();
    StartCall();
  }

  // Stops the call and waits until gRPC is done with this object.
  void Shutdown() {
    stream_->Close("this stage closed its link");
    context_.TryCancel();
    while (stream_->writing()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ReleaseHold();
    done_.WaitForNotification();
  }

  ExchangeStream& stream() { return *stream_; }

  void StartFrameWrite(const StageFrame* frame) override { StartWrite(frame); }

  void OnWriteDone(bool ok) override {
    if (!hello_sent_) {
      hello_sent_ = true;
      if (ok) stream_->Attach(this);
    } else {
      stream_->FrameWritten(ok);
    }
    if (release_after_write_ && !stream_->writing()) ReleaseHold();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The call is ending. Let it (OnDone brings the status) as soon as no
      // write of ours is in flight; none starts from now on.
      stream_->StopWriting();
      release_after_write_ = true;
      if (!stream_->writing()) ReleaseHold();  // else OnWriteDone does
      return;
    }
    if (absl::Status s = stream_->FrameReceived(in_); !s.ok()) {
      context_.TryCancel();
      return;
    }
    StartRead(&in_);
  }

  void ReleaseHold() {
    if (!hold_released_.exchange(true)) RemoveHold();
  }

  void OnDone(const grpc::Status& status) override {
    const absl::Status s = common::FromGrpcStatus(status);
    stream_->Detach(s.ok() || s.code() == absl::StatusCode::kCancelled
                        ? absl::UnavailableError("the previous stage closed the link")
                        : absl::Status(s.code(), absl::StrCat("previous stage: ", s.message())));
    done_.Notify();
  }

 private:
  std::unique_ptr<shardline::v1::StageLink::Stub> stub_;
  grpc::ClientContext context_;
  StageFrame hello_;
  StageFrame in_;
  bool hello_sent_ = false;  // touched by OnWriteDone only
  std::atomic<bool> release_after_write_{false};
  std::atomic<bool> hold_released_{false};
  std::shared_ptr<ExchangeStream> stream_;
  absl::Notification done_;
};

GrpcStageLink::GrpcStageLink(GrpcStageLinkOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<GrpcStageLink>> GrpcStageLink::Create(
    const GrpcStageLinkOptions& options) {
  if (options.stages < 1 || options.stage < 0 || options.stage >= options.stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", options.stage, " of ", options.stages));
  }
  const bool has_next = options.stage + 1 < options.stages, has_previous = options.stage > 0;
  if (has_next && options.service == nullptr) {
    return absl::InvalidArgumentError("a stage with a next stage needs the StageLink service");
  }
  if (has_previous && options.upstream_address.empty()) {
    return absl::InvalidArgumentError("a stage with a previous stage needs its address");
  }
  std::unique_ptr<GrpcStageLink> link(new GrpcStageLink(options));
  if (has_next) {
    link->downstream_ = options.service->Expect(options.job_id, options.plan_epoch, options.stage,
                                                options.timeout, options.chunk_bytes);
  }
  if (has_previous) {
    shardline::v1::StageHello hello;
    hello.set_job_id(options.job_id);
    hello.set_plan_epoch(options.plan_epoch);
    hello.set_stage(options.stage);
    link->upstream_ = std::make_unique<UpstreamCall>(options.upstream_address, hello,
                                                     options.timeout, options.chunk_bytes);
    link->upstream_->Start();
  }
  return link;
}

GrpcStageLink::~GrpcStageLink() {
  if (upstream_ != nullptr) upstream_->Shutdown();
  if (downstream_ != nullptr) {
    downstream_->Close("the previous stage closed its link");
    options_.service->Forget(options_.job_id, options_.stage);
  }
}

void GrpcStageLink::Close(const std::string& reason) {
  if (downstream_ != nullptr) downstream_->Close(reason);
  if (upstream_ != nullptr) upstream_->stream().Close(reason);
}

absl::Status GrpcStageLink::SendToNext(StageMessage message) {
  if (downstream_ == nullptr) return NoNeighbour("next");
  return downstream_->Send(message);
}

absl::StatusOr<StageMessage> GrpcStageLink::ReceiveFromPrevious() {
  if (upstream_ == nullptr) return NoNeighbour("previous");
  return upstream_->stream().Receive();
}

absl::Status GrpcStageLink::SendToPrevious(StageMessage message) {
  if (upstream_ == nullptr) return NoNeighbour("previous");
  return upstream_->stream().Send(message);
}

absl::StatusOr<StageMessage> GrpcStageLink::ReceiveFromNext() {
  if (downstream_ == nullptr) return NoNeighbour("next");
  return downstream_->Receive();
}

}  // namespace shardline::worker::runtime
