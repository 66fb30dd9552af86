#include "common/job_spec.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/checked_int.h"
#include "common/file_util.h"
#include "common/input_limits.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace shardline::common {
namespace {

using shardline::v1::JobSpec;

// VocabParallel's default: the fewest vocabulary rows per rank worth a split.
constexpr int64_t kVocabRowsPerRank = 64;

absl::Status FieldError(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("job spec: ", field, " ", problem));
}

template <typename T>
absl::Status CheckRange(absl::string_view field, T value, T lo, T hi) {
  if (!(value >= lo && value <= hi)) {
    return FieldError(field, absl::StrCat("is ", value, ", must be in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const shardline::v1::ModelSpec& m) {
  if (m.kind() != "gpt") return FieldError("model.kind", absl::StrCat("is ", Quote(m.kind()), ", must be 'gpt'"));
  RETURN_IF_ERROR(CheckRange("model.vocab_size", m.vocab_size(), 2, 1 << 20));
  RETURN_IF_ERROR(CheckRange("model.context", m.context(), 2, 1 << 16));
  RETURN_IF_ERROR(CheckRange("model.d_model", m.d_model(), 1, 1 << 16));
  RETURN_IF_ERROR(CheckRange("model.n_heads", m.n_heads(), 1, 1 << 10));
  RETURN_IF_ERROR(CheckRange("model.n_layers", m.n_layers(), 1, 1 << 10));
  if (m.d_model() % m.n_heads() != 0) {
    return FieldError("model.n_heads", absl::StrCat("(", m.n_heads(), ") does not divide model.d_model (",
                                                    m.d_model(), ")"));
  }
  return absl::OkStatus();
}

// A data file's path: given, bounded, no NUL.
absl::Status CheckPath(absl::string_view field, const std::string& path, const std::string& kind) {
  if (path.empty()) return FieldError(field, absl::StrCat("is required for data.kind ", kind));
  RETURN_IF_ERROR(CheckLength(absl::StrCat("job spec: ", field), path, kMaxPathBytes));
  if (path.find('\0') != std::string::npos) return FieldError(field, "holds a NUL byte");
  return absl::OkStatus();
}

absl::Status ValidateData(shardline::v1::DataSpec& d) {
  if (d.kind() == "addition") {
    RETURN_IF_ERROR(CheckRange("data.digits", d.digits(), 1, 4));
    if (!d.path().empty()) return FieldError("data.path", "is not used by data.kind 'addition'");
    if (!d.has_holdout_fraction()) d.set_holdout_fraction(0.1);
    RETURN_IF_ERROR(CheckRange("data.holdout_fraction", d.holdout_fraction(), 0.0, 0.5));
    if (!d.val_path().empty()) return FieldError("data.val_path", "is not used by data.kind 'addition'");
    if (d.token_bytes() != 0) return FieldError("data.token_bytes", "is not used by data.kind 'addition'");
  } else if (d.kind() == "text_bytes" || d.kind() == "tokens") {
    const std::string kind = Quote(d.kind());
    RETURN_IF_ERROR(CheckPath("data.path", d.path(), kind));
    if (d.val_path().empty()) {
      if (!d.has_val_fraction()) d.set_val_fraction(0.1);
      RETURN_IF_ERROR(CheckRange("data.val_fraction", d.val_fraction(), 0.01, 0.5));
    } else {
      RETURN_IF_ERROR(CheckPath("data.val_path", d.val_path(), kind));
      if (d.has_val_fraction()) {
        return FieldError("data.val_fraction", "and data.val_path both say where validation data is: give one");
      }
    }
    if (d.kind() == "text_bytes" && d.token_bytes() != 0) {
      return FieldError("data.token_bytes", "is not used by data.kind 'text_bytes' (one byte, one token)");
    }
    if (d.kind() == "tokens") {
      if (d.token_bytes() == 0) d.set_token_bytes(2);
      if (d.token_bytes() != 2 && d.token_bytes() != 4) {
        return FieldError("data.token_bytes", absl::StrCat("is ", d.token_bytes(), ", must be 2 or 4"));
      }
    }
  } else {
    return FieldError("data.kind",
                      absl::StrCat("is ", Quote(d.kind()), ", must be 'addition', 'text_bytes' or 'tokens'"));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(shardline::v1::OptimizerSpec& o, int steps) {
  const bool adamw = o.kind() == "adamw";
  if (!adamw && o.kind() != "sgd") {
    return FieldError("train.optimizer.kind", absl::StrCat("is ", Quote(o.kind()), ", must be 'adamw' or 'sgd'"));
  }
  RETURN_IF_ERROR(CheckRange("train.optimizer.lr", o.lr(), 1e-9, 10.0));
  RETURN_IF_ERROR(CheckRange("train.optimizer.warmup_steps", o.warmup_steps(), 0, steps));
  if (!o.has_weight_decay()) o.set_weight_decay(adamw ? 0.1 : 0.0);
  if (!o.has_min_lr_ratio()) o.set_min_lr_ratio(0.1);
  if (!o.has_grad_clip()) o.set_grad_clip(0.0);
  RETURN_IF_ERROR(CheckRange("train.optimizer.weight_decay", o.weight_decay(), 0.0, 10.0));
  RETURN_IF_ERROR(CheckRange("train.optimizer.min_lr_ratio", o.min_lr_ratio(), 0.0, 1.0));
  RETURN_IF_ERROR(CheckRange("train.optimizer.grad_clip", o.grad_clip(), 0.0, 1e6));
  if (adamw) {
    if (o.has_momentum()) return FieldError("train.optimizer.momentum", "is for 'sgd', not 'adamw'");
    if (!o.has_beta1()) o.set_beta1(0.9);
    if (!o.has_beta2()) o.set_beta2(0.95);
    if (!o.has_eps()) o.set_eps(1e-8);
    RETURN_IF_ERROR(CheckRange("train.optimizer.beta1", o.beta1(), 0.0, 0.9999));
    RETURN_IF_ERROR(CheckRange("train.optimizer.beta2", o.beta2(), 0.0, 0.99999));
    RETURN_IF_ERROR(CheckRange("train.optimizer.eps", o.eps(), 1e-12, 1.0));
  } else {
    for (auto [name, present] : {std::pair{"beta1", o.has_beta1()}, std::pair{"beta2", o.has_beta2()},
                                 std::pair{"eps", o.has_eps()}}) {
      if (present) return FieldError(absl::StrCat("train.optimizer.", name), "is for 'adamw', not 'sgd'");
    }
    if (!o.has_momentum()) o.set_momentum(0.9);
    RETURN_IF_ERROR(CheckRange("train.optimizer.momentum", o.momentum(), 0.0, 0.9999));
  }
  return absl::OkStatus();
}

absl::Status ValidateTrain(shardline::v1::TrainSpec& t) {
  RETURN_IF_ERROR(CheckRange("train.steps", t.steps(), 1, 100'000'000));
  RETURN_IF_ERROR(CheckRange("train.global_batch", t.global_batch(), 1, 1 << 20));
  if (t.micro_batches() == 0) t.set_micro_batches(1);
  RETURN_IF_ERROR(CheckRange("train.micro_batches", t.micro_batches(), 1, t.global_batch()));
  if (t.global_batch() % t.micro_batches() != 0) {
    return FieldError("train.micro_batches", absl::StrCat("(", t.micro_batches(), ") does not divide train.global_batch (",
                                                          t.global_batch(), ")"));
  }
  if (!t.has_optimizer()) return FieldError("train.optimizer", "is required");
  RETURN_IF_ERROR(ValidateOptimizer(*t.mutable_optimizer(), t.steps()));
  if (!t.has_log_every()) t.set_log_every(10);
  if (!t.has_eval_examples()) t.set_eval_examples(1000);
  RETURN_IF_ERROR(CheckRange("train.log_every", t.log_every(), 1, 1 << 30));
  RETURN_IF_ERROR(CheckRange("train.eval_examples", t.eval_examples(), 1, 1 << 20));
  // Beyond train.steps: the pass after the last step only (a spec shortened
  // for a trial run stays valid).
  RETURN_IF_ERROR(CheckRange("train.eval_every", t.eval_every(), 0, std::numeric_limits<int32_t>::max()));
  if (t.has_early_stopping()) {
    shardline::v1::EarlyStoppingSpec& e = *t.mutable_early_stopping();
    if (!e.has_min_delta()) e.set_min_delta(0.0);
    if (!e.has_monitor()) e.set_monitor("loss");
  }
  const shardline::v1::EarlyStoppingSpec& e = t.early_stopping();
  RETURN_IF_ERROR(CheckRange("train.early_stopping.patience", e.patience(), 0, 1 << 20));
  RETURN_IF_ERROR(CheckRange("train.early_stopping.min_delta", e.min_delta(), 0.0, 1e6));
  if (e.has_monitor() && e.monitor() != "loss" && e.monitor() != "accuracy") {
    return FieldError("train.early_stopping.monitor",
                      absl::StrCat("is ", Quote(e.monitor()), ", must be 'loss' or 'accuracy'"));
  }
  if (e.monitor() == "accuracy" && e.min_delta() >= 1.0) {
    return FieldError("train.early_stopping.min_delta",
                      absl::StrCat("(", e.min_delta(), ") must be below 1 with monitor 'accuracy' ",
                                   "(a fraction: 0.01 is one point)"));
  }
  if (e.patience() > 0 && t.eval_every() == 0) {
    return FieldError("train.early_stopping.patience", "needs validation passes: set train.eval_every");
  }
  return absl::OkStatus();
}

absl::Status ValidateParallel(shardline::v1::ParallelSpec& p, const shardline::v1::ModelSpec& model) {
  if (!p.has_pipeline_stages()) p.set_pipeline_stages(1);
  if (!p.has_schedule()) p.set_schedule("1f1b");
  if (!p.has_data_parallel()) p.set_data_parallel(1);
  if (!p.has_wire_dtype()) p.set_wire_dtype("f32");
  if (!p.has_bucket_mib()) p.set_bucket_mib(25.0);
  if (!p.has_shard_optimizer()) p.set_shard_optimizer(false);
  if (!p.has_tensor_parallel()) p.set_tensor_parallel(1);
  if (!p.has_stage_link_layout()) p.set_stage_link_layout("auto");
  if (!p.has_placement()) p.set_placement("planned");
  RETURN_IF_ERROR(CheckRange("parallel.bucket_mib", p.bucket_mib(), 1.0 / 256, 1024.0));
  const int units = PipelineUnits(model);
  if (p.pipeline_stages() < 1 || p.pipeline_stages() > units) {
    return FieldError("parallel.pipeline_stages",
                      absl::StrCat("is ", p.pipeline_stages(), ", must be in [1, ", units,
                                   "] (the model has ", units, " units: embedding, ", model.n_layers(),
                                   " blocks, head)"));
  }
  if (p.schedule() != "gpipe" && p.schedule() != "1f1b" && p.schedule() != "zb") {
    return FieldError("parallel.schedule",
                      absl::StrCat("is ", Quote(p.schedule()), ", must be 'gpipe', '1f1b' or 'zb'"));
  }
  RETURN_IF_ERROR(CheckRange("parallel.data_parallel", p.data_parallel(), 1, 1024));
  RETURN_IF_ERROR(CheckRange("parallel.tensor_parallel", p.tensor_parallel(), 1, 1024));
  if (model.n_heads() % p.tensor_parallel() != 0 || (4 * model.d_model()) % p.tensor_parallel() != 0) {
    return FieldError("parallel.tensor_parallel",
                      absl::StrCat("is ", p.tensor_parallel(), ", must divide model.n_heads (", model.n_heads(),
                                   ") and the MLP width 4 × model.d_model (", 4 * model.d_model(),
                                   "): each rank holds n_heads/t heads and 4·d_model/t MLP features"));
  }
  if (p.vocab_parallel() && p.tensor_parallel() > 1 && model.vocab_size() % p.tensor_parallel() != 0) {
    return FieldError("parallel.vocab_parallel",
                      absl::StrCat("splits the vocabulary (", model.vocab_size(), ") over tensor_parallel ",
                                   p.tensor_parallel(), " ranks, which must divide it"));
  }
  if (p.stage_link_layout() != "auto" && p.stage_link_layout() != "same_rank" &&
      p.stage_link_layout() != "scatter_gather") {
    return FieldError("parallel.stage_link_layout",
                      absl::StrCat("is ", Quote(p.stage_link_layout()), ", must be 'auto', 'same_rank' or 'scatter_gather'"));
  }
  if (p.placement() != "planned" && p.placement() != "in_order") {
    return FieldError("parallel.placement", absl::StrCat("is ", Quote(p.placement()), ", must be 'planned' or 'in_order'"));
  }
  if (p.wire_dtype() != "f32" && p.wire_dtype() != "bf16" && p.wire_dtype() != "f16" && p.wire_dtype() != "int8" &&
      p.wire_dtype() != "auto") {
    return FieldError("parallel.wire_dtype", absl::StrCat("is ", Quote(p.wire_dtype()),
                                                          ", must be 'f32', 'bf16', 'f16', 'int8' or 'auto'"));
  }
  return absl::OkStatus();
}

// What one micro-batch moves and the model holds, in checked int64: a spec
// whose tensors a stage link cannot carry is refused here, before any
// worker sizes a buffer by it.
absl::Status ValidateSizes(const JobSpec& spec) {
  const auto& m = spec.model();
  const int64_t pipelines_micro_batches = int64_t{spec.parallel().data_parallel()} * spec.train().micro_batches();
  const CheckedInt64 sequences = spec.train().global_batch() / pipelines_micro_batches;
  const CheckedInt64 tokens = sequences * m.context();
  if (tokens.value() > kMaxMicroBatchTokens) {
    return FieldError("train.global_batch",
                      absl::StrCat("/ (data_parallel × micro_batches) × model.context is ", tokens.value(),
                                   " tokens per micro-batch, at most ", kMaxMicroBatchTokens,
                                   ": use more micro_batches"));
  }
  const int64_t stage_micro_batches = int64_t{spec.parallel().pipeline_stages()} * spec.train().micro_batches();
  if (spec.parallel().schedule() == "zb" && stage_micro_batches > kMaxZeroBubbleStageMicroBatches) {
    return FieldError("train.micro_batches",
                      absl::StrCat("× parallel.pipeline_stages is ", stage_micro_batches, ", at most ",
                                   kMaxZeroBubbleStageMicroBatches, " with the 'zb' schedule"));
  }
  const CheckedInt64 activation = tokens * m.d_model();
  if (activation.value() > kMaxTensorElements) {
    return FieldError("train.micro_batches",
                      absl::StrCat("makes a micro-batch's activations ", tokens.value(), " tokens × d_model ",
                                   m.d_model(), " = ", activation.value(), " values, more than the ",
                                   kMaxTensorElements, " a stage link carries: use more micro_batches"));
  }
  return absl::OkStatus();
}

}  // namespace

int PipelineUnits(const shardline::v1::ModelSpec& model) { return model.n_layers() + 2; }

int64_t MicroBatchSequences(const JobSpec& spec) {
  const int64_t micro_batches = std::max<int64_t>(1, spec.train().micro_batches()) *
                                std::max<int64_t>(1, spec.parallel().data_parallel());
  return (spec.train().global_batch() + micro_batches - 1) / micro_batches;
}

bool EvaluatesAfter(const JobSpec& spec, int64_t step) {
  const int every = spec.train().eval_every();
  return every > 0 && (step % every == 0 || step == spec.train().steps());
}

bool StopsEarly(const JobSpec& spec) { return spec.train().early_stopping().patience() > 0; }

bool CheckpointsAfter(const JobSpec& spec, int64_t step) {
  const int every = spec.checkpoint().every_steps();
  return (every > 0 && step % every == 0) || step == spec.train().steps() ||
         (StopsEarly(spec) && EvaluatesAfter(spec, step));
}

bool EvaluatesExactMatch(const JobSpec& spec) { return spec.data().kind() == "addition"; }

bool VocabParallel(const JobSpec& spec) {
  const int64_t t = spec.parallel().tensor_parallel(), vocab = spec.model().vocab_size();
  if (t <= 1) return false;
  if (spec.parallel().has_vocab_parallel()) return spec.parallel().vocab_parallel();
  return vocab % t == 0 && vocab >= kVocabRowsPerRank * t;
}

JobSpec FoldReplicas(const JobSpec& spec, int replicas) {
  JobSpec folded = spec;
  const int d = std::max(1, spec.parallel().data_parallel());
  if (replicas < 1 || d % replicas != 0) return folded;
  folded.mutable_parallel()->set_data_parallel(replicas);
  folded.mutable_train()->set_micro_batches(spec.train().micro_batches() * (d / replicas));
  return folded;
}

absl::Status ValidateJobSpec(JobSpec& spec) {
  if (spec.name().empty()) spec.set_name("job");
  RETURN_IF_ERROR(CheckLength("job spec: name", spec.name(), kMaxNameBytes));
  for (char c : spec.name()) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return FieldError("name", "holds a control character");
  }
  if (!spec.has_model()) return FieldError("model", "is required");
  if (!spec.has_data()) return FieldError("data", "is required");
  if (!spec.has_train()) return FieldError("train", "is required");
  RETURN_IF_ERROR(ValidateModel(spec.model()));
  RETURN_IF_ERROR(ValidateData(*spec.mutable_data()));
  RETURN_IF_ERROR(ValidateTrain(*spec.mutable_train()));
  RETURN_IF_ERROR(ValidateParallel(*spec.mutable_parallel(), spec.model()));
  if (spec.train().early_stopping().monitor() == "accuracy" && !EvaluatesExactMatch(spec)) {
    return FieldError("train.early_stopping.monitor",
                      absl::StrCat("'accuracy' needs exact-match validation (data.kind 'addition'); data.kind ",
                                   Quote(spec.data().kind()), " validates on the loss only"));
  }

  // Each data-parallel replica runs micro_batches micro-batches of the same
  // size: global_batch / (data_parallel · micro_batches) sequences.
  const int64_t pipelines_micro_batches =
      int64_t{spec.parallel().data_parallel()} * spec.train().micro_batches();
  if (spec.train().global_batch() % pipelines_micro_batches != 0) {
    return FieldError("parallel.data_parallel",
                      absl::StrCat("(", spec.parallel().data_parallel(), ") × train.micro_batches (",
                                   spec.train().micro_batches(), ") does not divide train.global_batch (",
                                   spec.train().global_batch(), "): every replica runs micro_batches ",
                                   "micro-batches of global_batch / (data_parallel × micro_batches) sequences"));
  }
  RETURN_IF_ERROR(ValidateSizes(spec));
  // A job id as the coordinator makes them (job-N); the coordinator checks
  // that it is one of its own.
  const std::string& from = spec.init().from_job();
  if (!from.empty() && (from.size() > 64 || from.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                                    "0123456789._-") != std::string::npos)) {
    return FieldError("init.from_job", "must be a job id (1-64 characters of [A-Za-z0-9._-])");
  }
  if (!spec.checkpoint().has_every_steps()) spec.mutable_checkpoint()->set_every_steps(0);
  RETURN_IF_ERROR(CheckRange("checkpoint.every_steps", spec.checkpoint().every_steps(), 0, 1 << 30));
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view json) {
  if (json.size() > kMaxJobSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", json.size(), " bytes, at most ", kMaxJobSpecBytes));
  }
  JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(std::string(json), &spec, options);
  if (!status.ok()) {
    // protobuf's message may quote the input (an unknown field's name): a prefix.
    const absl::string_view message(status.message().data(), status.message().size());
    return absl::InvalidArgumentError(
        absl::StrCat("job spec: ", message.substr(0, 256), message.size() > 256 ? "…" : ""));
  }
  RETURN_IF_ERROR(ValidateJobSpec(spec));
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileBounded(path, kMaxJobSpecBytes);
  if (!text.ok()) return absl::Status(text.status().code(), absl::StrCat("job spec: ", text.status().message()));
  absl::StatusOr<JobSpec> spec = ParseJobSpec(*text);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

std::string JobSpecToJson(const JobSpec& spec) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(spec, &json, options);
  return json;
}

}  // namespace shardline::common
