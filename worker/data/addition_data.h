// AdditionData: sequences "37+85=221." over a 16-token vocabulary, where the
// answer (here 122) is written least-significant digit first, zero-padded to
// digits+1 digits, and '.' ends the sequence. Operands are zero-padded to
// `digits`. Only the answer digits and the end token are scored. A fixed
// fraction of all operand pairs, chosen from the seed, is held out: training
// never sees it and evaluation uses only it. Its evaluation is exact match:
// the held-out sequences with their answer digits (not the end) as targets.
//
// Tokens: 0-9 digits, 10 '+', 11 '=', 12 '.', 13 padding (unused).
#ifndef SHARDLINE_WORKER_DATA_ADDITION_DATA_H_
#define SHARDLINE_WORKER_DATA_ADDITION_DATA_H_

#include <string>

#include "worker/data/data_source.h"

namespace shardline::worker::data {

class AdditionData final : public DataSource {
 public:
  static constexpr int32_t kPlus = 10, kEquals = 11, kEnd = 12;
  static constexpr int64_t kVocab = 14;

  AdditionData(int digits, double holdout_fraction, uint64_t seed);

  int64_t sequence_length() const override { return 3 * digits_ + 3; }
  int64_t vocab_needed() const override { return kVocab; }
  absl::StatusOr<Batch> TrainBatch(int64_t step, int micro_batch, int64_t sequences) const override;
  // The answer digits and the end of each sequence.
  int64_t TrainTargets(int64_t sequences) const override {
    return sequences * (sequence_length() - (2 * digits_ + 1));
  }
  absl::StatusOr<EvalSet> MakeEvalSet(int max_examples, int64_t sequences_per_batch) const override;

  bool IsHeldOut(int64_t a, int64_t b) const;
  // The full token sequence of a + b (3·digits + 4 tokens).
  std::vector<int32_t> Encode(int64_t a, int64_t b) const;
  // "37+85=221." for printing.
  static std::string Render(const std::vector<int32_t>& tokens);
  int64_t operand_limit() const { return limit_; }

 private:
  // Appends a + b to `batch` (whose t is set), scoring the answer digits and,
  // with `score_end`, the end token.
  void Append(int64_t a, int64_t b, bool score_end, Batch& batch) const;

  const int digits_;
  const double holdout_fraction_;
  const uint64_t seed_;
  const int64_t limit_;  // 10^digits
};

}  // namespace shardline::worker::data

#endif  // SHARDLINE_WORKER_DATA_ADDITION_DATA_H_
