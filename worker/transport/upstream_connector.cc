#include "worker/transport/upstream_connector.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/random/random.h"

#include "worker/transport/grpc_stage_link.h"

namespace shardline::worker::transport {

UpstreamConnector::UpstreamConnector(const std::string& address, const shardline::v1::StageHello& hello,
                                     std::shared_ptr<ExchangeStream> stream, absl::Duration timeout,
                                     std::shared_ptr<grpc::ChannelCredentials> credentials)
    : hello_(hello),
      stream_(std::move(stream)),
      timeout_(timeout),
      stub_(grpc::CreateCustomChannel(address,
                                      credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(),
                                      StageLinkChannelArguments())),
      thread_([this] { Connect(); }) {}

void UpstreamConnector::Connect() {
  const absl::Time deadline = absl::Now() + timeout_;
  absl::Duration backoff = absl::Milliseconds(10);
  absl::BitGen random;
  while (true) {
    ++attempts_;
    auto call = std::make_unique<UpstreamExchangeCall>(&stub_, hello_, stream_);
    call->Start();
    // Wait until established, refused, or we are closing.
    while (!closing_ && !call->WaitEstablished(absl::Milliseconds(50)) && !call->done()) {
    }
    const bool established = call->WaitEstablished(absl::ZeroDuration());
    if (established || closing_) {
      absl::MutexLock lock(&mu_);
      current_ = std::move(call);
      return;
    }
    const absl::Status status = call->status();
    call->Shutdown();
    // The peer may simply not have registered its side yet (NOT_FOUND):
    // try again with jittered exponential backoff until the link's
    // timeout. (One that does not listen yet holds the call instead:
    // wait_for_ready.)
    const absl::Duration wait = backoff * absl::Uniform(random, 0.5, 1.0);
    if (status.code() != absl::StatusCode::kNotFound || absl::Now() + wait > deadline) {
      stream_->Close(status);
      return;
    }
    const absl::Time until = absl::Now() + wait;
    while (!closing_ && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

UpstreamConnector::~UpstreamConnector() {
  closing_ = true;
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  if (current_ != nullptr) current_->Shutdown(std::min(timeout_, absl::Seconds(5)));
}

}  // namespace shardline::worker::transport
