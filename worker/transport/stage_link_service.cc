#include "worker/transport/stage_link_service.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/input_limits.h"
#include "common/random_token.h"
#include "common/tensor_coding.h"

namespace shardline::worker::transport {
namespace {

// One downstream neighbour's stream. Reads frames into the bound
// ExchangeStream and writes what the stage sends. Finishes once the peer is
// gone, a frame is malformed or the stage closed the stream, and never while
// a write is in flight.
class ExchangeReactor final : public grpc::ServerGenericBidiReactor, public FrameWriter {
 public:
  explicit ExchangeReactor(StageLinkService* service) : service_(service) { StartRead(&in_); }

  void StartFrameWrite(const grpc::ByteBuffer* frame, bool more_follows) override {
    StartWrite(frame, more_follows ? grpc::WriteOptions().set_buffer_hint() : grpc::WriteOptions());
  }

  // The hello is answered with a hello (the ack, carrying our grant) before
  // any data, so the downstream side knows the stream is bound and not about
  // to be refused.
  void OnReadDone(bool ok) override {
    if (!ok) return End(grpc::Status::OK, "the downstream stage closed the link");
    if (stream_ == nullptr) {
      absl::StatusOr<common::DecodedFrame> hello = common::DecodeFrame(in_);
      if (!hello.ok() || !hello->header().has_hello()) {
        return End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first frame must be a hello"), "");
      }
      if (hello->header().credit() == 0) {
        return End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the hello grants no credit"), "");
      }
      absl::StatusOr<std::shared_ptr<ExchangeStream>> stream = service_->Bind(hello->header().hello());
      if (!stream.ok()) return End(common::ToGrpcStatus(stream.status()), "");
      shardline::v1::StageFrame ack;
      *ack.mutable_hello() = hello->header().hello();
      ack.set_credit((*stream)->window_frames());
      {
        absl::MutexLock lock(&mu_);
        stream_ = std::move(*stream);
        peer_credit_ = hello->header().credit();
        ack_in_flight_ = true;
      }
      ack_ = common::EncodeFrame(ack);
      StartWrite(&ack_);
    } else if (absl::Status s = stream_->FrameReceived(in_); !s.ok()) {
      return End(common::ToGrpcStatus(s), std::string(s.message()));
    }
    in_.Clear();
    if (stream_->closed()) return End(grpc::Status::OK, "");
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    bool ack = false;
    {
      absl::MutexLock lock(&mu_);
      ack = ack_in_flight_;
      ack_in_flight_ = false;
    }
    if (ack) {
      if (ok) stream_->Attach(this, peer_credit_);
    } else {
      stream_->FrameWritten(ok);
    }
    if (!ok) End(grpc::Status::OK, "the link to the downstream stage broke");
    MaybeFinish();
  }

  void OnCancel() override { End(grpc::Status::CANCELLED, "the downstream stage cancelled the link"); }

  void EndCall(const absl::Status& status) override {
    End(common::ToGrpcStatus(status), std::string(status.message()));
  }

  void OnDone() override {
    if (stream_ != nullptr) stream_->Detach(absl::UnavailableError("the link to the downstream stage ended"));
    delete this;
  }

 private:
  void End(grpc::Status status, const std::string& reason) {
    std::shared_ptr<ExchangeStream> stream;
    {
      absl::MutexLock lock(&mu_);
      if (ending_) return;
      ending_ = true;
      status_ = std::move(status);
      stream = stream_;
    }
    if (stream != nullptr) stream->Close(reason.empty() ? status_.error_message() : reason);
    MaybeFinish();
  }
  void MaybeFinish() {
    {
      absl::MutexLock lock(&mu_);
      if (!ending_ || finished_) return;
      if (ack_in_flight_ || (stream_ != nullptr && stream_->writing())) return;  // OnWriteDone comes back
      finished_ = true;
    }
    Finish(status_);
  }

