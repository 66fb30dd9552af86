#include "worker/metered_reporter.h"

#include <algorithm>
#include <map>
#include <string>

namespace shardline::worker {
namespace {

const std::vector<double>& StepBuckets() {
  static const auto* buckets =
      new std::vector<double>{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
  return *buckets;
}

}  // namespace

MeteredReporter::MeteredReporter(StageReporter& inner, common::MetricsRegistry& m)
    : ForwardingReporter(inner),
      metrics_(m),
      steps_(m.GetCounter("shardline_worker_steps_total", "training steps this worker's stages ran")),
      failed_steps_(m.GetCounter("shardline_worker_failed_steps_total", "steps this worker's stages failed")),
      step_seconds_(m.GetHistogram("shardline_worker_step_seconds", "wall time of a step on this worker's stage",
                                   StepBuckets())),
      busy_seconds_(m.GetCounter("shardline_worker_busy_seconds_total",
                                 "time this worker's stages spent in forward and backward passes")),
      busy_ratio_(m.GetGauge("shardline_worker_busy_ratio", "share of the last step this worker spent computing")),
      bubble_ratio_(m.GetGauge("shardline_worker_bubble_ratio",
                               "share of the last step this worker did not compute (waits on neighbours, "
                               "collectives, the schedule's bubble)")),
      link_bytes_(m.GetCounter("shardline_worker_link_received_bytes_total",
                               "stage-link payload bytes this worker received from its neighbours")),
      collective_bytes_(m.GetCounter("shardline_worker_collective_received_bytes_total",
                                     "data-parallel gradient bytes this worker received in all-reduces")),
      tensor_collective_bytes_(m.GetCounter("shardline_worker_tensor_collective_received_bytes_total",
                                            "tensor-parallel bytes this worker received in its group's collectives")),
      tensor_collective_seconds_(m.GetCounter("shardline_worker_tensor_collective_seconds_total",
                                              "time this worker spent in its tensor group's collectives (inside "
                                              "the forward and backward phases)")),
      link_peak_bytes_(m.GetGauge("shardline_worker_link_peak_bytes",
                                  "most tensor bytes the running stage's links held at once")),
      checkpoint_seconds_(m.GetCounter("shardline_worker_checkpoint_seconds_total",
                                       "time training stood still for checkpoint snapshots, and waiting for "
                                       "the previous upload")),
      uploads_(m.GetCounter("shardline_worker_checkpoint_uploads_total", "checkpoint shards uploaded")),
      upload_bytes_(m.GetCounter("shardline_worker_checkpoint_upload_bytes_total", "checkpoint shard bytes uploaded")) {}

absl::StatusOr<bool> MeteredReporter::ReportStep(const shardline::v1::ReportStepRequest& r) {
  if (!r.error().empty()) {
    failed_steps_.Add();
  } else {
    steps_.Add();
    step_seconds_.Observe(r.step_seconds());
    busy_seconds_.Add(r.busy_seconds());
    const double busy = r.step_seconds() > 0 ? std::clamp(r.busy_seconds() / r.step_seconds(), 0.0, 1.0) : 0.0;
    busy_ratio_.Set(busy);
    bubble_ratio_.Set(1 - busy);
    link_bytes_.Add(static_cast<double>(r.received_bytes()));
    collective_bytes_.Add(static_cast<double>(r.collective_bytes()));
    tensor_collective_bytes_.Add(static_cast<double>(r.tensor_collective_bytes()));
    tensor_collective_seconds_.Add(r.tensor_collective_seconds());
    link_peak_bytes_.Set(static_cast<double>(r.link_peak_bytes()));
    checkpoint_seconds_.Add(r.checkpoint_seconds() + r.checkpoint_wait_seconds());
    // Where the step's time went, from its trace: waits on neighbours
    // (receive), on collectives (norm, reduce, gather), the passes...
    std::map<std::string, int64_t> micros;
    for (const shardline::v1::TraceEvent& span : r.trace()) micros[span.name()] += span.duration_us();
    for (const auto& [phase, us] : micros) {
      auto it = phase_seconds_.find(phase);
      if (it == phase_seconds_.end()) {
        it = phase_seconds_
                 .emplace(phase, &metrics_.GetCounter("shardline_worker_phase_seconds_total",
                                                      "time this worker's stages spent in each phase of their "
                                                      "steps (the trace's spans: forward, backward, receive, "
                                                      "send, norm, reduce, optimizer, gather, flush)",
                                                      {{"phase", phase}}))
                 .first;
      }
      it->second->Add(static_cast<double>(us) / 1e6);
    }
  }
  return inner().ReportStep(r);
}

absl::Status MeteredReporter::ReportShard(const ShardSnapshot& shard, const std::atomic<bool>& cancelled) {
  absl::Status status = inner().ReportShard(shard, cancelled);
  if (status.ok()) {
    uploads_.Add();
    upload_bytes_.Add(static_cast<double>(shard.size()));
  }
  return status;
}

}  // namespace shardline::worker
