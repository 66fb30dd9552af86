#include "worker/data/text_bytes_data.h"

#include "absl/strings/str_cat.h"
#include "common/input_limits.h"
#include "common/rng.h"
#include "common/status_macros.h"

namespace shardline::worker::data {

absl::StatusOr<std::unique_ptr<TextBytesData>> TextBytesData::Load(const std::string& path,
                                                                   double val_fraction,
                                                                   int64_t context, uint64_t seed,
                                                                   const DataAccess& access) {
  ASSIGN_OR_RETURN(std::string text, ReadDataFile(path, access));
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat("data.path ", common::Quote(path), " is empty"));
  const size_t split = static_cast<size_t>(static_cast<double>(text.size()) * (1.0 - val_fraction));
  const size_t window = static_cast<size_t>(context) + 1;
  if (split < window || text.size() - split < window) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.path ", common::Quote(path), " has ", text.size(), " bytes; with data.val_fraction ",
        val_fraction, " each part needs at least model.context + 1 = ", window));
  }
  return std::unique_ptr<TextBytesData>(new TextBytesData(std::move(text), split, context, seed));
}

void TextBytesData::AppendWindow(size_t offset, Batch& batch) const {
  for (int64_t j = 0; j < context_; ++j) {
    batch.ids.push_back(static_cast<unsigned char>(text_[offset + j]));
    batch.targets.push_back(static_cast<unsigned char>(text_[offset + j + 1]));
  }
}

Batch TextBytesData::TrainBatch(int64_t step, int micro_batch, int64_t sequences) const {
  Batch batch;
  batch.batch = sequences;
  batch.t = context_;
  const uint64_t starts = split_ - static_cast<size_t>(context_);  // offsets 0..split-context-1
  for (int64_t s = 0; s < sequences; ++s) {
    // Keyed by the place in the global batch: any micro-batch split gives
    // the same global batch.
    const uint64_t index = static_cast<uint64_t>(micro_batch * sequences + s);
    common::Rng rng(common::MixKey(seed_, 0x7e47, static_cast<uint64_t>(step), index));
    AppendWindow(rng.Uniform(starts), batch);
  }
  return batch;
}

EvalSet TextBytesData::MakeEvalSet(int max_examples) const {
  EvalSet set;
  set.kind = EvalSet::Kind::kLoss;
  constexpr int64_t kSequencesPerBatch = 16;
  const size_t window = static_cast<size_t>(context_);
  Batch batch;
  int examples = 0;
  for (size_t offset = split_; offset + window + 1 <= text_.size() && examples < max_examples;
       offset += window, ++examples) {
    AppendWindow(offset, batch);
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
