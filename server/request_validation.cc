#include "server/request_validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/input_limits.h"
#include "common/status_macros.h"

namespace shardline::server {
namespace {

using common::CheckLength;
using common::CheckRequired;
using common::kMaxAddressBytes;
using common::kMaxDescriptionBytes;
using common::kMaxIdBytes;
using common::kMaxMessageBytes;
using common::kMaxNameBytes;

// The most a stage, replica or tensor rank index may be (the spec's bounds).
constexpr int kMaxIndex = 1 << 20;
// A duration or count a worker reports: finite, not negative, below this.
constexpr double kMaxReported = 1e15;
// Links one report may carry, workers one probe request may name: the
// registry's bound (WorkerRegistry::kMaxWorkers).
constexpr int kMaxLinksPerReport = 4096;

absl::Status Bad(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", problem));
}

absl::Status CheckIndex(absl::string_view field, int64_t value) {
  if (value < 0 || value > kMaxIndex) return Bad(field, absl::StrCat("is ", value, ", must be in [0, ", kMaxIndex, "]"));
  return absl::OkStatus();
}

absl::Status CheckAmount(absl::string_view field, double value) {
  if (!(value >= 0 && value < kMaxReported)) {
    return Bad(field, absl::StrCat("is ", value, ", must be finite and not negative"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRequest(const shardline::v1::RegisterRequest& r) {
  const shardline::v1::WorkerCapabilities& c = r.capabilities();
  RETURN_IF_ERROR(CheckRequired("name", r.name(), kMaxNameBytes));
  RETURN_IF_ERROR(CheckLength("capabilities.device", c.device(), kMaxDescriptionBytes));
  RETURN_IF_ERROR(CheckLength("capabilities.description", c.description(), kMaxDescriptionBytes));
  RETURN_IF_ERROR(CheckLength("capabilities.build_version", c.build_version(), kMaxDescriptionBytes));
  RETURN_IF_ERROR(CheckRequired("capabilities.listen_address", c.listen_address(), kMaxAddressBytes));
  return absl::OkStatus();
}

absl::Status ValidateRequest(const shardline::v1::HeartbeatRequest& r) {
  RETURN_IF_ERROR(CheckRequired("worker_id", r.worker_id(), kMaxIdBytes));
  if (!r.has_compute()) return absl::OkStatus();
  if (!(r.compute().gemm_flops() > 0 && r.compute().gemm_flops() < kMaxReported)) {
    return Bad("compute.gemm_flops", absl::StrCat("is ", r.compute().gemm_flops(), ", must be positive and finite"));
  }
  if (!(r.compute().gemm_flops_spread() >= 0 && r.compute().gemm_flops_spread() <= 10)) {
    return Bad("compute.gemm_flops_spread", absl::StrCat("is ", r.compute().gemm_flops_spread(), ", must be 0 to 10"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const shardline::v1::LeaveRequest& r) {
  RETURN_IF_ERROR(CheckRequired("worker_id", r.worker_id(), kMaxIdBytes));
  return CheckLength("reason", r.reason(), 256);
}

absl::Status ValidateRequest(const shardline::v1::WatchAssignmentsRequest& r) {
  return CheckRequired("worker_id", r.worker_id(), kMaxIdBytes);
}

absl::Status ValidateRequest(const shardline::v1::ReportStepRequest& r) {
  RETURN_IF_ERROR(CheckRequired("job_id", r.job_id(), kMaxIdBytes));
  RETURN_IF_ERROR(CheckRequired("worker_id", r.worker_id(), kMaxIdBytes));
  RETURN_IF_ERROR(CheckLength("error", r.error(), kMaxMessageBytes));
  RETURN_IF_ERROR(CheckLength("resumed_from", r.resumed_from(), kMaxMessageBytes));
  RETURN_IF_ERROR(CheckIndex("stage", r.stage()));
  RETURN_IF_ERROR(CheckIndex("replica", r.replica()));
  RETURN_IF_ERROR(CheckIndex("tensor_rank", r.tensor_rank()));
  if (r.step() < 1) return Bad("step", absl::StrCat("is ", r.step(), ", steps count from 1"));
  for (auto [field, value] : {std::pair{"busy_seconds", r.busy_seconds()}, std::pair{"step_seconds", r.step_seconds()},
                              std::pair{"checkpoint_seconds", r.checkpoint_seconds()},
                              std::pair{"checkpoint_wait_seconds", r.checkpoint_wait_seconds()},
                              std::pair{"tensor_collective_seconds", r.tensor_collective_seconds()},
                              std::pair{"lr", r.lr()}}) {
    RETURN_IF_ERROR(CheckAmount(field, value));
  }
  for (auto [field, value] : {std::pair{"tokens", r.tokens()}, std::pair{"peak_slots", r.peak_slots()},
                              std::pair{"received_bytes", r.received_bytes()},
                              std::pair{"minor_faults", r.minor_faults()},
                              std::pair{"link_peak_bytes", r.link_peak_bytes()},
                              std::pair{"collective_bytes", r.collective_bytes()},
                              std::pair{"tensor_collective_bytes", r.tensor_collective_bytes()},
                              std::pair{"eval_windows", r.eval_windows()}}) {
    if (value < 0) return Bad(field, absl::StrCat("is ", value, ", must not be negative"));
  }
  if (r.has_eval_matches() && (r.eval_matches() < 0 || r.eval_matches() > r.eval_windows())) {
    return Bad("eval_matches", absl::StrCat("is ", r.eval_matches(), ", must be in [0, eval_windows = ",
                                            r.eval_windows(), "]"));
  }
  if (static_cast<size_t>(r.trace_size()) > common::kMaxTraceEvents) {
    return Bad("trace", absl::StrCat("has ", r.trace_size(), " spans, at most ", common::kMaxTraceEvents));
  }
  for (const shardline::v1::TraceEvent& event : r.trace()) {
    RETURN_IF_ERROR(CheckLength("trace.name", event.name(), kMaxNameBytes));
  }
  if (r.eval_losses_size() > kMaxIndex) {
    return Bad("eval_losses", absl::StrCat("has ", r.eval_losses_size(), " entries, at most ", kMaxIndex));
  }
  if (r.group_losses_size() > kMaxIndex) {
    return Bad("group_losses", absl::StrCat("has ", r.group_losses_size(), " entries, at most ", kMaxIndex));
  }
  // One a neighbour: two stage-link neighbours and the stage's replicas.
  if (r.wire_paces_size() > kMaxIndex + 2) {
    return Bad("wire_paces", absl::StrCat("has ", r.wire_paces_size(), " entries, at most ", kMaxIndex + 2));
  }
  for (const shardline::v1::WirePace& pace : r.wire_paces()) {
    if (!shardline::v1::WirePace::Peer_IsValid(pace.peer()) || pace.peer() == shardline::v1::WirePace::PEER_UNSPECIFIED) {
      return Bad("wire_paces.peer", absl::StrCat("is ", pace.peer()));
    }
    RETURN_IF_ERROR(CheckIndex("wire_paces.replica", pace.replica()));
    RETURN_IF_ERROR(CheckAmount("wire_paces.seconds", pace.seconds()));
    if (pace.bytes() < 0) return Bad("wire_paces.bytes", absl::StrCat("is ", pace.bytes(), ", must not be negative"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const shardline::v1::ShardHeader& h) {
  RETURN_IF_ERROR(CheckRequired("job_id", h.job_id(), kMaxIdBytes));
  RETURN_IF_ERROR(CheckRequired("worker_id", h.worker_id(), kMaxIdBytes));
  RETURN_IF_ERROR(CheckIndex("stage", h.stage()));
  if (h.total_bytes() < 0 || h.total_bytes() > common::kMaxShardBytes || h.offset() < 0 ||
      h.offset() > h.total_bytes()) {
    return Bad("shard header", absl::StrCat("declares ", h.total_bytes(), " bytes from offset ", h.offset(),
                                            "; a shard is at most ", common::kMaxShardBytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const shardline::v1::FetchStateRequest& r) {
  RETURN_IF_ERROR(CheckRequired("job_id", r.job_id(), kMaxIdBytes));
  RETURN_IF_ERROR(CheckRequired("worker_id", r.worker_id(), kMaxIdBytes));
  RETURN_IF_ERROR(CheckLength("link_token", r.link_token(), kMaxIdBytes));
  RETURN_IF_ERROR(CheckIndex("stage", r.stage()));
  RETURN_IF_ERROR(CheckIndex("replica", r.replica()));
  if (static_cast<size_t>(r.names_size()) > common::kMaxStateNames) {
    return Bad("names", absl::StrCat("has ", r.names_size(), " entries, at most ", common::kMaxStateNames));
  }
  for (const std::string& name : r.names()) RETURN_IF_ERROR(CheckLength("names", name, kMaxNameBytes));
  return absl::OkStatus();
}

absl::Status ValidateRequest(const shardline::v1::GetJobRequest& r) {
  return CheckRequired("job_id", r.job_id(), kMaxIdBytes);
}

absl::Status ValidateRequest(const shardline::v1::ExportWeightsRequest& r) {
  return CheckRequired("job_id", r.job_id(), kMaxIdBytes);
}

absl::Status ValidateRequest(const shardline::v1::DrainWorkerRequest& r) {
  return CheckRequired("worker", r.worker(), kMaxNameBytes);
}

absl::Status ValidateRequest(const shardline::v1::GetTraceRequest& r) {
  return CheckRequired("job_id", r.job_id(), kMaxIdBytes);
}

absl::Status ValidateRequest(const shardline::v1::ReportLinksRequest& r) {
  RETURN_IF_ERROR(CheckRequired("worker_id", r.worker_id(), kMaxIdBytes));
  if (r.links_size() > kMaxLinksPerReport) {
    return Bad("links", absl::StrCat("has ", r.links_size(), " entries, at most ", kMaxLinksPerReport));
  }
  for (const shardline::v1::LinkMeasurement& link : r.links()) {
    RETURN_IF_ERROR(CheckRequired("links.to_worker", link.to_worker(), kMaxNameBytes));
    RETURN_IF_ERROR(CheckAmount("links.bytes_per_second", link.bytes_per_second()));
    RETURN_IF_ERROR(CheckAmount("links.bytes_per_second_spread", link.bytes_per_second_spread()));
    RETURN_IF_ERROR(CheckAmount("links.rtt_seconds", link.rtt_seconds()));
    RETURN_IF_ERROR(CheckLength("links.error", link.error(), kMaxMessageBytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const shardline::v1::ProbeLinksRequest& r) {
  if (r.workers_size() > kMaxLinksPerReport) {
    return Bad("workers", absl::StrCat("has ", r.workers_size(), " entries, at most ", kMaxLinksPerReport));
  }
  for (const std::string& name : r.workers()) RETURN_IF_ERROR(CheckRequired("workers", name, kMaxNameBytes));
  return absl::OkStatus();
}

}  // namespace shardline::server
