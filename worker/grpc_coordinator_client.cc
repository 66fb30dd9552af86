#include "worker/grpc_coordinator_client.h"

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/call_watchdog.h"
#include "common/grpc_metadata.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "shardline/v1/stage_link.grpc.pb.h"

namespace shardline::worker {

using common::FromGrpcStatus;

GrpcCoordinatorClient::GrpcCoordinatorClient(const std::string& address, absl::Duration deadline,
                                             std::shared_ptr<grpc::ChannelCredentials> credentials)
    : address_(address),
      deadline_(deadline),
      credentials_(credentials != nullptr ? std::move(credentials) : grpc::InsecureChannelCredentials()) {
  Reconnect();
}

void GrpcCoordinatorClient::Reconnect() {
  std::lock_guard<std::mutex> lock(stubs_mu_);
  ++connections_;
  // Two connections: checkpoints and state (megabytes, as long as the
  // link takes) on one, heartbeats, step reports and assignments on the
  // other. On one connection a heartbeat waits behind whatever state
  // bytes fill the socket's buffers: on a slow link that is seconds, more
  // than a lease. Channels whose arguments differ never share one (and so
  // a reconnection's channels never share the old ones').
  const auto channel = [&](const char* purpose) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
    // gRPC waits up to 120 s between attempts after failed ones: a
    // coordinator back from a restart, or a certificate replaced after a
    // revocation, would wait as long for its workers.
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
    args.SetString("shardline.connection", purpose);
    args.SetInt("shardline.connections", connections_);
    return grpc::CreateCustomChannel(address_, credentials_, args);
  };
  stub_ = shardline::v1::Coordinator::NewStub(channel("control"));
  bulk_stub_ = shardline::v1::Coordinator::NewStub(channel("bulk"));
}

std::shared_ptr<shardline::v1::Coordinator::Stub> GrpcCoordinatorClient::Control() {
  std::lock_guard<std::mutex> lock(stubs_mu_);
  return stub_;
}

std::shared_ptr<shardline::v1::Coordinator::Stub> GrpcCoordinatorClient::Bulk() {
  std::lock_guard<std::mutex> lock(stubs_mu_);
  return bulk_stub_;
}

void GrpcCoordinatorClient::SetDeadline(grpc::ClientContext& context) const {
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
}

void GrpcCoordinatorClient::Authorize(grpc::ClientContext& context) {
  std::lock_guard<std::mutex> lock(registration_mu_);
  if (!worker_secret_.empty()) context.AddMetadata(common::kWorkerSecretKey, worker_secret_);
}

std::string GrpcCoordinatorClient::worker_id() {
  std::lock_guard<std::mutex> lock(registration_mu_);
  return worker_id_;
}

absl::StatusOr<shardline::v1::RegisterResponse> GrpcCoordinatorClient::Register(
    const shardline::v1::RegisterRequest& request) {
  grpc::ClientContext context;
  SetDeadline(context);
  context.set_wait_for_ready(true);  // the coordinator may still be starting
  shardline::v1::RegisterResponse response;
  const grpc::Status status = Control()->Register(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  std::lock_guard<std::mutex> lock(registration_mu_);
  worker_id_ = response.worker_id();
  worker_secret_ = response.worker_secret();
  return response;
}

absl::StatusOr<shardline::v1::HeartbeatResponse> GrpcCoordinatorClient::Heartbeat(
    const std::string& worker_id, const std::optional<shardline::v1::StageActivity>& activity,
    const std::optional<shardline::v1::ComputeProbe>& compute) {
  grpc::ClientContext context;
  SetDeadline(context);
  Authorize(context);
  shardline::v1::HeartbeatRequest request;
  request.set_worker_id(worker_id);
  if (activity.has_value()) *request.mutable_activity() = *activity;
  if (compute.has_value()) *request.mutable_compute() = *compute;
  shardline::v1::HeartbeatResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(Control()->Heartbeat(&context, request, &response)));
  return response;
}

absl::StatusOr<shardline::v1::ReportLinksResponse> GrpcCoordinatorClient::ReportLinks(
    const shardline::v1::ReportLinksRequest& request) {
  grpc::ClientContext context;
  SetDeadline(context);
  Authorize(context);
  shardline::v1::ReportLinksResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(Control()->ReportLinks(&context, request, &response)));
  return response;
}

absl::Status GrpcCoordinatorClient::Leave(const std::string& worker_id, const std::string& reason) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + std::min(deadline_, absl::Seconds(2))));
  Authorize(context);
  shardline::v1::LeaveRequest request;
  request.set_worker_id(worker_id);
  request.set_reason(reason);
  shardline::v1::LeaveResponse response;
  return FromGrpcStatus(Control()->Leave(&context, request, &response));
}

