// DataSource produces training batches as a pure function of
// (seed, step, micro-batch): the same call gives the same tokens on every
// stage, process and run (design brief §4). Each sequence is keyed by its
// place in the global batch (micro_batch · sequences + i), so the global
// batch of a step does not depend on how it is split into micro-batches. It also describes its held-out
// evaluation. Implementations: AdditionData, TokenFileData; create one with
// CreateDataSource(). Thread-safe: every method is const and pure.
#ifndef SHARDLINE_WORKER_DATA_DATA_SOURCE_H_
#define SHARDLINE_WORKER_DATA_DATA_SOURCE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/data/data_file.h"
#include "shardline/v1/job.pb.h"

namespace shardline::worker::data {

// A [batch × t] block of token ids and next-token targets (< 0: not scored).
struct Batch {
  int64_t batch = 0;
  int64_t t = 0;
  std::vector<int32_t> ids;
  std::vector<int32_t> targets;
  int64_t target_count() const;  // targets ≥ 0
};

// What evaluation means for a data set: held-out batches scored by
//  kLoss: the mean loss over their targets;
//  kExactMatch: the fraction of their sequences whose every target is the
//    model's most likely next token (the first of the largest logits) given
//    the true tokens before it: at the answer digits of a prompt, the answer
//    greedy decoding writes, found in one forward pass.
struct EvalSet {
  enum class Kind { kExactMatch, kLoss };
  Kind kind = Kind::kLoss;
  std::vector<Batch> batches;
};

// Of the `batch` sequences of `t` tokens whose targets are `targets`, those
// whose every target (≥ 0) is its row's most likely class (`argmax`:
// [batch·t], the first of each row's largest logits); a sequence without
// targets is not counted. The caller checks the sizes (CHECKed here).
int64_t ExactMatches(absl::Span<const int32_t> targets, int64_t batch, int64_t t, absl::Span<const int32_t> argmax);

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Tokens per training sequence (t of every training batch).
  virtual int64_t sequence_length() const = 0;
  // Smallest vocabulary that holds every token this source emits.
  virtual int64_t vocab_needed() const = 0;
  // `sequences` sequences for micro-batch `micro_batch` of step `step`;
  // DATA_LOSS when a data file no longer holds them (data_file.h).
  virtual absl::StatusOr<Batch> TrainBatch(int64_t step, int micro_batch, int64_t sequences) const = 0;
  // The scored targets of any such batch (TrainBatch(...).target_count(),
  // the same for every step and micro-batch), without making it: a
  // data-parallel replica counts the whole global batch's this way.
  virtual int64_t TrainTargets(int64_t sequences) const = 0;
  // Up to `max_examples` held-out sequences, in batches of
  // `sequences_per_batch` (the last maybe fewer); DATA_LOSS as TrainBatch.
  virtual absl::StatusOr<EvalSet> MakeEvalSet(int max_examples, int64_t sequences_per_batch) const = 0;
};

// Builds the source the spec names and checks it against the model
// (vocabulary, context). Errors name the spec field.
// A file it reads (data.path) is read under `access` (data_file.h).
absl::StatusOr<std::unique_ptr<DataSource>> CreateDataSource(const shardline::v1::JobSpec& spec,
                                                             const DataAccess& access = {});

}  // namespace shardline::worker::data

#endif  // SHARDLINE_WORKER_DATA_DATA_SOURCE_H_
