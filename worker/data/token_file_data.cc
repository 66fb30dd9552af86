#include "worker/data/token_file_data.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/input_limits.h"
#include "common/rng.h"
#include "common/status_macros.h"

namespace shardline::worker::data {

namespace {

// The largest little-endian id of `width` bytes in `bytes`.
uint32_t LargestId(const std::string& bytes, int width) {
  uint32_t largest = 0;
  for (size_t i = 0; i + static_cast<size_t>(width) <= bytes.size(); i += static_cast<size_t>(width)) {
    uint32_t id = 0;
    for (int b = width - 1; b >= 0; --b) id = (id << 8) | static_cast<unsigned char>(bytes[i + static_cast<size_t>(b)]);
    largest = std::max(largest, id);
  }
  return largest;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenFileData>> TokenFileData::Load(const TokenFiles& files, int64_t context,
                                                                   uint64_t seed, const DataAccess& access) {
  const int width = files.token_bytes;
  if (width != 1 && width != 2 && width != 4) {
    return absl::InvalidArgumentError(absl::StrCat("data.token_bytes is ", width, ", must be 2 or 4"));
  }
  std::unique_ptr<TokenFileData> data(new TokenFileData(width, context, seed));
  // Reads one file as whole token ids.
  auto read = [&](const std::string& field, const std::string& path, std::string& into) -> absl::Status {
    ASSIGN_OR_RETURN(into, ReadDataFile(path, access));
    if (into.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " ", common::Quote(path), " is empty"));
    if (into.size() % static_cast<size_t>(width) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, " ", common::Quote(path), " has ", into.size(),
                                                     " bytes: not a whole number of ", width, "-byte token ids"));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(read("data.path", files.path, data->file_));
  const size_t tokens = data->file_.size() / static_cast<size_t>(width);
  const size_t window = static_cast<size_t>(context) + 1;
  if (files.val_path.empty()) {
    const size_t split = static_cast<size_t>(static_cast<double>(tokens) * (1.0 - files.val_fraction));
    if (split < window || tokens - split < window) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.path ", common::Quote(files.path), " has ", tokens, " tokens; with data.val_fraction ",
          files.val_fraction, " each part needs at least model.context + 1 = ", window));
    }
    data->train_ = {&data->file_, 0, split};
    data->val_ = {&data->file_, split, tokens};
  } else {
    RETURN_IF_ERROR(read("data.val_path", files.val_path, data->val_file_));
    const size_t val_tokens = data->val_file_.size() / static_cast<size_t>(width);
    if (tokens < window || val_tokens < window) {
      return absl::InvalidArgumentError(absl::StrCat("data.path has ", tokens, " tokens and data.val_path ",
                                                     val_tokens, ": each needs at least model.context + 1 = ",
                                                     window));
    }
    data->train_ = {&data->file_, 0, tokens};
    data->val_ = {&data->val_file_, 0, val_tokens};
  }
  if (width > 1) {
    data->vocab_needed_ = 1 + static_cast<int64_t>(std::max(LargestId(data->file_, width),
                                                            LargestId(data->val_file_, width)));
  }
  return data;
}

int32_t TokenFileData::Token(const Part& part, size_t i) const {
  const unsigned char* p =
      reinterpret_cast<const unsigned char*>(part.bytes->data()) + i * static_cast<size_t>(token_bytes_);
  uint32_t id = 0;
  for (int b = token_bytes_ - 1; b >= 0; --b) id = (id << 8) | p[b];
  return static_cast<int32_t>(id);
}

void TokenFileData::AppendWindow(const Part& part, size_t offset, Batch& batch) const {
  for (int64_t j = 0; j < context_; ++j) {
    const size_t i = offset + static_cast<size_t>(j);
    batch.ids.push_back(Token(part, i));
    batch.targets.push_back(Token(part, i + 1));
  }
}

Batch TokenFileData::TrainBatch(int64_t step, int micro_batch, int64_t sequences) const {
  Batch batch;
  batch.batch = sequences;
  batch.t = context_;
  // Window starts 0 .. n - context - 1 of the training tokens.
  const uint64_t starts = train_tokens() - static_cast<size_t>(context_);
  for (int64_t s = 0; s < sequences; ++s) {
    // Keyed by the place in the global batch: any micro-batch split gives
    // the same global batch.
    const uint64_t index = static_cast<uint64_t>(micro_batch * sequences + s);
    common::Rng rng(common::MixKey(seed_, 0x7e47, static_cast<uint64_t>(step), index));
    AppendWindow(train_, train_.begin + rng.Uniform(starts), batch);
  }
  return batch;
}

EvalSet TokenFileData::MakeEvalSet(int max_examples) const {
  EvalSet set;
  set.kind = EvalSet::Kind::kLoss;
  constexpr int64_t kSequencesPerBatch = 16;
  const size_t window = static_cast<size_t>(context_);
  Batch batch;
  int examples = 0;
  for (size_t offset = val_.begin; offset + window + 1 <= val_.end && examples < max_examples;
       offset += window, ++examples) {
    AppendWindow(val_, offset, batch);
    if (++batch.batch == kSequencesPerBatch) {
      batch.t = context_;
      set.batches.push_back(std::move(batch));
      batch = Batch();
    }
  }
  if (batch.batch > 0) {
    batch.t = context_;
    set.batches.push_back(std::move(batch));
  }
  return set;
}

}  // namespace shardline::worker::data
