#include "server/coordinator_service.h"

#include <set>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_chunk_writer.h"
#include "common/grpc_metadata.h"
#include "common/grpc_status.h"
#include "common/input_limits.h"
#include "common/safetensors.h"
#include "glog/logging.h"
#include "server/certificate_names.h"
#include "server/grid_cost.h"
#include "server/grpc_mailbox_writer.h"
#include "server/request_validation.h"

namespace shardline::server {
namespace {

using common::FinishUnary;
using common::ToGrpcStatus;

// The call names `worker_id`: it must carry that registration's secret.
absl::Status CheckWorker(const grpc::CallbackServerContext* context, WorkerRegistry& registry,
                         const std::string& worker_id) {
  return registry.Authenticate(worker_id, common::MetadataValue(*context, common::kWorkerSecretKey));
}

// Writes a shard's chunks to its upload (resumed where an earlier stream
// left it), then completes it on a thread of its own: the fsync and the
// move into place may take seconds for a large shard, too long to hold one
// of gRPC's callback threads.
class ShardReader final : public grpc::ServerReadReactor<shardline::v1::ShardChunk> {
 public:
  ShardReader(JobManager& jobs, WorkerRegistry& registry, std::string secret,
              shardline::v1::ReportShardResponse* response)
      : jobs_(jobs), registry_(registry), secret_(std::move(secret)), response_(response) {
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return Complete();
    if (writer_ == nullptr) {
      const shardline::v1::ShardHeader& h = chunk_.header();
      if (!chunk_.has_header()) {
        return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first shard chunk needs a header"));
      }
      if (absl::Status s = ValidateRequest(h); !s.ok()) return Finish(ToGrpcStatus(s));
      if (absl::Status s = registry_.Authenticate(h.worker_id(), secret_); !s.ok()) return Finish(ToGrpcStatus(s));
      header_ = h;
      absl::StatusOr<std::unique_ptr<ShardUploads::Writer>> writer = jobs_.BeginShard(header_);
      if (!writer.ok()) return Finish(ToGrpcStatus(writer.status()));
      writer_ = std::move(*writer);
      if (writer_->offset() != header_.offset()) {
        // Not where the worker thinks: it sends again from what is here.
        response_->set_resume_offset(writer_->offset());
        writer_.reset();
        return Finish(grpc::Status::OK);
      }
    } else if (chunk_.has_header()) {
      return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a second shard header"));
    }
    if (!chunk_.data().empty()) {
      // A stream whose epoch went stale ends now, not after the last byte.
      absl::Status status = jobs_.CheckShard(header_);
      if (status.ok()) status = writer_->Append(chunk_.data());
      if (!status.ok()) return Finish(ToGrpcStatus(status));
    }
    StartRead(&chunk_);
  }

  void OnDone() override {
    // gRPC may run OnDone on the thread that called Finish.
    if (completion_.joinable()) {
      if (completion_.get_id() == std::this_thread::get_id()) {
        completion_.detach();
      } else {
        completion_.join();
      }
    }
    delete this;
  }

 private:
  void Complete() {
    if (writer_ == nullptr) {
      return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a shard stream without a header"));
    }
    completion_ = std::thread([this] {
      absl::StatusOr<bool> committed = jobs_.CompleteShard(header_, *writer_);
      writer_.reset();
      if (committed.ok()) {
        response_->set_stored(true);
        response_->set_committed(*committed);
      }
      Finish(ToGrpcStatus(committed.status()));
    });
  }

