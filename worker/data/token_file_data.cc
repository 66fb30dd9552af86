#include "worker/data/token_file_data.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/input_limits.h"
#include "common/rng.h"
#include "common/status_macros.h"

namespace shardline::worker::data {

namespace {

// The largest little-endian id of `width` bytes in `file`, read in chunks,
// looking at `access` before each.
absl::StatusOr<uint32_t> LargestId(const DataFile* file, int width, const DataAccess& access, absl::Time start) {
  if (file == nullptr) return 0;
  constexpr uint64_t kChunkBytes = uint64_t{8} << 20;  // a multiple of every width
  std::vector<unsigned char> chunk;
  uint32_t largest = 0;
  for (uint64_t offset = 0; offset < file->size(); offset += kChunkBytes) {
    RETURN_IF_ERROR(access.Check(start));
    chunk.resize(static_cast<size_t>(std::min(kChunkBytes, file->size() - offset)));
    RETURN_IF_ERROR(file->ReadAt(offset, absl::MakeSpan(chunk)));
    const unsigned char* p = chunk.data();
    const size_t n = chunk.size() / static_cast<size_t>(width);
    if (width == 2) {
      uint16_t top = 0;
      for (size_t i = 0; i < n; ++i) top = std::max<uint16_t>(top, static_cast<uint16_t>(p[2 * i] | p[2 * i + 1] << 8));
      largest = std::max<uint32_t>(largest, top);
    } else {
      for (size_t i = 0; i < n; ++i) {
        const unsigned char* q = p + 4 * i;
        largest = std::max(largest, static_cast<uint32_t>(q[0]) | static_cast<uint32_t>(q[1]) << 8 |
                                        static_cast<uint32_t>(q[2]) << 16 | static_cast<uint32_t>(q[3]) << 24);
      }
    }
  }
  return largest;
}

// LargestId, remembered by file identity (DataFile::identity) and width
// for this process: a worker that starts a job's stage 0 again (a replan,
// a failover) scans each version of a file once. At most kMemoFiles files;
// then it starts over.
absl::Mutex memo_mu;
absl::flat_hash_map<std::string, uint32_t>* memo ABSL_GUARDED_BY(memo_mu) = nullptr;
int64_t scans ABSL_GUARDED_BY(memo_mu) = 0;

absl::StatusOr<uint32_t> MemoizedLargestId(const DataFile* file, int width, const DataAccess& access,
                                           absl::Time start) {
  if (file == nullptr) return 0;
  constexpr size_t kMemoFiles = 64;
  const std::string key = absl::StrCat(file->identity(), "/", width);
  {
    absl::MutexLock lock(&memo_mu);
    if (memo == nullptr) memo = new absl::flat_hash_map<std::string, uint32_t>();
    if (auto it = memo->find(key); it != memo->end()) return it->second;
  }
  ASSIGN_OR_RETURN(const uint32_t largest, LargestId(file, width, access, start));
  absl::MutexLock lock(&memo_mu);
  ++scans;
  if (memo->size() >= kMemoFiles) memo->clear();
  (*memo)[key] = largest;
  return largest;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenFileData>> TokenFileData::Load(const TokenFiles& files, int64_t context,
                                                                   uint64_t seed, const DataAccess& access) {
  const absl::Time start = absl::Now();
  const int width = files.token_bytes;
  if (width != 1 && width != 2 && width != 4) {
    return absl::InvalidArgumentError(absl::StrCat("data.token_bytes is ", width, ", must be 2 or 4"));
  }
  std::unique_ptr<TokenFileData> data(new TokenFileData(width, context, seed));
  // Opens one file of whole token ids.
  auto open = [&](const std::string& field, const std::string& path) -> absl::StatusOr<std::unique_ptr<DataFile>> {
    ASSIGN_OR_RETURN(std::unique_ptr<DataFile> file, DataFile::Open(path, access));
    const uint64_t size = file->size();
    if (size == 0) return absl::InvalidArgumentError(absl::StrCat(field, " ", common::Quote(path), " is empty"));
    if (size % static_cast<uint64_t>(width) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, " ", common::Quote(path), " has ", size,
                                                     " bytes: not a whole number of ", width, "-byte token ids"));
    }
    return file;
  };
  ASSIGN_OR_RETURN(data->file_, open("data.path", files.path));
  const size_t tokens = static_cast<size_t>(data->file_->size()) / static_cast<size_t>(width);
  const size_t window = static_cast<size_t>(context) + 1;
  if (files.val_path.empty()) {
    const size_t split = static_cast<size_t>(static_cast<double>(tokens) * (1.0 - files.val_fraction));
    if (split < window || tokens - split < window) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.path ", common::Quote(files.path), " has ", tokens, " tokens; with data.val_fraction ",
          files.val_fraction, " each part needs at least model.context + 1 = ", window));
    }
    data->train_ = {data->file_.get(), 0, split};
    data->val_ = {data->file_.get(), split, tokens};
  } else {
    ASSIGN_OR_RETURN(data->val_file_, open("data.val_path", files.val_path));
    const size_t val_tokens = static_cast<size_t>(data->val_file_->size()) / static_cast<size_t>(width);
    if (tokens < window || val_tokens < window) {
      return absl::InvalidArgumentError(absl::StrCat("data.path has ", tokens, " tokens and data.val_path ",
                                                     val_tokens, ": each needs at least model.context + 1 = ",
                                                     window));
    }
    data->train_ = {data->file_.get(), 0, tokens};
    data->val_ = {data->val_file_.get(), 0, val_tokens};
  }
  if (width > 1) {
    ASSIGN_OR_RETURN(const uint32_t largest, MemoizedLargestId(data->file_.get(), width, access, start));
    ASSIGN_OR_RETURN(const uint32_t largest_val, MemoizedLargestId(data->val_file_.get(), width, access, start));
    data->vocab_needed_ = 1 + static_cast<int64_t>(std::max(largest, largest_val));
  }
  return data;
}

