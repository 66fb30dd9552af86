// TokenFileData: language modelling over a file of tokens. `text_bytes`
// takes a file's bytes as the tokens (vocabulary: the 256 byte values);
// `tokens` a file of little-endian token ids of 2 or 4 bytes each (what
// nanoGPT's prepare scripts write as train.bin / val.bin: numpy's
// uint16 or uint32 `tofile`), whose largest id the model's vocabulary must
// hold. Validation data is a second file (val_path), or else the last
// val_fraction of the first. Training sequences start at seeded random
// offsets in the training tokens; validation uses consecutive windows.
// The files are read window by window (DataFile): ids come from the page
// cache as windows are drawn, so a data set may be larger than memory; a
// file cut short since it was opened gives DATA_LOSS.
#ifndef SHARDLINE_WORKER_DATA_TOKEN_FILE_DATA_H_
#define SHARDLINE_WORKER_DATA_TOKEN_FILE_DATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/data_file.h"
#include "worker/data/data_source.h"

namespace shardline::worker::data {

struct TokenFiles {
  std::string path;
  std::string val_path;  // empty: validation is the tail of `path`
  double val_fraction = 0.1;
  int token_bytes = 1;   // 1: text bytes; 2 or 4: token ids
};

class TokenFileData final : public DataSource {
 public:
  // The files opened by DataFile under `access` (its errors), then
  // INVALID_ARGUMENT for an empty one, one that is not whole token ids, or
  // one too short for a sequence in each part. Token ids are scanned for
  // the largest (under `access`'s deadline and cancellation) once per
  // version of a file in this process.
  static absl::StatusOr<std::unique_ptr<TokenFileData>> Load(const TokenFiles& files, int64_t context,
                                                             uint64_t seed, const DataAccess& access = {});

  TokenFileData(const TokenFileData&) = delete;
  TokenFileData& operator=(const TokenFileData&) = delete;

  int64_t sequence_length() const override { return context_; }
  int64_t vocab_needed() const override { return vocab_needed_; }
  absl::StatusOr<Batch> TrainBatch(int64_t step, int micro_batch, int64_t sequences) const override;
  // Every position of each window.
  int64_t TrainTargets(int64_t sequences) const override { return sequences * context_; }
  absl::StatusOr<EvalSet> MakeEvalSet(int max_examples, int64_t sequences_per_batch) const override;

  // Files this process scanned for their largest id: each version of a
  // file once (DataFile::identity), however often it is loaded.
  static int64_t largest_id_scans();

  size_t train_tokens() const { return train_.end - train_.begin; }
  size_t val_tokens() const { return val_.end - val_.begin; }

 private:
  // Tokens [begin, end) of a file.
  struct Part {
    const DataFile* file = nullptr;
    size_t begin = 0;
    size_t end = 0;
  };

  TokenFileData(int token_bytes, int64_t context, uint64_t seed)
      : token_bytes_(token_bytes), context_(context), seed_(seed) {}
  // The window of context_ tokens at token `offset` of `part`'s file, and
  // their next tokens as targets, appended to `batch` (read into `bytes`).
  absl::Status AppendWindow(const Part& part, size_t offset, std::vector<unsigned char>& bytes, Batch& batch) const;

  const int token_bytes_;
  const int64_t context_;
  const uint64_t seed_;
  std::unique_ptr<DataFile> file_, val_file_;  // val_file_: with val_path
  Part train_, val_;
  int64_t vocab_needed_ = 256;
};

}  // namespace shardline::worker::data

#endif  // SHARDLINE_WORKER_DATA_TOKEN_FILE_DATA_H_