  JobManager& jobs_;
  WorkerRegistry& registry_;
  const std::string secret_;  // the call's worker secret
  shardline::v1::ReportShardResponse* const response_;
  shardline::v1::ShardChunk chunk_;
  shardline::v1::ShardHeader header_;
  std::unique_ptr<ShardUploads::Writer> writer_;
  std::thread completion_;
};

}  // namespace

std::shared_ptr<CoordinatorService::AssignmentMailbox> CoordinatorService::Renew(
    std::shared_ptr<AssignmentMailbox>& slot) {
  auto fresh = std::make_shared<AssignmentMailbox>(AssignmentMailbox::kUnlimited);
  if (slot != nullptr) {
    for (shardline::v1::Assignment& unsent : slot->TakeUnsent()) fresh->Push(std::move(unsent));
  }
  slot = fresh;
  return fresh;
}

void CoordinatorService::Deliver(const std::string& worker_id, shardline::v1::Assignment assignment) {
  // Under the lock, so that a watch renewing the mailbox takes it along.
  absl::MutexLock lock(&mu_);
  std::shared_ptr<AssignmentMailbox>& mailbox = mailboxes_[worker_id];
  if (mailbox != nullptr && mailbox->Push(assignment)) return;
  Renew(mailbox)->Push(std::move(assignment));  // no stream now: kept for the next watch
}

grpc::ServerUnaryReactor* CoordinatorService::Register(grpc::CallbackServerContext* context,
                                                       const shardline::v1::RegisterRequest* request,
                                                       shardline::v1::RegisterResponse* response) {
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return FinishUnary(context, s);
  if (bind_worker_names_) {
    const absl::Status s = CheckWorkerName(request->name(), CertificateNames(context->auth_context().get()));
    if (!s.ok()) {
      LOG(WARNING) << "registration refused: " << s.message();
      return FinishUnary(context, s);
    }
  }
  absl::StatusOr<std::string> id = registry_.Register(request->name(), request->capabilities());
  if (!id.ok()) return FinishUnary(context, id.status());
  {
    absl::MutexLock lock(&mu_);
    mailboxes_[*id] = std::make_shared<AssignmentMailbox>(AssignmentMailbox::kUnlimited);
  }
  response->set_worker_id(*id);
  response->set_worker_secret(registry_.Get(*id)->secret);
  response->set_lease_ms(absl::ToInt64Milliseconds(registry_.lease()));
  // Its links to every live worker are unknown (or were measured by a
  // worker of the same name before): measure them as it goes idle. The
  // links of workers the registry forgot go (only then: a scan of them all).
  const uint64_t forgotten = registry_.forgotten();  // first: one forgotten after is retained next time
  const std::shared_ptr<const WorkerAvailability> workers = registry_.Availability();
  std::vector<std::string> live;
  for (const auto& [name, address] : workers->address) live.push_back(name);
  bool retain = false;
  {
    absl::MutexLock lock(&mu_);
    retain = forgotten != retained_;
    retained_ = forgotten;
  }
  if (retain) {
    std::set<std::string> known(live.begin(), live.end());
    known.insert(workers->absent.begin(), workers->absent.end());  // lost ones are shown a while
    jobs_->links().Retain(known);
  }
  WorkerRecord joined;
  joined.capabilities = request->capabilities();
  jobs_->links().Joined(request->name(), HostOf(joined), live);
  jobs_->Schedule();  // a pending job may have been waiting for this worker
  return FinishUnary(context, absl::OkStatus());
}

void CoordinatorService::AddProbeTarget(const WorkerRecord& worker,
                                        google::protobuf::RepeatedPtrField<shardline::v1::ProbeTarget>* targets) {
  if (worker.lost || worker.drained) return;
  LinkTable& links = jobs_->links();
  // It measures links while idle; busy, it only checks a link in doubt.
  const bool idle = worker.job_id.empty();
  const std::vector<std::string> queued = idle ? links.QueuedFrom(worker.name) : std::vector<std::string>();
  if (queued.empty() && !links.CheckDue(worker.name)) return;  // almost always
  const std::shared_ptr<const WorkerAvailability> workers = registry_.Availability();
  for (const std::string& peer : queued) {
    if (workers->address.count(peer)) continue;
    LinkRecord failed;
    failed.to = peer;
    failed.error = "the peer is lost";
    links.Record(worker.name, {failed});
  }
  std::optional<std::string> peer = queued.empty() ? std::nullopt : links.Claim(worker.name, workers->unavailable);
  const bool check = !peer.has_value();
  if (check) peer = links.ClaimCheck(worker.name, workers->busy, workers->absent);
  if (!peer.has_value()) return;
  shardline::v1::ProbeTarget* target = targets->Add();
  target->set_worker(*peer);
  auto address = workers->address.find(*peer);
  target->set_address(address == workers->address.end() ? "" : address->second);
  if (check) {
    target->set_max_transfer_bytes(LinkTable::kCheckBytes);
    const bool measured = links.Get(worker.name, *peer).has_value();
    LOG(INFO) << "checking the link " << worker.name << " -> " << *peer
              << (measured ? " (in doubt: found over 3x slower than before)" : " (never measured)")
              << ", transfers of " << (LinkTable::kCheckBytes >> 20) << " MiB at most"
              << (workers->busy.count(worker.name) || workers->busy.count(*peer) ? " beside a job" : "");
  }
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* context,
                                                        const shardline::v1::HeartbeatRequest* request,
                                                        shardline::v1::HeartbeatResponse* response) {
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = CheckWorker(context, registry_, request->worker_id()); !s.ok()) return FinishUnary(context, s);
  response->set_lease_ms(absl::ToInt64Milliseconds(registry_.lease()));
  absl::Status status = registry_.Heartbeat(request->worker_id(), request->activity());
  if (status.ok()) {
    if (request->has_compute()) registry_.NoteComputeProbe(request->worker_id(), request->compute().gemm_flops());
    absl::StatusOr<WorkerRecord> record = registry_.Get(request->worker_id());
    response->set_drained(record.ok() && record->drained);
    if (record.ok()) AddProbeTarget(*record, response->mutable_probe_targets());
    // Never beside a link probe on its host: the GEMM would slow the probe's
    // transfers (a wrong link figure planned on), and the probe the GEMM.
    response->set_measure_compute(record.ok() && response->probe_targets().empty() &&
                                  !jobs_->links().HostProbing(record->name) &&
                                  registry_.AskComputeProbe(request->worker_id()));
  }
  return FinishUnary(context, status);
}

