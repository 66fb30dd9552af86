// Admin.ExportWeights over gRPC: the committed version, or with `best` the
// version early stopping keeps (train.early_stopping), while the job runs.
#include <string>

#include "common/safetensors.h"
#include "tests/server/coordinator_service_fixture.h"

namespace shardline::server {
namespace {

using grpc::StatusCode;
using testing::CoordinatorServiceTest;

// A one-stage shard of `step` holding one tensor of value `step`.
ShardReport OneShard(const std::string& job, int64_t step) {
  ShardReport r;
  r.key = {job, /*shard=*/0, /*shard_count=*/1, step, /*epoch=*/0};
  common::Tensor t = *common::Tensor::Zeros(common::DType::kF32, {2});
  for (float& x : t.values<float>()) x = static_cast<float>(step);
  r.contents.tensors.emplace("tok_emb.weight", std::move(t));
  return r;
}

class AdminExportTest : public CoordinatorServiceTest {
 protected:
  // The exported file, or the call's status.
  absl::StatusOr<common::SafetensorsContents> Export(const std::string& job, bool best) {
    grpc::ClientContext context;
    shardline::v1::ExportWeightsRequest request;
    request.set_job_id(job);
    request.set_best(best);
    auto reader = admin_stub_->ExportWeights(&context, request);
    std::string bytes;
    shardline::v1::ExportChunk chunk;
    while (reader->Read(&chunk)) bytes += chunk.data();
    const grpc::Status status = reader->Finish();
    if (!status.ok()) return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
    return common::ParseSafetensors(bytes);
  }
};

TEST_F(AdminExportTest, BestExportsTheKeptVersionWhileTheCommittedOneMovesOn) {
  ASSERT_TRUE(Register("w0").ok());
  grpc::Status status;
  const shardline::v1::JobStatus job = Submit(Spec(), &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(*weights_->Report(OneShard(job.job_id(), 2)));
  auto none = Export(job.job_id(), /*best=*/true);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << "nothing kept yet";
  EXPECT_NE(none.status().message().find("train.early_stopping"), std::string::npos) << none.status();

  ASSERT_TRUE(weights_->KeepVersion(job.job_id(), 2).ok());
  ASSERT_TRUE(*weights_->Report(OneShard(job.job_id(), 4)));
  auto best = Export(job.job_id(), /*best=*/true);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->metadata.at("step"), "2");
  EXPECT_EQ(best->metadata.at("job_id"), job.job_id());
  EXPECT_EQ(best->tensors.at("tok_emb.weight").values<float>()[0], 2.0f);
  auto latest = Export(job.job_id(), /*best=*/false);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->metadata.at("step"), "4");

  EXPECT_EQ(Export("", true).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Export("job-404", true).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(StillServing());
}

}  // namespace
}  // namespace shardline::server
