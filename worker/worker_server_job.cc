// WorkerServer's jobs: an assignment taken (a new job, a stop ahead, a
// cancellation, a newer epoch), run on the job's thread through
// RunStageJob, and ended.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "worker/grpc_job_groups.h"
#include "worker/metered_reporter.h"
#include "worker/runtime/pipeline_stage.h"
#include "worker/runtime/stage_sender.h"
#include "worker/scrambled_reporter.h"
#include "worker/stage_job.h"
#include "worker/worker_server.h"

namespace shardline::worker {

void WorkerServer::CancelJob(const std::string& why) {
  if (job_id_.empty()) return;
  job_cancelled_ = true;
  if (link_ != nullptr) link_->Close(why);
  if (groups_ != nullptr) groups_->Close(why);
}

void WorkerServer::OnAssignment(const shardline::v1::Assignment& a) {
  if (a.cancel()) {
    absl::MutexLock lock(&mu_);
    if (job_id_ == a.job_id()) {
      LOG(INFO) << "job " << a.job_id() << " cancelled by the coordinator";
      CancelJob(absl::StrCat("job ", a.job_id(), " was cancelled"));
    }
    return;
  }
  // At once, before the old job stops: a twin of the new plan may ask for
  // this worker's snapshot soon.
  state_cache_.AdmitToken(a.job_id(), a.link_token());
  {
    absl::MutexLock lock(&mu_);
    // An update of the running job: stop after a step (a re-plan).
    if (job_id_ == a.job_id() && job_epoch_ == a.plan_epoch() && a.stop_after_step() > 0) {
      LOG(INFO) << "job " << a.job_id() << ": stopping after step " << a.stop_after_step()
                << " (the coordinator re-plans from it)";
      job_stop_after_ = a.stop_after_step();
      return;
    }
    if (a.stop_after_step() > 0) return;  // for an epoch this worker no longer runs
    // The coordinator resends what a broken stream may not have delivered.
    if (job_id_ == a.job_id() && job_epoch_ == a.plan_epoch()) {
      LOG(INFO) << "job " << a.job_id() << ": assignment at epoch " << a.plan_epoch() << " already taken";
      return;
    }
    // A newer assignment fences the older one (a restart or a re-plan).
    if (job_.joinable()) {
      CancelJob(absl::StrCat("job ", job_id_, " epoch ", job_epoch_, " is superseded"));
    }
  }
  JoinJob();  // a previous job's thread, finished or being cancelled
  absl::MutexLock lock(&mu_);
  // Stop() may have joined the previous job meanwhile: a worker shutting
  // down starts nothing (a thread it would never join).
  if (stopping_) return;
  job_id_ = a.job_id();
  job_epoch_ = a.plan_epoch();
  job_cancelled_ = false;
  job_stop_after_ = 0;
  job_running_ = true;
  job_ = std::thread([this, a] {
    RunJob(a);
    absl::MutexLock lock(&mu_);
    job_running_ = false;
  });
}

void WorkerServer::JoinJob() {
  std::thread job;
  {
    absl::MutexLock lock(&mu_);
    job = std::move(job_);
  }
  if (job.joinable()) job.join();
}

void WorkerServer::RunJob(shardline::v1::Assignment a) {
  LOG(INFO) << "job " << a.job_id() << ": stage " << a.stage() << " of " << a.stages()
            << (a.replicas() > 1 ? absl::StrCat(", replica ", a.replica(), " of ", a.replicas()) : "") << ", units ["
            << a.unit_begin() << ", " << a.unit_end() << "), epoch " << a.plan_epoch();
  transport::GrpcStageLinkOptions options;
  options.job_id = a.job_id();
  options.plan_epoch = a.plan_epoch();
  options.stage = a.stage();
  options.stages = a.stages();
  options.upstream_address = a.upstream_address();
  options.service = &link_service_;
  options.exchange = options_.link;
  // Enough waiting room that no two neighbours can both wait on a full
  // buffer under either schedule (1F1B needs about half the stage count).
  options.exchange.max_waiting = std::max<size_t>(8, static_cast<size_t>(a.stages()));
  options.exchange.limits = StageLinkFrameLimits(a);
  options.exchange.link_token = a.link_token();
  options.to_next = a.int8_to_next() ? transport::WireCodec::kInt8Blocks : transport::WireCodec::kAsIs;
  options.to_previous = a.int8_to_previous() ? transport::WireCodec::kInt8Blocks : transport::WireCodec::kAsIs;
  options.staging_slot_bytes = runtime::LargestLinkTensorBytes(a.spec());
  options.staging_memory = transport::HostStagingMemory(*backend_);
  // Where device copies finish later (CUDA), a stage's sender holds a few
  // outgoing tensors before the link does.
  if (backend_->host_staging_pinned()) options.extra_send_slots = runtime::StageSender::kDefaultMaxQueued;
  options.staging_budget_bytes = options_.link_staging_bytes;
  if (a.int8_to_next() || a.int8_to_previous()) {
    LOG(INFO) << "job " << a.job_id() << " stage " << a.stage() << ": 8-bit blocks on the link"
              << (a.int8_to_next() && a.int8_to_previous() ? "s to both neighbours"
                  : a.int8_to_next()                       ? " to the next stage"
                                                           : " to the previous stage");
  }
  if (a.int8_reduce()) {
    LOG(INFO) << "job " << a.job_id() << " stage " << a.stage() << " replica " << a.replica()
              << ": the gradients' all-reduce over 8-bit blocks with error feedback";
  }
  absl::StatusOr<std::unique_ptr<transport::GrpcStageLink>> link = transport::GrpcStageLink::Create(options);
  absl::Status status = link.status();
  // Its data-parallel and tensor-parallel groups, over the same service.
  JobGroups groups;
  if (status.ok()) {
    absl::StatusOr<JobGroups> created = CreateJobGroups(a, *backend_, link_service_, options_.link);
    status = created.status();
    if (created.ok()) groups = *std::move(created);
  }
  if (status.ok()) {
    {
      absl::MutexLock lock(&mu_);
      link_ = link->get();
      groups_ = &groups;
      if (job_cancelled_) {
        link_->Close("cancelled");
        groups_->Close("cancelled");
      }
    }
    ScrambledReporter scrambled(*coordinator_, a.spec().train().steps());
    MeteredReporter reporter(options_.scramble_reports ? static_cast<StageReporter&>(scrambled) : *coordinator_,
                             *metrics_);
    activity_.Begin(a.job_id(), a.plan_epoch(), a.stage(), a.replica());
    data::DataAccess data_access;
    data_access.root = options_.data_root;
    data_access.cancelled = &job_cancelled_;
    status = RunStageJob(a, worker_id(), *backend_, **link, groups.replicas.get(), groups.tensor.get(), reporter,
                         state_cache_, job_cancelled_, job_stop_after_, data_access, &activity_);
    activity_.End();
    // Done: the peers get our last frames (the final all-reduce's) before
    // our streams end (bounded; a shutdown's Close still cuts it short).
    // Failed or cancelled: the groups' destruction aborts the streams, so
    // the peers fail at once.
    if (status.ok()) groups.Leave();
    absl::MutexLock lock(&mu_);
    link_ = nullptr;
    groups_ = nullptr;
  }
  if (status.ok()) {
    LOG(INFO) << "job " << a.job_id() << ": stage " << a.stage() << " done";
  } else {
    LOG(WARNING) << "job " << a.job_id() << ": stage " << a.stage() << " ended: " << status;
  }
}

}  // namespace shardline::worker
