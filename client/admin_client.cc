#include "client/admin_client.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/call_watchdog.h"
#include "common/cost_model.h"
#include "common/job_spec.h"
#include "common/grpc_status.h"
#include "common/input_limits.h"

namespace shardline::client {

using common::FromGrpcStatus;

AdminClient::AdminClient(const std::string& address, absl::Duration deadline,
                         std::shared_ptr<grpc::ChannelCredentials> credentials, std::string bearer_token)
    : deadline_(deadline), bearer_token_(std::move(bearer_token)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  stub_ = shardline::v1::Admin::NewStub(grpc::CreateCustomChannel(
      address, credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(), args));
}

std::unique_ptr<grpc::ClientContext> AdminClient::Context() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
  Authorize(*context);
  return context;
}

void AdminClient::Authorize(grpc::ClientContext& context) const {
  if (!bearer_token_.empty()) context.AddMetadata("authorization", "Bearer " + bearer_token_);
}

template <typename Response, typename Call>
absl::StatusOr<Response> Unary(Call call) {
  Response response;
  const grpc::Status status = call(&response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<shardline::v1::JobStatus> AdminClient::Submit(const shardline::v1::JobSpec& spec) {
  shardline::v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  auto context = Context();
  if (!spec.init().from_job().empty()) {
    // The coordinator copies the other job's weights before it answers
    // (the whole model, read and written): at 100 MB/s.
    const int64_t bytes = 4 * common::UnitRangeParameters(spec.model(), 0, common::PipelineUnits(spec.model()));
    const absl::Duration copy = absl::Seconds(static_cast<double>(bytes) / 100e6);
    context->set_deadline(absl::ToChronoTime(absl::Now() + deadline_ + copy));
  }
  return Unary<shardline::v1::JobStatus>(
      [&](auto* response) { return stub_->SubmitJob(context.get(), request, response); });
}

absl::StatusOr<shardline::v1::JobStatus> AdminClient::Get(const std::string& job_id) {
  shardline::v1::GetJobRequest request;
  request.set_job_id(job_id);
  auto context = Context();
  return Unary<shardline::v1::JobStatus>(
      [&](auto* response) { return stub_->GetJob(context.get(), request, response); });
}

absl::StatusOr<shardline::v1::GetTraceResponse> AdminClient::Trace(const std::string& job_id, int64_t first,
                                                                    int64_t last) {
  shardline::v1::GetTraceRequest request;
  request.set_job_id(job_id);
  request.set_first_step(first);
  request.set_last_step(last);
  auto context = Context();
  return Unary<shardline::v1::GetTraceResponse>(
      [&](auto* response) { return stub_->GetTrace(context.get(), request, response); });
}

absl::StatusOr<shardline::v1::ListJobsResponse> AdminClient::ListJobs() {
  auto context = Context();
  return Unary<shardline::v1::ListJobsResponse>([&](auto* response) {
    return stub_->ListJobs(context.get(), shardline::v1::ListJobsRequest(), response);
  });
}

absl::StatusOr<shardline::v1::JobStatus> AdminClient::Cancel(const std::string& job_id) {
  shardline::v1::GetJobRequest request;
  request.set_job_id(job_id);
  auto context = Context();
  return Unary<shardline::v1::JobStatus>(
      [&](auto* response) { return stub_->CancelJob(context.get(), request, response); });
}

absl::StatusOr<shardline::v1::DeleteJobResponse> AdminClient::Delete(const std::string& job_id) {
  shardline::v1::GetJobRequest request;
  request.set_job_id(job_id);
  auto context = Context();
  return Unary<shardline::v1::DeleteJobResponse>(
      [&](auto* response) { return stub_->DeleteJob(context.get(), request, response); });
}

absl::StatusOr<shardline::v1::JobStatus> AdminClient::Replan(const std::string& job_id) {
  shardline::v1::GetJobRequest request;
  request.set_job_id(job_id);
  auto context = Context();
  return Unary<shardline::v1::JobStatus>(
      [&](auto* response) { return stub_->ReplanJob(context.get(), request, response); });
}

absl::StatusOr<shardline::v1::WorkerStatus> AdminClient::Drain(const std::string& worker, bool undo, bool at_once) {
  auto context = Context();
  shardline::v1::DrainWorkerRequest request;
  request.set_worker(worker);
  request.set_undo(undo);
  request.set_at_once(at_once);
  return Unary<shardline::v1::WorkerStatus>(
      [&](auto* response) { return stub_->DrainWorker(context.get(), request, response); });
}

absl::StatusOr<shardline::v1::ListWorkersResponse> AdminClient::ListWorkers() {
  auto context = Context();
  return Unary<shardline::v1::ListWorkersResponse>([&](auto* response) {
    return stub_->ListWorkers(context.get(), shardline::v1::ListWorkersRequest(), response);
  });
}

absl::StatusOr<shardline::v1::ListLinksResponse> AdminClient::ListLinks() {
  auto context = Context();
  return Unary<shardline::v1::ListLinksResponse>([&](auto* response) {
    return stub_->ListLinks(context.get(), shardline::v1::ListLinksRequest(), response);
  });
}

absl::StatusOr<shardline::v1::ProbeLinksResponse> AdminClient::ProbeLinks(const std::vector<std::string>& workers) {
  auto context = Context();
  shardline::v1::ProbeLinksRequest request;
  for (const std::string& w : workers) request.add_workers(w);
  return Unary<shardline::v1::ProbeLinksResponse>(
      [&](auto* response) { return stub_->ProbeLinks(context.get(), request, response); });
}

absl::StatusOr<shardline::v1::PlanResponse> AdminClient::Plan(const shardline::v1::JobSpec& spec) {
  shardline::v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  auto context = Context();
  return Unary<shardline::v1::PlanResponse>(
      [&](auto* response) { return stub_->PlanJob(context.get(), request, response); });
}

absl::StatusOr<shardline::v1::JobStatus> AdminClient::Watch(
    const std::string& job_id, const std::function<void(const shardline::v1::JobStatus&)>& on_status) {
  shardline::v1::GetJobRequest request;
  request.set_job_id(job_id);
  grpc::ClientContext context;  // no deadline: a job may run for days
  Authorize(context);
  auto reader = stub_->WatchJob(&context, request);
  shardline::v1::JobStatus status, last;
  bool any = false;
  while (reader->Read(&status)) {
    on_status(status);
    last = status;
    any = true;
  }
  const grpc::Status done = reader->Finish();
  if (!done.ok()) return FromGrpcStatus(done);
  if (!any) return absl::UnavailableError("the watch ended without a status");
  return last;
}

absl::Status AdminClient::ReadExport(const std::string& job_id, bool best,
                                     const std::function<absl::Status(const std::string&)>& sink) {
  shardline::v1::ExportWeightsRequest request;
  request.set_job_id(job_id);
  request.set_best(best);
  // However long the whole takes (a large model over a slow link), each
  // chunk must come within the deadline of the last.
  grpc::ClientContext context;
  Authorize(context);
  common::CallWatchdog watchdog(context);
  watchdog.Arm(deadline_);
  auto reader = stub_->ExportWeights(&context, request);
  shardline::v1::ExportChunk chunk;
  absl::Status local;
  int64_t received = 0;
  while (local.ok() && reader->Read(&chunk)) {
    watchdog.Disarm();  // the sink's time is ours
    received += static_cast<int64_t>(chunk.data().size());
    local = sink(chunk.data());
    watchdog.Arm(deadline_);
  }
  if (!local.ok()) context.TryCancel();
  const grpc::Status status = reader->Finish();
  watchdog.Disarm();
  if (!local.ok()) return local;
  if (watchdog.fired()) {
    return absl::DeadlineExceededError(absl::StrCat("the coordinator sent nothing of ", job_id, "'s weights for ",
                                                    absl::FormatDuration(deadline_), " (", received,
                                                    " bytes came): cancelled"));
  }
  return FromGrpcStatus(status);
}

absl::StatusOr<std::string> AdminClient::Export(const std::string& job_id, bool best) {
  std::string bytes;
  absl::Status read = ReadExport(job_id, best, [&](const std::string& data) {
    bytes += data;
    return absl::OkStatus();
  });
  if (!read.ok()) return read;
  return bytes;
}

absl::StatusOr<int64_t> AdminClient::ExportTo(const std::string& job_id, const std::string& path, bool best) {
  const std::string partial = absl::StrCat(path, ".partial.", ::getpid());
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InvalidArgumentError(absl::StrCat("cannot create ", common::Quote(partial)));
  int64_t written = 0;
  absl::Status local = ReadExport(job_id, best, [&](const std::string& data) {
    for (size_t done = 0; done < data.size();) {
      const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return absl::DataLossError(absl::StrCat("cannot write ", common::Quote(partial)));
      done += static_cast<size_t>(n);
    }
    written += static_cast<int64_t>(data.size());
    return absl::OkStatus();
  });
  if (local.ok() && ::fsync(fd) != 0) local = absl::DataLossError(absl::StrCat("cannot flush ", common::Quote(partial)));
  ::close(fd);
  if (local.ok() && ::rename(partial.c_str(), path.c_str()) != 0) {
    local = absl::InvalidArgumentError(absl::StrCat("cannot rename onto ", common::Quote(path)));
  }
  if (!local.ok()) {
    ::unlink(partial.c_str());
    return local;
  }
  return written;
}

absl::StatusOr<shardline::v1::JobStatus> AdminClient::SubmitWithWeights(const shardline::v1::JobSpec& spec,
                                                                        const std::string& path) {
  std::error_code error;
  const bool regular = std::filesystem::is_regular_file(path, error);
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  const int64_t size = regular && file ? static_cast<int64_t>(file.tellg()) : -1;
  if (size < 0) {
    return absl::NotFoundError(absl::StrCat("--init_weights: cannot read ", common::Quote(path), " (a file)"));
  }
  file.seekg(0);
  // However large the file, each chunk must be taken within the deadline.
  grpc::ClientContext context;
  Authorize(context);
  common::CallWatchdog watchdog(context);
  watchdog.Arm(deadline_);
  shardline::v1::JobStatus response;
  auto writer = stub_->SubmitJobWithWeights(&context, &response);
  shardline::v1::WeightsChunk chunk;
  *chunk.mutable_spec() = spec;
  chunk.set_total_bytes(size);
  std::string buffer(1 << 20, '\0');
  bool sending = true;
  for (int64_t sent = 0; sending && (sent < size || sent == 0);) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(buffer.size()), size - sent));
    if (!file.read(buffer.data(), static_cast<std::streamsize>(n))) {
      writer->WritesDone();
      context.TryCancel();
      (void)writer->Finish();
      return absl::DataLossError(absl::StrCat("--init_weights: ", common::Quote(path), " ended while read"));
    }
    chunk.set_data(buffer.data(), n);
    watchdog.Arm(deadline_);
    sending = writer->Write(chunk);  // false: the coordinator ended the call (its status says why)
    chunk.Clear();
    sent += static_cast<int64_t>(n);
    if (n == 0) break;
  }
  // Before it answers the coordinator reads what the transport still held
  // (chunks the writes above handed over) and flushes the file to disk.
  const absl::Duration answer = 3 * deadline_ + absl::Seconds(static_cast<double>(size) / 100e6);
  watchdog.Arm(answer);
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  watchdog.Disarm();
  if (watchdog.fired()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the coordinator took no more of the weights, or gave no answer, in time (", absl::FormatDuration(deadline_),
        " a chunk, ", absl::FormatDuration(answer), " the answer): cancelled"));
  }
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

}  // namespace shardline::client
