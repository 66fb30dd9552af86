#include "worker/grpc_coordinator_client.h"

#include <algorithm>

#include "common/grpc_status.h"

namespace shardline::worker {

using common::FromGrpcStatus;

GrpcCoordinatorClient::GrpcCoordinatorClient(const std::string& address, absl::Duration deadline)
    : deadline_(deadline) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  stub_ = shardline::v1::Coordinator::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

void GrpcCoordinatorClient::SetDeadline(grpc::ClientContext& context) const {
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
}

absl::StatusOr<shardline::v1::RegisterResponse> GrpcCoordinatorClient::Register(
    const shardline::v1::RegisterRequest& request) {
  grpc::ClientContext context;
  SetDeadline(context);
  context.set_wait_for_ready(true);  // the coordinator may still be starting
  shardline::v1::RegisterResponse response;
  const grpc::Status status = stub_->Register(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::Status GrpcCoordinatorClient::Heartbeat(const std::string& worker_id) {
  grpc::ClientContext context;
  SetDeadline(context);
  shardline::v1::HeartbeatRequest request;
  request.set_worker_id(worker_id);
  shardline::v1::HeartbeatResponse response;
  return FromGrpcStatus(stub_->Heartbeat(&context, request, &response));
}

absl::Status GrpcCoordinatorClient::WatchAssignments(
    const std::string& worker_id,
    const std::function<void(const shardline::v1::Assignment&)>& on_assignment) {
  grpc::ClientContext context;  // no deadline: the stream lives as long as the worker
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_context_ = &context;
  }
  shardline::v1::WatchAssignmentsRequest request;
  request.set_worker_id(worker_id);
  auto reader = stub_->WatchAssignments(&context, request);
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
  grpc::ClientContext context;
  SetDeadline(context);
  shardline::v1::ReportStepResponse response;
  const grpc::Status status = stub_->ReportStep(&context, report, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.stop();
}

absl::Status GrpcCoordinatorClient::ReportShard(const shardline::v1::ShardHeader& header,
                                                const std::string& bytes) {
  constexpr size_t kChunk = 1 << 20;
  grpc::ClientContext context;
  SetDeadline(context);
  shardline::v1::ReportShardResponse response;
  auto writer = stub_->ReportShard(&context, &response);
  size_t offset = 0;
  bool ok = true;
  do {
    shardline::v1::ShardChunk chunk;
    if (offset == 0) *chunk.mutable_header() = header;
    const size_t n = std::min(kChunk, bytes.size() - offset);
    chunk.set_data(bytes.data() + offset, n);
    offset += n;
    ok = writer->Write(chunk);
  } while (ok && offset < bytes.size());
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

}  // namespace shardline::worker
