// StageLinkService serves the StageLink.Exchange RPC of a worker: the
// downstream neighbour of a local stage connects here. A local stage first
// announces which neighbour it waits for (Expect); an incoming stream whose
// hello names that job, the next stage and the same plan epoch is bound to
// it, anything else is refused with a status that says why (unknown job or
// stage: NOT_FOUND; another epoch: FAILED_PRECONDITION; a second stream for
// the same stage: ALREADY_EXISTS). Malformed frames end their stream with
// INVALID_ARGUMENT; the service keeps serving. It is gRPC's generic service
// (frames are ByteBuffers, see common/tensor_coding.h), so a server can have
// only this one; other methods are answered UNIMPLEMENTED. Thread-safe.
#ifndef SHARDLINE_WORKER_TRANSPORT_STAGE_LINK_SERVICE_H_
#define SHARDLINE_WORKER_TRANSPORT_STAGE_LINK_SERVICE_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/server_builder.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "shardline/v1/stage_link.pb.h"
#include "worker/transport/exchange_stream.h"

namespace shardline::worker::transport {

// How much of a stream's writes gRPC may hold back to coalesce (the writes
// that carry its buffer hint: another frame is right behind). 4 MiB measured
// 5–25% faster than gRPC's default from 256 KiB to 4 MiB tensors on
// loopback; 16 MiB was slower for large tensors (docs/benchmarks.md).
inline constexpr int kStageLinkWriteBufferBytes = 4 << 20;

class StageLinkService final : public grpc::CallbackGenericService {
 public:
  static constexpr char kExchangeMethod[] = "/shardline.v1.StageLink/Exchange";

  // Serves this on `builder`'s server, accepting frames up to the largest
  // chunk and the links' keepalive pings, with the links' write buffer.
  void RegisterWith(grpc::ServerBuilder& builder);

  // Stage `stage` of `job_id` at `epoch` waits for stage + 1 to connect.
  // The stream is closed when the last holder lets go of it.
  std::shared_ptr<ExchangeStream> Expect(const std::string& job_id, uint64_t epoch, int stage,
                                         const ExchangeOptions& options);
  // Drops an expectation (the stage is done or re-planned).
  void Forget(const std::string& job_id, int stage);

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override;

  // For the reactor: the stream the hello asks for, now bound.
  absl::StatusOr<std::shared_ptr<ExchangeStream>> Bind(const shardline::v1::StageHello& hello);
  // Hellos refused so far (any reason): a neighbour that connects before its
  // stage is expected here is refused NOT_FOUND and retries.
  int64_t hellos_refused();

 private:
  absl::StatusOr<std::shared_ptr<ExchangeStream>> BindLocked(const shardline::v1::StageHello& hello)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Expectation {
    uint64_t epoch = 0;
    std::weak_ptr<ExchangeStream> stream;
    bool bound = false;
  };
  absl::Mutex mu_;
  std::map<std::pair<std::string, int>, Expectation> expected_ ABSL_GUARDED_BY(mu_);
  int64_t hellos_refused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_WORKER_TRANSPORT_STAGE_LINK_SERVICE_H_
