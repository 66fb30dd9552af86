// Loading and validating job specs (shardline.v1.JobSpec, written as JSON).
//
// Validation checks each field and the combinations between them, names the
// offending field in the error (INVALID_ARGUMENT), and fills in the defaults
// documented in job.proto, so code downstream reads every optional field
// without checking has_*. Whether the data fits the model (vocabulary,
// sequence length) is checked where the data source is created.
#ifndef SHARDLINE_COMMON_JOB_SPEC_H_
#define SHARDLINE_COMMON_JOB_SPEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shardline/v1/job.pb.h"

namespace shardline::common {

// JobStatus.init_from of a job that starts from weights sent with it
// (shardctl submit --init_weights), not another job's (init.from_job).
inline constexpr char kSentWeights[] = "sent weights";

// Parses JSON (unknown fields are errors) and validates.
absl::StatusOr<shardline::v1::JobSpec> ParseJobSpec(absl::string_view json);
// Reads the file, then ParseJobSpec. NOT_FOUND / INVALID_ARGUMENT name the path.
absl::StatusOr<shardline::v1::JobSpec> LoadJobSpec(const std::string& path);
// Checks the spec and fills in defaults.
absl::Status ValidateJobSpec(shardline::v1::JobSpec& spec);
// Compact JSON of the spec (for metadata and logs).
std::string JobSpecToJson(const shardline::v1::JobSpec& spec);

// Number of pipeline units of a model: embedding, n_layers blocks, head.
int PipelineUnits(const shardline::v1::ModelSpec& model);

// Sequences of one micro-batch: global_batch / (data_parallel ·
// micro_batches), rounded up. Validation batches are this size too.
int64_t MicroBatchSequences(const shardline::v1::JobSpec& spec);

// Whether the spec evaluates after `step` (train.eval_every).
bool EvaluatesAfter(const shardline::v1::JobSpec& spec, int64_t step);
// Whether the spec stops early on its validation passes
// (train.early_stopping.patience > 0).
bool StopsEarly(const shardline::v1::JobSpec& spec);
// Whether a position checkpoints after `step`: every
// checkpoint.every_steps, the last step, and with early stopping every
// validation step (its version may be the job's best).
bool CheckpointsAfter(const shardline::v1::JobSpec& spec, int64_t step);
// Whether its validation scores exact match (addition data: the held-out
// problems answered right) besides the loss.
bool EvaluatesExactMatch(const shardline::v1::JobSpec& spec);

// Whether the token embedding and the LM head are split over the tensor
// group (vocabulary-parallel): parallel.vocab_parallel where set, else when
// tensor_parallel t > 1 divides the vocabulary and it has at least 64 rows
// per rank (below that, each rank's slice saves less than the collectives
// the split adds cost). Never with t = 1.
bool VocabParallel(const shardline::v1::JobSpec& spec);

// The spec a grid of `replicas` data-parallel replicas runs in place of the
// spec's d (`replicas` must divide d): each replica runs d / replicas of the
// spec's replicas' micro-batch groups one after the other, so
// micro_batches is m · d / replicas, and global micro-batch r · m + k is the
// same batch as in the spec. The gradients stay the spec's only where each
// group is summed apart (runtime::PipelineStageOptions::groups).
shardline::v1::JobSpec FoldReplicas(const shardline::v1::JobSpec& spec, int replicas);
// The most of the spec's replicas one replica of a grid of several runs:
// their gradients cross each link of the data-parallel sum as that many
// messages while every rank sends before it receives, which the streams'
// queues (transport::ExchangeOptions::max_waiting) must hold.
inline constexpr int kMaxReplicaGroups = 8;

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_JOB_SPEC_H_
