#include "server/admin_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/grpc_metadata.h"
#include "common/grpc_status.h"
#include "common/input_limits.h"
#include "common/job_spec.h"
#include "common/safetensors.h"
#include "common/grpc_chunk_writer.h"
#include "glog/logging.h"
#include "server/certificate_names.h"
#include "server/grpc_mailbox_writer.h"
#include "server/request_validation.h"
#include "server/weights_upload.h"

namespace shardline::server {
namespace {

using common::FinishUnary;
using common::ToGrpcStatus;
using shardline::v1::JobStatus;

// A watcher this far behind loses the oldest statuses it has not been sent,
// by count or by bytes: a reader that stops reading holds at most this much.
constexpr size_t kMaxQueuedStatuses = 1024;
constexpr size_t kMaxQueuedStatusBytes = 4 << 20;

template <typename T>
grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, absl::StatusOr<T> result,
                                T* response) {
  if (result.ok()) *response = std::move(*result);
  return FinishUnary(context, result.status());
}

bool Terminal(const JobStatus& status) {
  return status.state() == shardline::v1::SUCCEEDED || status.state() == shardline::v1::FAILED ||
         status.state() == shardline::v1::CANCELLED;
}


shardline::v1::WorkerStatus ToWorkerStatus(const WorkerRecord& w) {
  shardline::v1::WorkerStatus out;
  out.set_worker_id(w.id);
  out.set_name(w.name);
  out.set_device(w.capabilities.device());
  out.set_description(w.capabilities.description());
  out.set_gemm_flops(w.capabilities.gemm_flops());
  out.set_gemm_flops_spread(w.capabilities.gemm_flops_spread());
  if (w.achieved_reports >= kMinAchievedReports) out.set_achieved_flops(w.achieved_flops);
  if (!w.lost && w.planning_flops > 0) out.set_planning_flops(w.planning_flops);
  out.set_memory_bytes(w.capabilities.memory_bytes());
  out.set_listen_address(w.capabilities.listen_address());
  out.set_state(StateOf(w));
  out.set_job_id(w.job_id);
  return out;
}

// The audit line of an admin call that changed something.
void Audit(const std::string& who, const std::string& what) { LOG(INFO) << "admin: " << who << ": " << what; }

}  // namespace

absl::StatusOr<std::string> AdminService::Authorize(const grpc::CallbackServerContext* context, AdminRole role) {
  if (tokens_ != nullptr) return tokens_->Check(common::MetadataValue(*context, "authorization"), role);
  const std::vector<std::string> names = CertificateNames(context->auth_context().get());
  return names.empty() ? std::string(kAnOperator) : absl::StrCat("certificate ", names.front());
}


grpc::ServerUnaryReactor* AdminService::SubmitJob(grpc::CallbackServerContext* context,
                                                  const shardline::v1::SubmitJobRequest* request,
                                                  JobStatus* response) {
  absl::StatusOr<std::string> who = Authorize(context, AdminRole::kAdmin);
  if (!who.ok()) return FinishUnary(context, who.status());
  absl::StatusOr<JobStatus> submitted = jobs_.Submit(request->spec(), *who);
  if (submitted.ok()) Audit(*who, absl::StrCat("submitted job ", submitted->job_id(), " (", submitted->name(), ")"));
  return Reply(context, std::move(submitted), response);
}

