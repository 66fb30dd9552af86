// PipelineStage's validation pass: forward only, batch after batch, each
// stage discarding what a backward pass would have needed.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/eval_shares.h"
#include "common/status_macros.h"
#include "worker/runtime/pipeline_stage.h"

namespace shardline::worker::runtime {

namespace {

constexpr int kEvalSlot = 0;  // the step's slots are all free by then: one for every batch
constexpr int kMaxEvalBatches = 1 << 20;

}  // namespace

absl::StatusOr<StageEvalResult> PipelineStage::Evaluate(int64_t step) {
  absl::StatusOr<StageEvalResult> result = EvaluateImpl(step);
  last_step_failed_ = !result.ok();
  if (!result.ok()) runtime_.Discard(kEvalSlot);
  return result;
}

absl::StatusOr<StageEvalResult> PipelineStage::EvaluateImpl(int64_t step) {
  using Kind = transport::StageMessage::Kind;
  const int64_t id = -step;  // the pass's messages
  StageEvalResult result;
  float loss_scale = 0.0f;
  int batches = 0;             // this replica's share of the pass
  std::vector<int64_t> share;  // stage 0: which of the pass's batches
  if (runtime_.is_first()) {
    if (eval_set_ == nullptr) {
      const int64_t per = options_.global_batch / (int64_t{options_.replicas} * options_.micro_batches);
      ASSIGN_OR_RETURN(data::EvalSet set, data_->MakeEvalSet(options_.eval_examples, per));
      eval_set_ = std::make_unique<data::EvalSet>(std::move(set));
    }
    if ((eval_set_->kind == data::EvalSet::Kind::kExactMatch) != options_.eval_exact_match) {
      return absl::FailedPreconditionError(
          absl::StrCat("the data's validation is ", options_.eval_exact_match ? "not " : "",
                       "exact match, but the stage was set up for ", options_.eval_exact_match ? "it" : "a loss"));
    }
    int64_t targets = 0;
    for (const data::Batch& b : eval_set_->batches) targets += b.target_count();
    if (targets == 0 || eval_set_->batches.empty()) return absl::FailedPreconditionError("no validation targets");
    loss_scale = static_cast<float>(1.0 / static_cast<double>(targets));
    share = common::EvalShare(static_cast<int64_t>(eval_set_->batches.size()), options_.replica, options_.replicas);
    batches = static_cast<int>(share.size());
  }
  for (int i = 0; i == 0 || i < batches; ++i) {
    ReleaseUploads(/*wait=*/false);
    ShardRuntime::Inputs in;
    transport::StageMessage received;
    if (runtime_.is_first()) {
      if (batches == 0) {
        RETURN_IF_ERROR(PassOnEmptyShare(id));
        break;
      }
      TakeBatch(eval_set_->batches[static_cast<size_t>(share[static_cast<size_t>(i)])], loss_scale, in, received);
      received.eval_batches = batches;
    } else {
      Doing(step, "receive", i,
            absl::StrCat("waits for validation batch ", i, " after step ", step, " from stage ", options_.stage - 1));
      ASSIGN_OR_RETURN(received, Expect(link_.ReceiveFromPrevious(), Kind::kActivation, id, i));
      if (i == 0 && received.eval_batches == 0 && received.batch == 0) {
        RETURN_IF_ERROR(PassOnEmptyShare(id));
        break;
      }
      if (i == 0) batches = received.eval_batches;
      if (batches < 1 || batches > kMaxEvalBatches || received.eval_batches != batches) {
        return absl::FailedPreconditionError(absl::StrCat("stage ", options_.stage, " got validation batch ", i,
                                                          " of ", received.eval_batches, " where ", batches,
                                                          " were announced"));
      }
      TakeActivation(received, in);
    }
    if (runtime_.is_last()) in.targets = received.targets;
    result.windows += in.batch;
    transport::HostBuffer output;
    if (!runtime_.is_last()) {
      output = link_.OutgoingBuffer(Kind::kActivation, static_cast<size_t>(runtime_.OutputElements(in.batch * in.t)));
    } else if (options_.eval_exact_match) {
      eval_argmax_.resize(static_cast<size_t>(in.batch * in.t));
      in.argmax = absl::MakeSpan(eval_argmax_);
    }
    Doing(step, "forward", i, absl::StrCat("validation forward of batch ", i, " after step ", step));
    ASSIGN_OR_RETURN(ShardRuntime::EdgeTransfers edge, runtime_.ForwardAsync(kEvalSlot, in, output.span()));
    // The slot's host memory takes the next batch's tokens: this batch's
    // must be on the device first (a short wait; the pass itself runs on).
    RETURN_IF_ERROR(edge.inputs_read.Wait());
    if (runtime_.is_last()) {
      absl::StatusOr<double> loss = runtime_.Loss(kEvalSlot);
      runtime_.Discard(kEvalSlot);
      RETURN_IF_ERROR(loss.status());
      result.loss += *loss;
      result.losses.push_back(*loss);
      if (options_.eval_exact_match) result.matches += data::ExactMatches(in.targets, in.batch, in.t, in.argmax);
      KeepUntilRead(std::move(edge.inputs_read), std::move(received));
      continue;
    }
    runtime_.Discard(kEvalSlot);
    transport::StageMessage out = Activation(id, i, in, std::move(output), received);
    KeepUntilRead(std::move(edge.inputs_read), std::move(received));
    Doing(step, "send", i, absl::StrCat("sends validation batch ", i, " to stage ", options_.stage + 1));
    RETURN_IF_ERROR(sender_.Send(StageSender::Direction::kNext, std::move(out), std::move(edge.output_written)));
  }
  ReleaseUploads(/*wait=*/true);
  Doing(step, "flush", -1, "waits for its last validation sends to go out");
  RETURN_IF_ERROR(sender_.Flush());
  (void)trace_.Take();  // the pass's spans are not the next step's
  return result;
}

absl::Status PipelineStage::PassOnEmptyShare(int64_t id) {
  if (runtime_.is_last()) return absl::OkStatus();
  transport::StageMessage none;  // no batch: 0 × 0 tokens, eval_batches 0
  none.kind = transport::StageMessage::Kind::kActivation;
  none.step = id;
  none.dtype = options_.wire;
  return sender_.Send(StageSender::Direction::kNext, std::move(none));
}

}  // namespace shardline::worker::runtime
