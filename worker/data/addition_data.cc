#include "worker/data/addition_data.h"

#include <algorithm>

#include "common/rng.h"

namespace shardline::worker::data {

AdditionData::AdditionData(int digits, double holdout_fraction, uint64_t seed)
    : digits_(digits), holdout_fraction_(holdout_fraction), seed_(seed), limit_([digits] {
        int64_t l = 1;
        for (int i = 0; i < digits; ++i) l *= 10;
        return l;
      }()) {}

bool AdditionData::IsHeldOut(int64_t a, int64_t b) const {
  common::Rng rng(common::MixKey(seed_, 0x4e1d0u, static_cast<uint64_t>(a * limit_ + b)));
  return rng.UniformDouble() < holdout_fraction_;
}

std::vector<int32_t> AdditionData::Encode(int64_t a, int64_t b) const {
  std::vector<int32_t> tokens;
  auto digits_of = [&](int64_t value, int count, bool reversed) {
    std::vector<int32_t> out(count);
    for (int i = 0; i < count; ++i) {
      out[reversed ? i : count - 1 - i] = static_cast<int32_t>(value % 10);
      value /= 10;
    }
    tokens.insert(tokens.end(), out.begin(), out.end());
  };
  digits_of(a, digits_, false);
  tokens.push_back(kPlus);
  digits_of(b, digits_, false);
  tokens.push_back(kEquals);
  digits_of(a + b, digits_ + 1, true);
  tokens.push_back(kEnd);
  return tokens;
}

std::string AdditionData::Render(const std::vector<int32_t>& tokens) {
  std::string out;
  for (int32_t t : tokens) {
    if (t >= 0 && t <= 9) {
      out += static_cast<char>('0' + t);
    } else {
      out += t == kPlus ? '+' : t == kEquals ? '=' : t == kEnd ? '.' : '?';
    }
  }
  return out;
}

void AdditionData::Append(int64_t a, int64_t b, bool score_end, Batch& batch) const {
  const std::vector<int32_t> tokens = Encode(a, b);
  const int64_t first_scored = 2 * digits_ + 1;  // target index of the first answer digit
  const int64_t last_scored = score_end ? batch.t - 1 : batch.t - 2;
  for (int64_t j = 0; j < batch.t; ++j) {
    batch.ids.push_back(tokens[j]);
    batch.targets.push_back(j >= first_scored && j <= last_scored ? tokens[j + 1] : -1);
  }
  ++batch.batch;
}

absl::StatusOr<Batch> AdditionData::TrainBatch(int64_t step, int micro_batch, int64_t sequences) const {
  Batch batch;
  batch.t = sequence_length();
  for (int64_t s = 0; s < sequences; ++s) {
    // Keyed by the sequence's place in the global batch, so the global batch
    // is the same however it is split into micro-batches.
    const uint64_t index = static_cast<uint64_t>(micro_batch * sequences + s);
    common::Rng rng(common::MixKey(seed_, 0xda7a, static_cast<uint64_t>(step), index));
    int64_t a, b;
    do {
      a = static_cast<int64_t>(rng.Uniform(limit_));
      b = static_cast<int64_t>(rng.Uniform(limit_));
    } while (IsHeldOut(a, b));
    Append(a, b, /*score_end=*/true, batch);
  }
  return batch;
}

absl::StatusOr<EvalSet> AdditionData::MakeEvalSet(int max_examples, int64_t sequences_per_batch) const {
  // The held-out pairs: all of them when there are few operands (then a
  // seeded subset if there are too many), else a seeded sample.
  std::vector<std::pair<int64_t, int64_t>> pairs;
  common::Rng rng(common::MixKey(seed_, 0xe7a1));
  if (limit_ * limit_ <= 4'000'000) {
    for (int64_t a = 0; a < limit_; ++a) {
      for (int64_t b = 0; b < limit_; ++b) {
        if (IsHeldOut(a, b)) pairs.emplace_back(a, b);
      }
    }
    for (size_t i = pairs.size(); i > 1; --i) std::swap(pairs[i - 1], pairs[rng.Uniform(i)]);
    if (static_cast<int>(pairs.size()) > max_examples) pairs.resize(max_examples);
  } else {
    while (static_cast<int>(pairs.size()) < max_examples) {
      const int64_t a = static_cast<int64_t>(rng.Uniform(limit_));
      const int64_t b = static_cast<int64_t>(rng.Uniform(limit_));
      if (IsHeldOut(a, b)) pairs.emplace_back(a, b);
    }
  }
  EvalSet set;
  set.kind = EvalSet::Kind::kExactMatch;
  const int64_t per = std::max<int64_t>(1, sequences_per_batch);
  for (const auto& [a, b] : pairs) {
    if (set.batches.empty() || set.batches.back().batch == per) {
      set.batches.emplace_back();
      set.batches.back().t = sequence_length();
    }
    Append(a, b, /*score_end=*/false, set.batches.back());
  }
  return set;
}

}  // namespace shardline::worker::data