grpc::ServerReadReactor<shardline::v1::WeightsChunk>* AdminService::SubmitJobWithWeights(
    grpc::CallbackServerContext* context, JobStatus* response) {
  absl::StatusOr<std::string> who = Authorize(context, AdminRole::kAdmin);
  if (!who.ok()) {
    // Refused before a byte is read.
    class Refused final : public grpc::ServerReadReactor<shardline::v1::WeightsChunk> {
     public:
      explicit Refused(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
      void OnDone() override { delete this; }
    };
    return new Refused(who.status());
  }
  return new WeightsUpload(jobs_, weights_, *who, response, [who = *who](const JobStatus& job) {
    Audit(who, absl::StrCat("submitted job ", job.job_id(), " (", job.name(), ") with the weights it starts from"));
  });
}

grpc::ServerUnaryReactor* AdminService::GetJob(grpc::CallbackServerContext* context,
                                               const shardline::v1::GetJobRequest* request,
                                               JobStatus* response) {
  if (absl::Status s = Authorize(context, AdminRole::kViewer).status(); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return FinishUnary(context, s);
  return Reply(context, jobs_.Get(request->job_id()), response);
}

grpc::ServerUnaryReactor* AdminService::GetTrace(grpc::CallbackServerContext* context,
                                                 const shardline::v1::GetTraceRequest* request,
                                                 shardline::v1::GetTraceResponse* response) {
  if (absl::Status s = Authorize(context, AdminRole::kViewer).status(); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return FinishUnary(context, s);
  if (request->first_step() < 0 || request->last_step() < 0 ||
      (request->last_step() > 0 && request->first_step() > request->last_step())) {
    return FinishUnary(context, absl::InvalidArgumentError(absl::StrCat("steps ", request->first_step(), ":",
                                                                        request->last_step(), " are not a range")));
  }
  return Reply(context, jobs_.Trace(request->job_id(), request->first_step(), request->last_step()), response);
}

grpc::ServerUnaryReactor* AdminService::ListJobs(grpc::CallbackServerContext* context,
                                                 const shardline::v1::ListJobsRequest* request,
                                                 shardline::v1::ListJobsResponse* response) {
  if (absl::Status s = Authorize(context, AdminRole::kViewer).status(); !s.ok()) return FinishUnary(context, s);
  for (JobStatus& job : jobs_.List()) *response->add_jobs() = std::move(job);
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerWriteReactor<JobStatus>* AdminService::WatchJob(grpc::CallbackServerContext* context,
                                                            const shardline::v1::GetJobRequest* request) {
  if (absl::Status s = Authorize(context, AdminRole::kViewer).status(); !s.ok()) return new RejectedWriter<JobStatus>(ToGrpcStatus(s));
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return new RejectedWriter<JobStatus>(ToGrpcStatus(s));
  auto mailbox = std::make_shared<StreamMailbox<JobStatus>>(kMaxQueuedStatuses, kMaxQueuedStatusBytes);
  if (absl::Status s = jobs_.Watch(request->job_id(), mailbox); !s.ok()) {
    return new RejectedWriter<JobStatus>(ToGrpcStatus(s));
  }
  return new MailboxWriter<JobStatus>(mailbox, Terminal);
}

grpc::ServerUnaryReactor* AdminService::CancelJob(grpc::CallbackServerContext* context,
                                                  const shardline::v1::GetJobRequest* request,
                                                  JobStatus* response) {
  absl::StatusOr<std::string> who = Authorize(context, AdminRole::kAdmin);
  if (!who.ok()) return FinishUnary(context, who.status());
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return FinishUnary(context, s);
  absl::StatusOr<JobStatus> cancelled = jobs_.Cancel(request->job_id(), *who);
  if (cancelled.ok()) Audit(*who, absl::StrCat("cancelled job ", request->job_id()));
  return Reply(context, std::move(cancelled), response);
}

grpc::ServerUnaryReactor* AdminService::ReplanJob(grpc::CallbackServerContext* context,
                                                  const shardline::v1::GetJobRequest* request,
                                                  JobStatus* response) {
  absl::StatusOr<std::string> who = Authorize(context, AdminRole::kAdmin);
  if (!who.ok()) return FinishUnary(context, who.status());
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return FinishUnary(context, s);
  absl::StatusOr<JobStatus> replanned = jobs_.Replan(request->job_id(), absl::StrCat("asked by ", *who));
  if (replanned.ok()) Audit(*who, absl::StrCat("re-planned job ", request->job_id()));
  return Reply(context, std::move(replanned), response);
}

grpc::ServerUnaryReactor* AdminService::DeleteJob(grpc::CallbackServerContext* context,
                                                  const shardline::v1::GetJobRequest* request,
                                                  shardline::v1::DeleteJobResponse* response) {
  absl::StatusOr<std::string> who = Authorize(context, AdminRole::kAdmin);
  if (!who.ok()) return FinishUnary(context, who.status());
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return FinishUnary(context, s);
  return Reply(context, jobs_.Delete(request->job_id(), *who), response);  // logged there
}

grpc::ServerUnaryReactor* AdminService::ListWorkers(grpc::CallbackServerContext* context,
                                                    const shardline::v1::ListWorkersRequest* request,
                                                    shardline::v1::ListWorkersResponse* response) {
  if (absl::Status s = Authorize(context, AdminRole::kViewer).status(); !s.ok()) return FinishUnary(context, s);
  for (const WorkerRecord& w : registry_.List()) *response->add_workers() = ToWorkerStatus(w);
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::ListLinks(grpc::CallbackServerContext* context,
                                                  const shardline::v1::ListLinksRequest* request,
                                                  shardline::v1::ListLinksResponse* response) {
  if (absl::Status s = Authorize(context, AdminRole::kViewer).status(); !s.ok()) return FinishUnary(context, s);
  const LinkTable& links = jobs_.links();
  for (const LinkRecord& l : links.Links()) {
    shardline::v1::LinkStatus* out = response->add_links();
    out->set_from_worker(l.from);
    out->set_to_worker(l.to);
    out->set_bytes_per_second(l.bytes_per_second);
    out->set_bytes_per_second_spread(l.spread);
    out->set_rtt_seconds(l.rtt_seconds);
    if (l.measured_at != absl::InfinitePast()) {  // else only observed, never probed
      out->set_age_seconds(absl::ToDoubleSeconds(links.Now() - l.measured_at));
    }
    out->set_stale(links.Stale(l));
    out->set_error(l.error);
    if (l.observed_bytes_per_second > 0) {
      out->set_observed_bytes_per_second(l.observed_bytes_per_second);
      out->set_observed_age_seconds(absl::ToDoubleSeconds(links.Now() - l.observed_at));
      out->set_observed_in(l.observed_in);
    }
    out->set_slowed_from_bytes_per_second(l.slowed_from);
    out->set_checked(l.checked);
    if (l.fast_before > 0) {
      out->set_fast_before_bytes_per_second(l.fast_before);
      out->set_next_check_seconds(std::max(0.0, absl::ToDoubleSeconds(l.next_check - links.Now())));
    }
  }
  for (const auto& [name, suspicion] : links.Suspects()) {
    shardline::v1::SuspectedLink* out = response->add_suspected();
    out->set_worker(name);
    out->set_bytes_per_second(suspicion.bytes_per_second);
    out->set_age_seconds(absl::ToDoubleSeconds(links.Now() - suspicion.since));
    out->set_job(suspicion.job_id);
  }
  response->set_pending_probes(links.pending());
  response->set_probing(links.probing());
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::ProbeLinks(grpc::CallbackServerContext* context,
                                                   const shardline::v1::ProbeLinksRequest* request,
                                                   shardline::v1::ProbeLinksResponse* response) {
  absl::StatusOr<std::string> who = Authorize(context, AdminRole::kAdmin);
  if (!who.ok()) return FinishUnary(context, who.status());
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return FinishUnary(context, s);
  std::vector<std::string> names;
  if (request->workers().empty()) {
    for (const WorkerRecord& w : registry_.List()) {
      if (!w.lost) names.push_back(w.name);
    }
  } else {
    for (const std::string& name : request->workers()) {
      absl::StatusOr<WorkerRecord> w = registry_.GetByName(name);
      if (!w.ok() || w->lost) {
        return FinishUnary(context, absl::NotFoundError(absl::StrCat("no live worker named ", common::Quote(name))));
      }
      names.push_back(name);
    }
  }
  if (names.size() < 2) {
    return FinishUnary(context, absl::FailedPreconditionError(absl::StrCat(
                             "a link needs two live workers; ", names.size(), " to probe between")));
  }
  response->set_queued(jobs_.links().Request(names));
  Audit(*who, absl::StrCat("asked for link probes among ", names.size(), " workers (", response->queued(),
                           " directions queued)"));
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::DrainWorker(grpc::CallbackServerContext* context,
                                                    const shardline::v1::DrainWorkerRequest* request,
                                                    shardline::v1::WorkerStatus* response) {
  absl::StatusOr<std::string> who = Authorize(context, AdminRole::kAdmin);
  if (!who.ok()) return FinishUnary(context, who.status());
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return FinishUnary(context, s);
  absl::StatusOr<WorkerRecord> w = jobs_.Drain(request->worker(), request->undo(), request->at_once(), *who);
  if (w.ok()) *response = ToWorkerStatus(*w);
  if (w.ok() && request->undo()) Audit(*who, absl::StrCat("undrained worker ", w->name));  // a drain is logged there
  return FinishUnary(context, w.status());
}

grpc::ServerUnaryReactor* AdminService::PlanJob(grpc::CallbackServerContext* context,
                                                const shardline::v1::SubmitJobRequest* request,
                                                shardline::v1::PlanResponse* response) {
  if (absl::Status s = Authorize(context, AdminRole::kViewer).status(); !s.ok()) return FinishUnary(context, s);
  return Reply(context, jobs_.Plan(request->spec()), response);
}

grpc::ServerWriteReactor<shardline::v1::ExportChunk>* AdminService::ExportWeights(
    grpc::CallbackServerContext* context, const shardline::v1::ExportWeightsRequest* request) {
  absl::StatusOr<std::string> who = Authorize(context, AdminRole::kAdmin);
  if (!who.ok()) return new RejectedWriter<shardline::v1::ExportChunk>(ToGrpcStatus(who.status()));
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return new RejectedWriter<shardline::v1::ExportChunk>(ToGrpcStatus(s));
  absl::StatusOr<shardline::v1::JobSpec> spec = jobs_.Spec(request->job_id());
  // Read from the shard files a chunk at a time as the stream goes: the
  // coordinator never holds the model.
  absl::StatusOr<std::unique_ptr<common::SafetensorsConcat>> file =
      spec.ok() ? weights_.OpenWeights(request->job_id(),
                                       {{"format", "pt"},
                                        {"producer", "shardline-coordinator"},
                                        {"job_id", request->job_id()},
                                        {"spec", common::JobSpecToJson(*spec)}},
                                       request->best())
                : spec.status();
  if (!file.ok()) return new RejectedWriter<shardline::v1::ExportChunk>(ToGrpcStatus(file.status()));
  Audit(*who, absl::StrCat("exported the ", request->best() ? "best validation pass's " : "", "weights of job ",
                           request->job_id(), " (", (*file)->size(), " bytes)"));
  const uint64_t size = (*file)->size();
  return new common::ChunkWriter<shardline::v1::ExportChunk>(
      size, [held = std::shared_ptr<const common::SafetensorsConcat>(std::move(*file))](uint64_t offset, size_t max) {
        return held->Read(offset, max);
      });
}

}  // namespace shardline::server
