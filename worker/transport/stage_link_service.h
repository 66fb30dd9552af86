// StageLinkService serves the StageLink.Exchange RPC of a worker: the
// downstream neighbour of a local stage connects here, and so do the higher
// ranks of a local collective rank's group. A local stage (rank) first
// announces which neighbour (peer) it waits for (Expect, ExpectPeer); an
// incoming stream whose hello names that job, stage (group and ranks) and
// the same plan epoch is bound to it, anything else is refused with a
// status that says why (unknown job, stage, group or rank, or a newer
// epoch than the one here: NOT_FOUND, and the peer retries; an older epoch:
// FAILED_PRECONDITION; a second stream for the same endpoint:
// ALREADY_EXISTS; a hello of the right epoch without the job's link token
// (ExchangeOptions::link_token): UNAUTHENTICATED). Malformed frames end their stream with
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
#include <tuple>
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
  static constexpr char kServiceName[] = "shardline.v1.StageLink";
  static constexpr char kExchangeMethod[] = "/shardline.v1.StageLink/Exchange";

  // Serves this on `builder`'s server, accepting frames up to the largest
  // chunk and the links' keepalive pings, with the links' write buffer.
  void RegisterWith(grpc::ServerBuilder& builder);

  // Stage `stage` of `job_id` at `epoch` waits for stage + 1 to connect.
  // The stream is closed when the last holder lets go of it.
  std::shared_ptr<ExchangeStream> Expect(const std::string& job_id, uint64_t epoch, int stage,
                                         const ExchangeOptions& options);
  // Rank `rank` of collective group `group` waits for rank `peer` (> rank)
  // to connect.
  std::shared_ptr<ExchangeStream> ExpectPeer(const std::string& job_id, uint64_t epoch, const std::string& group,
                                             int rank, int peer, const ExchangeOptions& options);
  // Drop an expectation (the stage or rank is done or re-planned).
  void Forget(const std::string& job_id, int stage);
  void ForgetPeer(const std::string& job_id, const std::string& group, int rank, int peer);

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
    std::string link_token;  // a hello must carry it
    std::weak_ptr<ExchangeStream> stream;
    bool bound = false;
  };
  absl::Mutex mu_;
  // (job, group, receiver, sender): a stage link is (job, "", s, s + 1),
  // a collective pair (job, group, rank, peer).
  using Endpoint = std::tuple<std::string, std::string, int, int>;
  std::shared_ptr<ExchangeStream> ExpectEndpoint(Endpoint endpoint, uint64_t epoch, const ExchangeOptions& options);
  std::map<Endpoint, Expectation> expected_ ABSL_GUARDED_BY(mu_);
  int64_t hellos_refused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_WORKER_TRANSPORT_STAGE_LINK_SERVICE_H_
