// TextBytesData: byte-level language modelling over one text file. The file
// is split by position: the first (1 − val_fraction) is for training, the
// rest for validation. Training sequences start at seeded random offsets in
// the training part; validation uses consecutive windows of the other part.
// Vocabulary: the 256 byte values.
#ifndef SHARDLINE_WORKER_DATA_TEXT_BYTES_DATA_H_
#define SHARDLINE_WORKER_DATA_TEXT_BYTES_DATA_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/data_file.h"
#include "worker/data/data_source.h"

namespace shardline::worker::data {

class TextBytesData final : public DataSource {
 public:
  // The file read by ReadDataFile under `access` (its errors), then
  // INVALID_ARGUMENT for an empty one or one too short for a sequence in
  // each part.
  static absl::StatusOr<std::unique_ptr<TextBytesData>> Load(const std::string& path,
                                                             double val_fraction, int64_t context,
                                                             uint64_t seed, const DataAccess& access = {});

  int64_t sequence_length() const override { return context_; }
  int64_t vocab_needed() const override { return 256; }
  Batch TrainBatch(int64_t step, int micro_batch, int64_t sequences) const override;
  // Every position of each window.
  int64_t TrainTargets(int64_t sequences) const override { return sequences * context_; }
  EvalSet MakeEvalSet(int max_examples) const override;

  size_t train_bytes() const { return split_; }
  size_t val_bytes() const { return text_.size() - split_; }

 private:
  TextBytesData(std::string text, size_t split, int64_t context, uint64_t seed)
      : text_(std::move(text)), split_(split), context_(context), seed_(seed) {}
  void AppendWindow(size_t offset, Batch& batch) const;

  const std::string text_;
  const size_t split_;
  const int64_t context_;
  const uint64_t seed_;
};

}  // namespace shardline::worker::data

#endif  // SHARDLINE_WORKER_DATA_TEXT_BYTES_DATA_H_
