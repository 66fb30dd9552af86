#include "worker/grpc_job_groups.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cost_model.h"
#include "common/status_macros.h"
#include "worker/runtime/gradient_buckets.h"
#include "worker/runtime/pipeline_stage.h"
#include "worker/transport/staging_pool.h"

namespace shardline::worker {

transport::FrameLimits StageLinkFrameLimits(const shardline::v1::Assignment& a) {
  transport::FrameLimits limits;
  limits.max_elements = static_cast<int64_t>(runtime::LargestLinkTensorBytes(a.spec()) / sizeof(float));
  limits.max_targets = runtime::MicroBatchTokens(a.spec());
  return limits;
}

transport::FrameLimits CollectiveFrameLimits(const shardline::v1::Assignment& a) {
  const int64_t parameters = common::UnitRangeParameters(a.spec().model(), a.unit_begin(), a.unit_end());
  const int64_t tokens = runtime::MicroBatchTokens(a.spec());
  transport::FrameLimits limits;
  limits.max_elements = std::min(transport::kMaxFrameElements,
                                 std::max({parameters, StageLinkFrameLimits(a).max_elements,
                                           3 * tokens * std::max(1, a.tensor_size()), int64_t{1} << 16}));
  limits.max_targets = 0;
  return limits;
}

absl::StatusOr<JobGroups> CreateJobGroups(const shardline::v1::Assignment& a, Backend& backend,
                                          transport::StageLinkService& service,
                                          const transport::ExchangeOptions& link_exchange) {
  transport::ExchangeOptions exchange = link_exchange;
  exchange.limits = CollectiveFrameLimits(a);
  exchange.link_token = a.link_token();
  auto group = [&](std::string name, int rank, const auto& addresses, size_t slot_bytes) {
    collective::GrpcCollectiveOptions o;
    o.job_id = a.job_id();
    o.plan_epoch = a.plan_epoch();
    o.group = std::move(name);
    o.rank = rank;
    o.peer_addresses.assign(addresses.begin(), addresses.end());
    o.service = &service;
    o.exchange = exchange;
    o.staging_slot_bytes = slot_bytes;
    o.staging_memory = transport::HostStagingMemory(backend);
    return collective::GrpcCollective::Create(backend, o);
  };
  const bool split = a.tensor_size() > 1;
  JobGroups groups;
  // A replica standing for several of the spec's sums their groups' parts
  // even alone: in a group of one.
  if (a.replicas() > 1 || a.replica_groups() > 1) {
    // Slots for the largest chunk of a bucket, or of all the stage's
    // gradients when they fill less than one.
    const int64_t parameters = common::UnitRangeParameters(a.spec().model(), a.unit_begin(), a.unit_end());
    const size_t bucket = std::min(static_cast<size_t>(a.spec().parallel().bucket_mib() * (1 << 20)),
                                   static_cast<size_t>(std::max<int64_t>(1, parameters)) * sizeof(float));
    ASSIGN_OR_RETURN(groups.replicas,
                     group(split ? absl::StrCat("stage-", a.stage(), ".tensor-", a.tensor_rank())
                                 : absl::StrCat("stage-", a.stage()),
                           a.replica(),
                           a.replicas() > 1 ? std::vector<std::string>(a.replica_addresses().begin(),
                                                                       a.replica_addresses().end())
                                            : std::vector<std::string>{""},
                           runtime::GradientBuckets::LargestChunkBytes(bucket, a.replicas(),
                                                                      a.spec().parallel().shard_optimizer())));
  }
  if (split) {
    // A micro-batch's activations, summed over the group.
    ASSIGN_OR_RETURN(groups.tensor, group(absl::StrCat("tensor-", a.stage(), ".replica-", a.replica()),
                                          a.tensor_rank(), a.tensor_addresses(),
                                          runtime::LargestLinkTensorBytes(a.spec())));
  }
  return groups;
}

}  // namespace shardline::worker
