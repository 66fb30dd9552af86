// ChunkWriter streams one file as a server stream of `Chunk` messages
// (anything with set_data: ExportChunk, ShardChunk), kChunkBytes each, an
// empty file as one empty chunk; `first` fills the rest of the first chunk
// (a header). The file is in memory, or read a chunk at a time from a
// source (a checkpoint's weights straight from its shard files): then only
// a chunk is held. A source's error ends the stream with its status. It
// deletes itself when the call is done.
#ifndef SHARDLINE_COMMON_GRPC_CHUNK_WRITER_H_
#define SHARDLINE_COMMON_GRPC_CHUNK_WRITER_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "common/grpc_status.h"

namespace shardline::common {

template <typename Chunk>
class ChunkWriter final : public grpc::ServerWriteReactor<Chunk> {
 public:
  static constexpr size_t kChunkBytes = 1 << 20;
  // `max` bytes of the file from `offset` (fewer only at its end).
  using Source = std::function<absl::StatusOr<std::string>(uint64_t offset, size_t max)>;

  explicit ChunkWriter(std::string bytes, std::function<void(Chunk&)> first = nullptr)
      : ChunkWriter(std::make_shared<const std::string>(std::move(bytes)), std::move(first)) {}
  ChunkWriter(uint64_t size, Source source, std::function<void(Chunk&)> first = nullptr)
      : size_(size), source_(std::move(source)) {
    if (first) first(chunk_);
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return this->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream was interrupted"));
    chunk_.Clear();
    Next();
  }
  void OnDone() override { delete this; }

 private:
  ChunkWriter(std::shared_ptr<const std::string> held, std::function<void(Chunk&)> first)
      : ChunkWriter(
            held->size(),
            [held](uint64_t offset, size_t max) { return absl::StatusOr<std::string>(held->substr(offset, max)); },
            std::move(first)) {}
  void Next() {
    if (started_ && offset_ >= size_) return this->Finish(grpc::Status::OK);
    started_ = true;
    absl::StatusOr<std::string> piece = source_(offset_, std::min<uint64_t>(kChunkBytes, size_ - offset_));
    if (!piece.ok()) return this->Finish(ToGrpcStatus(piece.status()));
    if (piece->empty() && offset_ < size_) {
      return this->Finish(grpc::Status(grpc::StatusCode::DATA_LOSS, "the file ended early"));
    }
    offset_ += piece->size();
    chunk_.set_data(std::move(*piece));
    this->StartWrite(&chunk_);
  }

  const uint64_t size_;
  const Source source_;
  uint64_t offset_ = 0;
  bool started_ = false;
  Chunk chunk_;
};

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_GRPC_CHUNK_WRITER_H_
