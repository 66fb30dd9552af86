// UpstreamConnector holds one Exchange call to the worker that serves a
// stream (a stage's previous stage, or a lower rank of a collective group)
// for the stream's life. It calls in the background with `hello`, retrying
// while the peer answers NOT_FOUND (its side is not registered yet: workers
// get their assignments in any order) until `timeout`; a call refused for
// any other reason, or one that never connects, closes the stream with that
// status, so the stream's waits fail with it. The destructor stops
// connecting and ends the call. Thread-safe.
#ifndef SHARDLINE_WORKER_TRANSPORT_UPSTREAM_CONNECTOR_H_
#define SHARDLINE_WORKER_TRANSPORT_UPSTREAM_CONNECTOR_H_

#include <grpcpp/generic/generic_stub.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shardline/v1/stage_link.pb.h"
#include "worker/transport/exchange_stream.h"
#include "worker/transport/upstream_exchange_call.h"

namespace shardline::worker::transport {

class UpstreamConnector {
 public:
  // Starts connecting to `address` (a StageLink server) at once, over a
  // channel protected by `credentials` (null: plaintext).
  UpstreamConnector(const std::string& address, const shardline::v1::StageHello& hello,
                    std::shared_ptr<ExchangeStream> stream, absl::Duration timeout,
                    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
  ~UpstreamConnector();
  UpstreamConnector(const UpstreamConnector&) = delete;
  UpstreamConnector& operator=(const UpstreamConnector&) = delete;

  // How many calls it has made so far (1 once connected at the first try).
  int attempts() const { return attempts_; }

 private:
  void Connect();

  const shardline::v1::StageHello hello_;
  const std::shared_ptr<ExchangeStream> stream_;
  const absl::Duration timeout_;
  grpc::GenericStub stub_;
  std::atomic<bool> closing_{false};
  std::atomic<int> attempts_{0};
  absl::Mutex mu_;
  std::unique_ptr<UpstreamExchangeCall> current_ ABSL_GUARDED_BY(mu_);  // established
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_WORKER_TRANSPORT_UPSTREAM_CONNECTOR_H_