absl::Status GrpcCoordinatorClient::WatchAssignments(
    const std::string& worker_id,
    const std::function<void(const shardline::v1::Assignment&)>& on_assignment) {
  grpc::ClientContext context;  // no deadline: the stream lives as long as the worker
  Authorize(context);
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_context_ = &context;
  }
  shardline::v1::WatchAssignmentsRequest request;
  request.set_worker_id(worker_id);
  const auto stub = Control();  // held while its stream lives
  auto reader = stub->WatchAssignments(&context, request);
  shardline::v1::Assignment assignment;
  while (reader->Read(&assignment)) on_assignment(assignment);
  const grpc::Status status = reader->Finish();
  std::lock_guard<std::mutex> lock(watch_mu_);
  watch_context_ = nullptr;
  return FromGrpcStatus(status);
}

void GrpcCoordinatorClient::CancelWatch() {
  std::lock_guard<std::mutex> lock(watch_mu_);
  if (watch_context_ != nullptr) watch_context_->TryCancel();
}

absl::StatusOr<bool> GrpcCoordinatorClient::ReportStep(const shardline::v1::ReportStepRequest& report) {
  // Reports are idempotent by (job, position, step): one the coordinator
  // did not answer is sent again, with jittered exponential backoff, for
  // up to one deadline in all (a coordinator restarting, a dropped
  // connection); what it refuses is not.
  const absl::Time give_up = absl::Now() + deadline_;
  absl::Duration backoff = absl::Milliseconds(50);
  absl::BitGen random;
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    SetDeadline(context);
    Authorize(context);
    shardline::v1::ReportStepResponse response;
    const grpc::Status status = Control()->ReportStep(&context, report, &response);
    if (status.ok()) return response.stop();
    const bool transient = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    const absl::Duration wait = backoff * absl::Uniform(random, 0.5, 1.0);
    if (!transient || absl::Now() + wait >= give_up) {
      absl::Status error = FromGrpcStatus(status);
      if (attempt == 1) return error;
      return absl::Status(error.code(), absl::StrCat(error.message(), " (after ", attempt, " attempts)"));
    }
    absl::SleepFor(wait);
    backoff = std::min(2 * backoff, absl::Seconds(1));
  }
}

