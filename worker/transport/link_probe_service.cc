#include "worker/transport/link_probe_service.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace shardline::worker::transport {
namespace {

class SinkReactor final : public grpc::ServerReadReactor<shardline::v1::LinkProbeChunk> {
 public:
  SinkReactor(std::atomic<int>& active, std::atomic<int64_t>& largest, shardline::v1::LinkProbeReceipt* receipt)
      : active_(active), largest_(largest), receipt_(receipt) {
    if (active_.fetch_add(1) >= LinkProbeService::kMaxSinks) {
      End(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       absl::StrCat("this worker already serves ", LinkProbeService::kMaxSinks,
                                    " link probes; try again later")));
      return;
    }
    StartRead(&chunk_);
  }

  // Finishes, and frees its place at once: gRPC calls OnDone a little after
  // the caller has its answer, and a caller's next probe may come first.
  void End(const grpc::Status& status) {
    active_.fetch_sub(1);
    Finish(status);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the caller is done sending
      receipt_->set_bytes(bytes_);
      for (int64_t seen = largest_.load(); seen < bytes_ && !largest_.compare_exchange_weak(seen, bytes_);) {
      }
      End(grpc::Status::OK);
      return;
    }
    bytes_ += static_cast<int64_t>(chunk_.payload().size());
    if (bytes_ > LinkProbeService::kMaxProbeBytes) {
      End(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       absl::StrCat("a link probe may send at most ", LinkProbeService::kMaxProbeBytes, " bytes")));
      return;
    }
    chunk_.Clear();
    StartRead(&chunk_);
  }

  void OnDone() override { delete this; }

 private:
  std::atomic<int>& active_;
  std::atomic<int64_t>& largest_;
  shardline::v1::LinkProbeReceipt* const receipt_;
  shardline::v1::LinkProbeChunk chunk_;
  int64_t bytes_ = 0;
};

}  // namespace

grpc::ServerUnaryReactor* LinkProbeService::Ping(grpc::CallbackServerContext* context,
                                                 const shardline::v1::LinkPing* request,
                                                 shardline::v1::LinkPing* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerReadReactor<shardline::v1::LinkProbeChunk>* LinkProbeService::Sink(
    grpc::CallbackServerContext* context, shardline::v1::LinkProbeReceipt* receipt) {
  return new SinkReactor(active_, largest_, receipt);
}

}  // namespace shardline::worker::transport
