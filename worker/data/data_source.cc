#include "worker/data/data_source.h"

#include "absl/strings/str_cat.h"
#include "common/input_limits.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/data/addition_data.h"
#include "worker/data/token_file_data.h"

namespace shardline::worker::data {

int64_t Batch::target_count() const {
  int64_t n = 0;
  for (int32_t t : targets) n += t >= 0;
  return n;
}

int64_t ExactMatches(absl::Span<const int32_t> targets, int64_t batch, int64_t t, absl::Span<const int32_t> argmax) {
  CHECK_EQ(static_cast<int64_t>(targets.size()), batch * t);
  CHECK_EQ(targets.size(), argmax.size());
  int64_t matches = 0;
  for (int64_t s = 0; s < batch; ++s) {
    bool scored = false, right = true;
    for (int64_t j = 0; j < t && right; ++j) {
      const size_t row = static_cast<size_t>(s * t + j);
      if (targets[row] < 0) continue;
      scored = true;
      right = argmax[row] == targets[row];
    }
    matches += scored && right;
  }
  return matches;
}

absl::StatusOr<std::unique_ptr<DataSource>> CreateDataSource(const shardline::v1::JobSpec& spec,
                                                             const DataAccess& access) {
  const auto& d = spec.data();
  std::unique_ptr<DataSource> source;
  if (d.kind() == "addition") {
    source = std::make_unique<AdditionData>(d.digits(), d.holdout_fraction(), spec.train().seed());
  } else if (d.kind() == "text_bytes" || d.kind() == "tokens") {
    const TokenFiles files{d.path(), d.val_path(), d.val_fraction(), d.kind() == "tokens" ? d.token_bytes() : 1};
    ASSIGN_OR_RETURN(source, TokenFileData::Load(files, spec.model().context(), spec.train().seed(), access));
  } else {
    return absl::InvalidArgumentError(absl::StrCat("data.kind: unknown ", common::Quote(d.kind())));
  }
  if (spec.model().vocab_size() < source->vocab_needed()) {
    return absl::InvalidArgumentError(absl::StrCat("model.vocab_size is ", spec.model().vocab_size(),
                                                   " but data.kind '", d.kind(), "' needs ", source->vocab_needed(),
                                                   " (its token ids go up to ", source->vocab_needed() - 1, ")"));
  }
  if (spec.model().context() < source->sequence_length()) {
    return absl::InvalidArgumentError(absl::StrCat("model.context is ", spec.model().context(), " but data.kind '",
                                                   d.kind(), "' needs sequences of ", source->sequence_length(),
                                                   " tokens"));
  }
  return source;
}

}  // namespace shardline::worker::data