  StageLinkService* const service_;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer ack_;
  absl::Mutex mu_;
  bool ack_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<ExchangeStream> stream_;  // set once, under mu_, by the first read
  uint32_t peer_credit_ = 0;                // granted by the hello; set with stream_
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_;
};

// Any other method on this server.
class UnimplementedReactor final : public grpc::ServerGenericBidiReactor {
 public:
  explicit UnimplementedReactor(const std::string& method) {
    Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no method " + method + " here"));
  }
  void OnDone() override { delete this; }
};

}  // namespace

void StageLinkService::RegisterWith(grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(static_cast<int>(kMaxChunkBytes + common::kMaxFrameHeaderBytes));
  // The links' keepalive pings (every 30 s, idle or not) are welcome: the
  // default policy would answer them with GOAWAY after a quiet minute.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, kStageLinkWriteBufferBytes);
  builder.RegisterCallbackGenericService(this);
}

std::shared_ptr<ExchangeStream> StageLinkService::ExpectEndpoint(Endpoint endpoint, uint64_t epoch,
                                                                 const ExchangeOptions& options) {
  auto stream = std::make_shared<ExchangeStream>(options);
  absl::MutexLock lock(&mu_);
  expected_[std::move(endpoint)] = Expectation{epoch, options.link_token, stream, false};
  return stream;
}

std::shared_ptr<ExchangeStream> StageLinkService::Expect(const std::string& job_id, uint64_t epoch,
                                                         int stage, const ExchangeOptions& options) {
  return ExpectEndpoint({job_id, "", stage, stage + 1}, epoch, options);
}

std::shared_ptr<ExchangeStream> StageLinkService::ExpectPeer(const std::string& job_id, uint64_t epoch,
                                                             const std::string& group, int rank, int peer,
                                                             const ExchangeOptions& options) {
  return ExpectEndpoint({job_id, group, rank, peer}, epoch, options);
}

void StageLinkService::Forget(const std::string& job_id, int stage) {
  absl::MutexLock lock(&mu_);
  expected_.erase({job_id, "", stage, stage + 1});
}

void StageLinkService::ForgetPeer(const std::string& job_id, const std::string& group, int rank, int peer) {
  absl::MutexLock lock(&mu_);
  expected_.erase({job_id, group, rank, peer});
}

int64_t StageLinkService::hellos_refused() {
  absl::MutexLock lock(&mu_);
  return hellos_refused_;
}

absl::StatusOr<std::shared_ptr<ExchangeStream>> StageLinkService::Bind(
    const shardline::v1::StageHello& hello) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<ExchangeStream>> bound = BindLocked(hello);
  if (!bound.ok()) ++hellos_refused_;
  return bound;
}

absl::StatusOr<std::shared_ptr<ExchangeStream>> StageLinkService::BindLocked(
    const shardline::v1::StageHello& hello) {
  const bool collective = !hello.group().empty();
  const Endpoint endpoint = collective ? Endpoint{hello.job_id(), hello.group(), hello.to_rank(), hello.rank()}
                                       : Endpoint{hello.job_id(), "", hello.stage() - 1, hello.stage()};
  auto it = expected_.find(endpoint);
  if (it == expected_.end()) {
    return absl::NotFoundError(
        collective ? absl::StrCat("no rank ", hello.to_rank(), " of group ", common::Quote(hello.group()), " of job ",
                                  common::Quote(hello.job_id()), " waits for rank ", hello.rank(), " here")
                   : absl::StrCat("no stage ", hello.stage() - 1, " of job ", common::Quote(hello.job_id()),
                                  " waits for a neighbour here"));
  }
  Expectation& e = it->second;
  if (hello.plan_epoch() < e.epoch) {
    return absl::FailedPreconditionError(absl::StrCat("plan epoch ", hello.plan_epoch(),
                                                      " is stale: the current epoch is ", e.epoch));
  }
  if (hello.plan_epoch() > e.epoch) {
    // Epochs only grow: the stage here has not started the newer plan yet
    // (it is stopping the old one). The peer retries, as for a stage not
    // yet expected.
    return absl::NotFoundError(absl::StrCat("plan epoch ", hello.plan_epoch(), " has not started here yet (epoch ",
                                            e.epoch, " is ending)"));
  }
  // Job ids and epochs can be guessed; the job's link token cannot.
  if (!common::TokensEqual(hello.link_token(), e.link_token)) {
    return absl::UnauthenticatedError("the hello does not carry this job's link token");
  }
  std::shared_ptr<ExchangeStream> stream = e.stream.lock();
  if (stream == nullptr) return absl::NotFoundError("the stage no longer waits for this link");
  if (e.bound) {
    return absl::AlreadyExistsError(collective ? "this rank's stream from that peer is already connected"
                                               : "this stage's downstream link is already connected");
  }
  e.bound = true;
  return stream;
}

grpc::ServerGenericBidiReactor* StageLinkService::CreateReactor(grpc::GenericCallbackServerContext* context) {
  if (context->method() != kExchangeMethod) return new UnimplementedReactor(context->method());
  return new ExchangeReactor(this);
}

}  // namespace shardline::worker::transport