grpc::ServerUnaryReactor* CoordinatorService::ReportLinks(grpc::CallbackServerContext* context,
                                                          const shardline::v1::ReportLinksRequest* request,
                                                          shardline::v1::ReportLinksResponse* response) {
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = CheckWorker(context, registry_, request->worker_id()); !s.ok()) return FinishUnary(context, s);
  absl::StatusOr<WorkerRecord> record = registry_.Get(request->worker_id());
  if (!record.ok()) return FinishUnary(context, record.status());
  std::vector<LinkRecord> links;
  for (const shardline::v1::LinkMeasurement& m : request->links()) {
    LinkRecord& link = links.emplace_back();
    link.to = m.to_worker();
    link.bytes_per_second = m.bytes_per_second();
    link.spread = m.bytes_per_second_spread();
    link.rtt_seconds = m.rtt_seconds();
    link.error = m.error();
  }
  const uint64_t recoveries = jobs_->links().recoveries();
  jobs_->links().Record(record->name, std::move(links));
  for (const LinkRecovery& back : jobs_->links().RecoveredSince(recoveries)) {
    LOG(INFO) << "link " << back.what << ": no longer in doubt";
  }
  jobs_->Schedule();  // a job re-planning may have waited for these
  AddProbeTarget(*record, response->mutable_probe_targets());
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::Leave(grpc::CallbackServerContext* context,
                                                    const shardline::v1::LeaveRequest* request,
                                                    shardline::v1::LeaveResponse* response) {
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = CheckWorker(context, registry_, request->worker_id()); !s.ok()) return FinishUnary(context, s);
  absl::StatusOr<WorkerRecord> left = registry_.Leave(request->worker_id());
  if (!left.ok()) return FinishUnary(context, left.status());
  LOG(INFO) << "worker " << left->name << " left: " << request->reason();
  jobs_->WorkersLost({*left}, absl::StrCat("left: ", request->reason().empty() ? "it is shutting down" : request->reason()));
  {
    absl::MutexLock lock(&mu_);
    mailboxes_.erase(request->worker_id());
  }
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerWriteReactor<shardline::v1::Assignment>* CoordinatorService::WatchAssignments(
    grpc::CallbackServerContext* context, const shardline::v1::WatchAssignmentsRequest* request) {
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return new RejectedWriter<shardline::v1::Assignment>(ToGrpcStatus(s));
  if (absl::Status s = CheckWorker(context, registry_, request->worker_id()); !s.ok()) {
    return new RejectedWriter<shardline::v1::Assignment>(ToGrpcStatus(s));
  }
  absl::StatusOr<WorkerRecord> worker = registry_.Get(request->worker_id());
  if (!worker.ok() || worker->lost) {
    return new RejectedWriter<shardline::v1::Assignment>(grpc::Status(
        grpc::StatusCode::NOT_FOUND, absl::StrCat("worker ", request->worker_id(), " is not registered")));
  }
  // Each watch its own mailbox: after a broken stream the worker watches
  // again and gets what the old one did not deliver (a broken write's too).
  std::shared_ptr<AssignmentMailbox> mailbox;
  {
    absl::MutexLock lock(&mu_);
    mailbox = Renew(mailboxes_[request->worker_id()]);
  }
  return new MailboxWriter<shardline::v1::Assignment>(std::move(mailbox), [](const auto&) { return false; });
}