int64_t TokenFileData::largest_id_scans() {
  absl::MutexLock lock(&memo_mu);
  return scans;
}

absl::Status TokenFileData::AppendWindow(const Part& part, size_t offset, std::vector<unsigned char>& bytes,
                                         Batch& batch) const {
  // The window's tokens and the one after its last (the last target).
  const size_t width = static_cast<size_t>(token_bytes_);
  bytes.resize((static_cast<size_t>(context_) + 1) * width);
  RETURN_IF_ERROR(part.file->ReadAt(offset * width, absl::MakeSpan(bytes)));
  auto token = [&](size_t i) {
    uint32_t id = 0;
    for (size_t b = width; b-- > 0;) id = (id << 8) | bytes[i * width + b];
    return static_cast<int32_t>(id);
  };
  for (int64_t j = 0; j < context_; ++j) {
    batch.ids.push_back(token(static_cast<size_t>(j)));
    batch.targets.push_back(token(static_cast<size_t>(j) + 1));
  }
  return absl::OkStatus();
}

absl::StatusOr<Batch> TokenFileData::TrainBatch(int64_t step, int micro_batch, int64_t sequences) const {
  Batch batch;
  batch.batch = sequences;
  batch.t = context_;
  batch.ids.reserve(static_cast<size_t>(sequences * context_));
  batch.targets.reserve(static_cast<size_t>(sequences * context_));
  std::vector<unsigned char> bytes;
  // Window starts 0 .. n - context - 1 of the training tokens.
  const uint64_t starts = train_tokens() - static_cast<size_t>(context_);
  for (int64_t s = 0; s < sequences; ++s) {
    // Keyed by the place in the global batch: any micro-batch split gives
    // the same global batch.
    const uint64_t index = static_cast<uint64_t>(micro_batch * sequences + s);
    common::Rng rng(common::MixKey(seed_, 0x7e47, static_cast<uint64_t>(step), index));
    RETURN_IF_ERROR(AppendWindow(train_, train_.begin + rng.Uniform(starts), bytes, batch));
  }
  return batch;
}

absl::StatusOr<EvalSet> TokenFileData::MakeEvalSet(int max_examples, int64_t sequences_per_batch) const {
  EvalSet set;
  set.kind = EvalSet::Kind::kLoss;
  const size_t window = static_cast<size_t>(context_);
  Batch batch;
  std::vector<unsigned char> bytes;
  int examples = 0;
  for (size_t offset = val_.begin; offset + window + 1 <= val_.end && examples < max_examples;
       offset += window, ++examples) {
    RETURN_IF_ERROR(AppendWindow(val_, offset, bytes, batch));
    if (++batch.batch == std::max<int64_t>(1, sequences_per_batch)) {
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
