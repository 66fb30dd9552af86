#include "worker/worker_state_service.h"

#include <memory>

#include "absl/strings/str_cat.h"

namespace shardline::worker {
namespace {

// Streams a snapshot's file straight from its tensors.
class SnapshotWriter final : public grpc::ServerWriteReactor<shardline::v1::ShardChunk> {
 public:
  static constexpr size_t kChunkBytes = 1 << 20;

  explicit SnapshotWriter(std::shared_ptr<const ShardSnapshot> snapshot) : snapshot_(std::move(snapshot)) {
    *chunk_.mutable_header() = snapshot_->header();
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream was interrupted"));
    chunk_.Clear();
    Next();
  }
  void OnDone() override { delete this; }

 private:
  void Next() {
    if (offset_ >= snapshot_->size()) return Finish(grpc::Status::OK);
    snapshot_->Read(offset_, kChunkBytes, chunk_.mutable_data());
    offset_ += static_cast<int64_t>(chunk_.data().size());
    StartWrite(&chunk_);
  }

  const std::shared_ptr<const ShardSnapshot> snapshot_;
  int64_t offset_ = 0;
  shardline::v1::ShardChunk chunk_;
};

class Refused final : public grpc::ServerWriteReactor<shardline::v1::ShardChunk> {
 public:
  explicit Refused(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<shardline::v1::ShardChunk>* WorkerStateService::FetchState(
    grpc::CallbackServerContext* context, const shardline::v1::FetchStateRequest* request) {
  if (!cache_.Admits(request->job_id(), request->link_token())) {
    return new Refused(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                    "the request does not carry a link token of a plan of its job on this worker"));
  }
  std::shared_ptr<const ShardSnapshot> snapshot = cache_.Get(request->job_id(), request->step());
  if (snapshot == nullptr) {
    return new Refused(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                    absl::StrCat("this worker holds no snapshot of step ", request->step(), " of job ",
                                                 request->job_id().substr(0, 64))));
  }
  for (const std::string& name : request->names()) {
    if (!snapshot->tensors().count(name)) {
      return new Refused(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                      absl::StrCat("this worker's snapshot has no tensor ", name.substr(0, 128))));
    }
  }
  return new SnapshotWriter(std::move(snapshot));
}

}  // namespace shardline::worker