grpc::ServerUnaryReactor* CoordinatorService::ReportStep(grpc::CallbackServerContext* context,
                                                         const shardline::v1::ReportStepRequest* request,
                                                         shardline::v1::ReportStepResponse* response) {
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = CheckWorker(context, registry_, request->worker_id()); !s.ok()) return FinishUnary(context, s);
  absl::StatusOr<bool> stop = jobs_->ReportStep(*request);
  if (stop.ok()) response->set_stop(*stop);
  return FinishUnary(context, stop.status());
}

grpc::ServerReadReactor<shardline::v1::ShardChunk>* CoordinatorService::ReportShard(
    grpc::CallbackServerContext* context, shardline::v1::ReportShardResponse* response) {
  return new ShardReader(*jobs_, registry_, common::MetadataValue(*context, common::kWorkerSecretKey), response);
}

grpc::ServerWriteReactor<shardline::v1::ShardChunk>* CoordinatorService::FetchState(
    grpc::CallbackServerContext* context, const shardline::v1::FetchStateRequest* request) {
  if (absl::Status s = ValidateRequest(*request); !s.ok()) return new RejectedWriter<shardline::v1::ShardChunk>(ToGrpcStatus(s));
  if (absl::Status s = CheckWorker(context, registry_, request->worker_id()); !s.ok()) {
    return new RejectedWriter<shardline::v1::ShardChunk>(ToGrpcStatus(s));
  }
  absl::StatusOr<common::SafetensorsContents> contents = jobs_->FetchState(*request);
  absl::StatusOr<std::string> bytes = contents.ok() ? common::SerializeSafetensors(*contents) : contents.status();
  if (!bytes.ok()) return new RejectedWriter<shardline::v1::ShardChunk>(common::ToGrpcStatus(bytes.status()));
  shardline::v1::ShardHeader header;
  header.set_job_id(request->job_id());
  header.set_plan_epoch(request->plan_epoch());
  header.set_stage(request->stage());
  int64_t step = -1;
  (void)absl::SimpleAtoi(contents->metadata["step"], &step);
  header.set_step(step);
  header.set_total_bytes(static_cast<int64_t>(bytes->size()));
  return new common::ChunkWriter<shardline::v1::ShardChunk>(
      std::move(*bytes), [header](shardline::v1::ShardChunk& first) { *first.mutable_header() = header; });
}

}  // namespace shardline::server
