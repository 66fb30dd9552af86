// PipelineStage's gradient norm: the stage's squared-norm terms (gathered
// from a ZeRO-1 group's owners, added over a tensor-parallel group) summed
// along the pipeline in parameter order, so every cut gives the trainer's
// bits.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/runtime/norm_pieces.h"
#include "worker/runtime/pipeline_stage.h"

namespace shardline::worker::runtime {

using Kind = transport::StageMessage::Kind;

absl::StatusOr<double> PipelineStage::ReduceGradNorm(int64_t step) {
  // This stage's parts first (its device works while the earlier stages
  // finish their backward passes).
  ASSIGN_OR_RETURN(std::vector<double> own, sharded() ? buckets_->GatheredSumsOfSquares()
                                                      : runtime_.GradSumsOfSquares());
  if (tensor_group_ != nullptr) {
    ASSIGN_OR_RETURN(own, TensorGroupNormTerms(own));
  }
  // The running sum travels 0 → p−1 and each stage adds its parameters' parts
  // one by one, as the trainer adds every parameter's: the same bits for any
  // cut. The total comes back p−1 → 0.
  double partial = 0.0;
  if (!runtime_.is_first()) {
    Doing(step, "norm", -1, absl::StrCat("waits for the gradient norm's partial sum from stage ", options_.stage - 1));
    ASSIGN_OR_RETURN(transport::StageMessage in, Expect(link_.ReceiveFromPrevious(), Kind::kNormPartial, step, 0));
    partial = in.norm;
  }
  for (double part : own) partial += part;
  double total = partial;
  if (!runtime_.is_last()) {
    transport::StageMessage out;
    out.kind = Kind::kNormPartial;
    out.step = step;
    out.norm = partial;
    RETURN_IF_ERROR(sender_.Send(StageSender::Direction::kNext, std::move(out)));
    Doing(step, "norm", -1, absl::StrCat("waits for the gradient norm's total from stage ", options_.stage + 1));
    ASSIGN_OR_RETURN(transport::StageMessage back, Expect(link_.ReceiveFromNext(), Kind::kNormTotal, step, 0));
    total = back.norm;
  }
  if (!runtime_.is_first()) {
    transport::StageMessage out;
    out.kind = Kind::kNormTotal;
    out.step = step;
    out.norm = total;
    RETURN_IF_ERROR(sender_.Send(StageSender::Direction::kPrevious, std::move(out)));
  }
  return total;
}

absl::StatusOr<std::vector<double>> PipelineStage::TensorGroupNormTerms(const std::vector<double>& own) {
  double partial = 0.0;
  size_t term = 0;
  for (const nn::Parameter* p : runtime_.parameters()) {
    const size_t pieces = NormPieceCount(p->count());
    for (size_t i = 0; i < pieces && term < own.size(); ++i, ++term) {
      if (!p->slice.whole() || options_.tensor_rank == 0) partial += own[term];
    }
  }
  if (term != own.size()) return absl::InternalError("the norm terms do not match the parameters' pieces");
  // Chunk r of 2·t floats: rank r's partial, as a double.
  const int t = tensor_group_->size();
  std::vector<float> gathered(2 * static_cast<size_t>(t), 0.0f);
  std::memcpy(gathered.data() + 2 * options_.tensor_rank, &partial, sizeof(double));
  RETURN_IF_ERROR(tensor_group_->AllGatherHost(absl::MakeSpan(gathered)));
  std::vector<double> terms(static_cast<size_t>(t));
  for (int r = 0; r < t; ++r) std::memcpy(&terms[r], gathered.data() + 2 * r, sizeof(double));
  return terms;
}

}  // namespace shardline::worker::runtime
