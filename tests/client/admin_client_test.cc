// AdminClient's weight streams against a coordinator that is slow or stops:
// a stream longer than the deadline that keeps moving completes; one whose
// next chunk is later than the deadline is cut with DEADLINE_EXCEEDED, not
// left hanging (a fake Admin service on loopback, port 0).
#include "client/admin_client.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "shardline/v1/admin.grpc.pb.h"
#include "tests/testing/loopback_server.h"

namespace shardline::client {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(1);
constexpr int kChunks = 6;  // with a pause of 0.3 deadlines before each: 1.8 deadlines in all

// Waits `pause`, or less if the call is cancelled; false when it was.
bool Pause(grpc::ServerContext* context, absl::Duration pause) {
  const absl::Time until = absl::Now() + pause;
  while (absl::Now() < until) {
    if (context->IsCancelled()) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return !context->IsCancelled();
}

// "slow": kChunks chunks, each after 0.3 deadlines. "stalls": one
// chunk, then nothing until cancelled (bounded at 20 s).
class FakeAdmin final : public shardline::v1::Admin::Service {
 public:
  // As a coordinator copying a large model's weights: 1.5 deadlines.
  grpc::Status SubmitJob(grpc::ServerContext* context, const shardline::v1::SubmitJobRequest* request,
                         shardline::v1::JobStatus* response) override {
    if (!Pause(context, kDeadline * 1.5)) return grpc::Status::CANCELLED;
    response->set_job_id("job-8");
    return grpc::Status::OK;
  }

  grpc::Status ExportWeights(grpc::ServerContext* context, const shardline::v1::ExportWeightsRequest* request,
                             grpc::ServerWriter<shardline::v1::ExportChunk>* writer) override {
    shardline::v1::ExportChunk chunk;
    chunk.set_data(std::string(1000, 'w'));
    const bool stalls = request->job_id() == "stalls";
    for (int i = 0; i < (stalls ? 1 : kChunks); ++i) {
      if (!Pause(context, kDeadline * 0.3) || !writer->Write(chunk)) return grpc::Status::CANCELLED;
    }
    if (stalls) Pause(context, absl::Seconds(20));
    return grpc::Status::OK;
  }

  grpc::Status SubmitJobWithWeights(grpc::ServerContext* context,
                                    grpc::ServerReader<shardline::v1::WeightsChunk>* reader,
                                    shardline::v1::JobStatus* response) override {
    shardline::v1::WeightsChunk chunk;
    int64_t received = 0;
    bool first = true;
    std::string name;
    while (reader->Read(&chunk)) {
      if (first) name = chunk.spec().name();
      first = false;
      received += static_cast<int64_t>(chunk.data().size());
      if (name == "stalls") {
        Pause(context, absl::Seconds(20));  // reads no more
        return grpc::Status::CANCELLED;
      }
      if (!Pause(context, kDeadline * 0.3)) return grpc::Status::CANCELLED;
    }
    response->set_job_id("job-7");
    response->set_checkpoint_bytes(received);
    return grpc::Status::OK;
  }
};

class AdminClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::shardline::testing::LoopbackServer started = ::shardline::testing::StartLoopbackServer({&service_});
    ASSERT_NE(started.server, nullptr);
    server_ = std::move(started.server);
    client_ = std::make_unique<AdminClient>(started.address(), kDeadline);
    dir_ = std::filesystem::temp_directory_path() / ("admin_client_test." + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    std::filesystem::remove_all(dir_);
  }

  // A file of kChunks megabytes (the client sends 1 MiB chunks).
  std::string WeightsFile() {
    const std::string path = (dir_ / "w.safetensors").string();
    std::ofstream(path, std::ios::binary) << std::string(kChunks << 20, 'x');
    return path;
  }

  FakeAdmin service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<AdminClient> client_;
  std::filesystem::path dir_;
};

TEST_F(AdminClientTest, AnExportLongerThanTheDeadlineCompletesWhileChunksCome) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> bytes = client_->Export("slow");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->size(), static_cast<size_t>(kChunks * 1000));
  EXPECT_GT(absl::Now() - start, kDeadline) << "longer than one deadline in all";
}

TEST_F(AdminClientTest, AnExportWhoseNextChunkIsLateIsCut) {
  const std::string path = (dir_ / "out.safetensors").string();
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> written = client_->ExportTo("stalls", path);
  EXPECT_EQ(written.status().code(), absl::StatusCode::kDeadlineExceeded) << written.status();
  EXPECT_TRUE(absl::StrContains(written.status().message(), "sent nothing of stalls's weights for 1s (1000 bytes"))
      << written.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "cut, not waited out";
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), {}), 0) << "no partial file left";
}

// A job that starts from another's weights waits for their copy: a
// deadline and a second per 100 MB of the model (here 85.5M parameters,
// 342 MB: 4.4 s in all), where any other submission has the deadline (1 s).
TEST_F(AdminClientTest, ASubmissionThatCopiesWeightsWaitsAsLongAsTheModelTakes) {
  shardline::v1::JobSpec spec;
  auto* model = spec.mutable_model();
  model->set_vocab_size(256);
  model->set_context(128);
  model->set_d_model(768);
  model->set_n_heads(12);
  model->set_n_layers(12);
  absl::StatusOr<shardline::v1::JobStatus> plain = client_->Submit(spec);
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kDeadlineExceeded) << plain.status();
  spec.mutable_init()->set_from_job("job-3");
  absl::StatusOr<shardline::v1::JobStatus> copied = client_->Submit(spec);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(copied->job_id(), "job-8");
}

TEST_F(AdminClientTest, WeightsSentLongerThanTheDeadlineAreTakenWhileChunksMove) {
  shardline::v1::JobSpec spec;
  spec.set_name("slow");
  absl::StatusOr<shardline::v1::JobStatus> job = client_->SubmitWithWeights(spec, WeightsFile());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->job_id(), "job-7");
  EXPECT_EQ(job->checkpoint_bytes(), int64_t{kChunks} << 20);
}

TEST_F(AdminClientTest, WeightsACoordinatorStopsTakingAreCut) {
  shardline::v1::JobSpec spec;
  spec.set_name("stalls");
  const absl::Time start = absl::Now();
  absl::StatusOr<shardline::v1::JobStatus> job = client_->SubmitWithWeights(spec, WeightsFile());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kDeadlineExceeded) << job.status();
  EXPECT_TRUE(absl::StrContains(job.status().message(), "took no more of the weights")) << job.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace shardline::client
