#include "server/weights_upload.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/model_layout.h"
#include "common/random_token.h"
#include "common/safetensors_file.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"

namespace shardline::server {

WeightsUpload::WeightsUpload(JobManager& jobs, WeightStore& weights, std::string who,
                             shardline::v1::JobStatus* response,
                             std::function<void(const shardline::v1::JobStatus&)> submitted)
    : jobs_(jobs), weights_(weights), who_(std::move(who)), response_(response), submitted_(std::move(submitted)) {
  StartRead(&chunk_);
}

void WeightsUpload::OnReadDone(bool ok) {
  if (!ok) {
    if (total_ < 0) return Fail(absl::InvalidArgumentError("no job spec: the stream was empty"));
    if (written_ != total_) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("the weights ended at ", written_, " of the ", total_, " bytes announced")));
    }
    completion_ = std::thread([this] { Complete(); });
    return;
  }
  absl::Status status;
  if (total_ < 0) {
    status = Begin();
  } else if (chunk_.has_spec() || chunk_.total_bytes() != 0) {
    status = absl::InvalidArgumentError("a spec or length after the first message");
  }
  if (status.ok() && !chunk_.data().empty()) status = Append(chunk_.data());
  if (!status.ok()) return Fail(status);
  StartRead(&chunk_);
}

absl::Status WeightsUpload::Begin() {
  if (!chunk_.has_spec()) return absl::InvalidArgumentError("the first message needs the job spec");
  spec_ = chunk_.spec();
  RETURN_IF_ERROR(common::ValidateJobSpec(spec_));
  if (!spec_.init().from_job().empty()) {
    return absl::InvalidArgumentError(
        "init.from_job and the weights sent both say where the job starts: give one");
  }
  if (chunk_.total_bytes() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("total_bytes is ", chunk_.total_bytes(), ", must be positive"));
  }
  // Room for it, and a margin, where the checkpoints live.
  path_ = weights_.UploadPath(absl::StrCat("weights-", common::RandomToken(), ".part"));
  struct statvfs fs {};
  if (::statvfs(std::filesystem::path(path_).parent_path().c_str(), &fs) == 0) {
    const uint64_t free = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    if (static_cast<uint64_t>(chunk_.total_bytes()) + (uint64_t{1} << 30) > free) {
      return absl::ResourceExhaustedError(absl::StrCat("the coordinator's --state_dir has ", free,
                                                       " bytes free: not room for ", chunk_.total_bytes(),
                                                       " bytes of weights and 1 GiB to spare"));
    }
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd_ < 0) return absl::InternalError(absl::StrCat("cannot create ", path_, ": ", std::strerror(errno)));
  total_ = chunk_.total_bytes();
  return absl::OkStatus();
}

absl::Status WeightsUpload::Append(const std::string& bytes) {
  if (static_cast<int64_t>(bytes.size()) > total_ - written_) {
    return absl::InvalidArgumentError(absl::StrCat("more than the ", total_, " bytes announced"));
  }
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat("cannot write ", path_, ": ", std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
  digest_.Update(bytes);
  written_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

void WeightsUpload::Complete() {
  const absl::Status status = Submit();
  if (!status.ok()) return Fail(status);
  Finish(grpc::Status::OK);
}

absl::Status WeightsUpload::Submit() {
  if (::fsync(fd_) != 0) return absl::InternalError(absl::StrCat("cannot flush ", path_));
  ::close(fd_);
  fd_ = -1;
  int64_t step = -1;  // the step their metadata names, if any
  {
    absl::StatusOr<std::unique_ptr<common::SafetensorsFile>> file = common::SafetensorsFile::Open(path_);
    if (!file.ok()) {
      // Without the coordinator's own path in it.
      absl::string_view why = file.status().message();
      absl::ConsumePrefix(&why, path_ + ": ");
      return absl::InvalidArgumentError(absl::StrCat("the weights sent are no safetensors file: ", why));
    }
    // Weights shardctl export or shardline-train wrote name their model:
    // another model's are told apart by its spec. Any file must hold this
    // model's tensors, each with its whole shape.
    const auto& metadata = (*file)->index().metadata;
    const auto written_for = metadata.find("spec");
    if (written_for != metadata.end()) {
      absl::StatusOr<shardline::v1::JobSpec> theirs = common::ParseJobSpec(written_for->second);
      if (!theirs.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("the weights sent: their spec: ", theirs.status().message()));
      }
      if (!google::protobuf::util::MessageDifferencer::Equals(theirs->model(), spec_.model())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the weights sent are of another model (", theirs->model().ShortDebugString(), ") than this spec's (",
            spec_.model().ShortDebugString(), "): they fit only the same model"));
      }
    }
    RETURN_IF_ERROR(common::CheckWeightsFitModel((*file)->index(), spec_.model(), "the weights sent"));
    const auto at = metadata.find("step");
    if (at != metadata.end() && (!absl::SimpleAtoi(at->second, &step) || step < 0)) step = -1;
  }
  absl::StatusOr<shardline::v1::JobStatus> job = jobs_.SubmitWithWeights(spec_, who_, path_, digest_.Finish(), step);
  if (!job.ok()) return job.status();
  path_.clear();  // moved into the store
  if (submitted_) submitted_(*job);
  *response_ = *std::move(job);
  return absl::OkStatus();
}

void WeightsUpload::Fail(const absl::Status& status) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!path_.empty()) {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
    path_.clear();
  }
  Finish(common::ToGrpcStatus(status));
}

void WeightsUpload::OnDone() {
  // gRPC may run OnDone on the thread that called Finish.
  if (completion_.joinable()) {
    if (completion_.get_id() == std::this_thread::get_id()) {
      completion_.detach();
    } else {
      completion_.join();
    }
  }
  if (fd_ >= 0) ::close(fd_);
  if (!path_.empty()) {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  delete this;
}

}  // namespace shardline::server
