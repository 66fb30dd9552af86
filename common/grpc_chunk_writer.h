// ChunkWriter streams one in-memory file as a server stream of `Chunk`
// messages (anything with set_data: ExportChunk, ShardChunk), kChunkBytes
// each, an empty file as one empty chunk; `first` fills the rest of the
// first chunk (a header). It deletes itself when the call is done.
#ifndef SHARDLINE_COMMON_GRPC_CHUNK_WRITER_H_
#define SHARDLINE_COMMON_GRPC_CHUNK_WRITER_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <functional>
#include <string>

namespace shardline::common {

template <typename Chunk>
class ChunkWriter final : public grpc::ServerWriteReactor<Chunk> {
 public:
  static constexpr size_t kChunkBytes = 1 << 20;

  explicit ChunkWriter(std::string bytes, std::function<void(Chunk&)> first = nullptr)
      : bytes_(std::move(bytes)) {
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
  void Next() {
    if (started_ && offset_ >= bytes_.size()) return this->Finish(grpc::Status::OK);
    started_ = true;
    const size_t n = std::min(kChunkBytes, bytes_.size() - offset_);
    chunk_.set_data(bytes_.data() + offset_, n);
    offset_ += n;
    this->StartWrite(&chunk_);
  }

  const std::string bytes_;
  size_t offset_ = 0;
  bool started_ = false;
  Chunk chunk_;
};

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_GRPC_CHUNK_WRITER_H_
