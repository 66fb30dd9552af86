// JobManagerTest: a JobManager on a registry with a fake clock, a weight
// store and a coordinator store in a fresh temp dir, recording what it
// delivers to workers; Open() restarts it on the same dir. For the job
// manager's tests.
#ifndef SHARDLINE_TESTS_SERVER_JOB_MANAGER_FIXTURE_H_
#define SHARDLINE_TESTS_SERVER_JOB_MANAGER_FIXTURE_H_

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cost_model.h"
#include "common/job_spec.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "server/job_manager.h"
#include "server/stream_mailbox.h"

namespace shardline::server::testing {

using shardline::v1::Assignment;
using shardline::v1::JobStatus;

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/job-manager-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    Open();
  }
  // (Re)starts the coordinator on dir_: what a restarted process has.
  void Open() {
    jobs_.reset();
    registry_.reset();
    store_.reset();
    weights_.reset();
    delivered_.clear();
    weights_ = std::move(*WeightStore::Open(dir_));
    auto store = CoordinatorStore::Open(dir_ + "/coordinator.db");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    registry_ = std::make_unique<WorkerRegistry>(
        absl::Milliseconds(50), [this] { return now_; }, absl::StrCat("i", store_->incarnation()));
    jobs_ = std::make_unique<JobManager>(*registry_, *weights_, *store_, [this](const std::string& w, Assignment a) {
      delivered_.emplace_back(w, std::move(a));
    });
    ASSERT_TRUE(jobs_->Recover().ok());
  }
  // A worker whose StageLink listens at `address` (default NAME:1: a host each).
  std::string AddWorker(const std::string& name, double flops = 1e10, const std::string& address = "") {
    shardline::v1::WorkerCapabilities caps;
    caps.set_listen_address(address.empty() ? name + ":1" : address);
    caps.set_gemm_flops(flops);
    caps.set_memory_bytes(int64_t{1} << 30);
    auto id = registry_->Register(name, caps);
    EXPECT_TRUE(id.ok()) << id.status();
    jobs_->Schedule();
    return *id;
  }
  shardline::v1::JobSpec Spec(int stages, int steps = 2) {
    auto spec = common::ParseJobSpec(R"({"name": "t",
      "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 16, "n_heads": 2, "n_layers": 2},
      "data": {"kind": "addition", "digits": 2},
      "train": {"steps": 2, "global_batch": 2, "micro_batches": 1, "seed": 1,
                "optimizer": {"kind": "adamw", "lr": 0.01}}})");
    spec->mutable_parallel()->set_pipeline_stages(stages);
    spec->mutable_train()->set_steps(steps);
    return *spec;
  }
  // Two stages of six blocks at d_model 128: compute, not the hops, sets the pace.
  shardline::v1::JobSpec SixLayers(int steps) {
    auto spec = Spec(2, steps);
    spec.mutable_model()->set_n_layers(6);
    spec.mutable_model()->set_d_model(128);
    return spec;
  }
  shardline::v1::ReportStepRequest Report(const JobStatus& job, int stage, int64_t step) {
    shardline::v1::ReportStepRequest r;
    r.set_job_id(job.job_id());
    r.set_plan_epoch(job.plan_epoch());
    r.set_stage(stage);
    r.set_worker_id(stage_workers_.at(stage));
    r.set_step(step);
    r.set_loss(1.5 - 0.1 * step);
    r.set_tokens(100);
    r.set_step_seconds(0.5);
    r.set_busy_seconds(0.25);
    return r;
  }
  // Stage 0 of replica `replica` (a one-stage job) reports `step`, its
  // worker the one delivered_ holds it on.
  shardline::v1::ReportStepRequest ReplicaReport(const JobStatus& job, int replica, int64_t step) {
    shardline::v1::ReportStepRequest r;
    r.set_job_id(job.job_id());
    r.set_plan_epoch(job.plan_epoch());
    r.set_replica(replica);
    for (const auto& [worker, a] : delivered_) {
      if (!a.cancel() && a.replica() == replica) r.set_worker_id(worker);
    }
    r.set_step(step);
    r.set_tokens(10);
    r.set_step_seconds(0.5);
    return r;
  }
  // The busy seconds of `stage`'s units at `rate` FLOP/s (the coordinator's
  // achieved rate is its FLOPs over them).
  static double BusySeconds(const shardline::v1::JobSpec& spec, const shardline::v1::StageStatus& stage,
                            double rate) {
    const auto units = common::ModelUnitCosts(spec.model(), spec.model().context());
    double flops = 0;
    for (int u = stage.unit_begin(); u < stage.unit_end(); ++u) flops += units[static_cast<size_t>(u)].flops_per_token;
    return flops * spec.train().global_batch() * spec.model().context() / rate;
  }
  void NoteAssignments() {
    stage_workers_.clear();
    for (const auto& [worker, a] : delivered_) {
      if (!a.cancel()) stage_workers_[a.stage()] = worker;
    }
  }
  std::string Shard(int stage) {
    common::SafetensorsContents c;
    c.tensors.emplace("p" + std::to_string(stage), *common::Tensor::Zeros(common::DType::kF32, {2}));
    return *common::SerializeSafetensors(c);
  }
  // Workers a, b and c running a 3-stage job of 100 steps whose step 1 is
  // committed (by its last shard).
  JobStatus ThreeStagesCommittedAtStep1() {
    AddWorker("a");
    AddWorker("b");
    AddWorker("c");
    const JobStatus job = *jobs_->Submit(Spec(3, 100));
    NoteAssignments();
    for (int stage = 0; stage < 3; ++stage) EXPECT_TRUE(jobs_->ReportStep(Report(job, stage, 1)).ok());
    for (int stage = 0; stage < 3; ++stage) EXPECT_TRUE(*SendShard(job, stage, 3, 1) == (stage == 2));
    EXPECT_EQ(jobs_->Get(job.job_id())->committed_step(), 1);
    return job;
  }
  absl::StatusOr<bool> SendShard(const JobStatus& job, int stage, int stages, int64_t step) {
    shardline::v1::ShardHeader h;
    h.set_job_id(job.job_id());
    h.set_plan_epoch(job.plan_epoch());
    h.set_stage(stage);
    h.set_stages(stages);
    h.set_step(step);
    return jobs_->ReportShard(h, Shard(stage));
  }

  std::string dir_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::unique_ptr<WeightStore> weights_;
  std::unique_ptr<CoordinatorStore> store_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<JobManager> jobs_;
  std::vector<std::pair<std::string, Assignment>> delivered_;
  std::map<int, std::string> stage_workers_;
};

// Drains a mailbox the way a reactor would, one write at a time.
template <typename T>
std::vector<T> Drain(StreamMailbox<T>& mailbox) {
  std::vector<T> got;
  const T* pending = nullptr;
  mailbox.Attach([&pending](const T* message) { pending = message; });
  while (pending != nullptr) {
    got.push_back(*pending);
    pending = nullptr;
    mailbox.Written(true);
  }
  return got;
}

}  // namespace shardline::server::testing

#endif  // SHARDLINE_TESTS_SERVER_JOB_MANAGER_FIXTURE_H_