absl::Status GrpcCoordinatorClient::ReportShard(const ShardSnapshot& shard, const std::atomic<bool>& cancelled) {
  // In chunks, each with a deadline of its own (a large shard takes as long
  // as it takes; a stalled stream is cut). A stream that broke is resumed
  // where the coordinator's copy ends, after a jittered backoff, until no
  // byte has gone through for kPatience deadlines; what the coordinator
  // refuses is not retried.
  constexpr size_t kChunk = 1 << 20;
  constexpr int kPatience = 3;
  // Storing it (fsync, move) takes the coordinator time by the byte.
  const absl::Duration finish_limit = deadline_ + absl::Seconds(static_cast<double>(shard.size()) / 100e6);
  int64_t offset = 0;
  absl::Time last_progress = absl::Now();
  absl::Duration backoff = absl::Milliseconds(50);
  absl::BitGen random;
  for (int attempt = 1;; ++attempt) {
    if (cancelled) return absl::CancelledError("the shard upload was abandoned");
    grpc::ClientContext context;
    Authorize(context);
    shardline::v1::ReportShardResponse response;
    int64_t sent = offset;
    grpc::Status status;
    bool fired = false;
    {
      common::CallWatchdog watchdog(context, cancelled);
      watchdog.Arm(deadline_);
      const auto stub = Bulk();  // held while its stream lives
      auto writer = stub->ReportShard(&context, &response);
      shardline::v1::ShardChunk chunk;
      *chunk.mutable_header() = shard.header();
      chunk.mutable_header()->set_offset(offset);
      chunk.mutable_header()->set_worker_id(worker_id());
      bool ok = true;
      do {
        shard.Read(sent, kChunk, chunk.mutable_data());
        watchdog.Arm(deadline_);
        ok = writer->Write(chunk);
        if (ok) sent += static_cast<int64_t>(chunk.data().size());
        chunk.clear_header();
      } while (ok && sent < shard.size());
      watchdog.Arm(finish_limit);
      if (ok) writer->WritesDone();
      status = writer->Finish();
      watchdog.Disarm();
      fired = watchdog.fired();
    }
    if (status.ok() && response.stored()) return absl::OkStatus();
    if (cancelled) return absl::CancelledError("the shard upload was abandoned");
    if (status.ok()) {
      // The coordinator holds another amount than we thought: go on from there.
      if (response.resume_offset() > offset) last_progress = absl::Now();
      offset = response.resume_offset();
      if (attempt < 100) continue;
      return absl::InternalError("the coordinator keeps asking for another offset of the shard");
    }
    if (sent > offset) last_progress = absl::Now();
    offset = sent;  // a guess: the coordinator answers with what it holds
    absl::Status error = fired ? absl::DeadlineExceededError(absl::StrCat(
                                     "the coordinator took no chunk of the shard for ",
                                     absl::FormatDuration(deadline_)))
                               : FromGrpcStatus(status);
    const bool transient = fired || status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    const absl::Duration wait = backoff * absl::Uniform(random, 0.5, 1.0);
    if (!transient || absl::Now() + wait > last_progress + kPatience * deadline_) {
      if (attempt == 1) return error;
      return absl::Status(error.code(), absl::StrCat(error.message(), " (after ", attempt, " attempts)"));
    }
    LOG(WARNING) << "shard upload of step " << shard.header().step() << " broke at byte " << sent << " of "
                 << shard.size() << ": " << error << "; resuming";
    const absl::Time until = absl::Now() + wait;
    while (!cancelled && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
    backoff = std::min(2 * backoff, absl::Seconds(2));
  }
}

namespace {

// A FetchState stream (the coordinator's or a twin's): a safetensors file
// in chunks, the first with a header announcing its length. However long
// the whole takes (a large stage on a slow link), each chunk must come
// within `per_chunk` of the last: `watchdog` cuts a stalled stream.
absl::StatusOr<common::SafetensorsContents> ReadStateStream(grpc::ClientContext& context,
                                                            grpc::ClientReader<shardline::v1::ShardChunk>& reader,
                                                            common::CallWatchdog& watchdog, absl::Duration per_chunk,
                                                            const std::string& from) {
  shardline::v1::ShardChunk chunk;
  int64_t total = -1;
  std::string bytes;
  watchdog.Arm(per_chunk);
  while (reader.Read(&chunk)) {
    watchdog.Arm(per_chunk);
    if (total < 0) {
      if (!chunk.has_header() || chunk.header().total_bytes() < 0) {
        context.TryCancel();
        (void)reader.Finish();
        return absl::DataLossError(absl::StrCat(from, "'s state stream lacks its header"));
      }
      total = chunk.header().total_bytes();
      bytes.reserve(static_cast<size_t>(total));
    }
    bytes += chunk.data();
    if (static_cast<int64_t>(bytes.size()) > total) {
      context.TryCancel();
      (void)reader.Finish();
      return absl::DataLossError(absl::StrCat(from, " sent more than the ", total, " bytes it announced"));
    }
  }
  const grpc::Status status = reader.Finish();
  watchdog.Disarm();
  if (watchdog.fired()) {
    const std::string got =
        total < 0 ? std::string("its header never came") : absl::StrCat(bytes.size(), " of ", total, " bytes came");
    return absl::DeadlineExceededError(
        absl::StrCat(from, " sent nothing of the state for ", absl::FormatDuration(per_chunk), " (", got, ")"));
  }
  RETURN_IF_ERROR(FromGrpcStatus(status));
  if (static_cast<int64_t>(bytes.size()) != total) {
    return absl::DataLossError(absl::StrCat(from, "'s state stream ended at ", bytes.size(), " of ", total, " bytes"));
  }
  return common::ParseSafetensors(bytes);
}

}  // namespace

absl::StatusOr<common::SafetensorsContents> GrpcCoordinatorClient::FetchState(
    const shardline::v1::FetchStateRequest& request) {
  grpc::ClientContext context;
  Authorize(context);
  common::CallWatchdog watchdog(context);
  watchdog.Arm(deadline_);
  const auto stub = Bulk();  // held while its stream lives
  auto reader = stub->FetchState(&context, request);
  return ReadStateStream(context, *reader, watchdog, deadline_, "the coordinator");
}

absl::StatusOr<common::SafetensorsContents> GrpcCoordinatorClient::FetchStateFromTwin(
    const std::string& address, const shardline::v1::FetchStateRequest& request) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto stub = shardline::v1::WorkerState::NewStub(
      grpc::CreateCustomChannel(address, credentials_, args));
  grpc::ClientContext context;
  common::CallWatchdog watchdog(context);
  watchdog.Arm(deadline_);
  auto reader = stub->FetchState(&context, request);
  return ReadStateStream(context, *reader, watchdog, deadline_, "the twin at " + address);
}

}  // namespace shardline::worker
