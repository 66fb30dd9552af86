// Helpers of the recovery tests through the real binaries: a job spec of
// the tiny addition model, polling a job, the reference trainer's weights
// and comparing against them.
#ifndef SHARDLINE_TESTS_CLIENT_RECOVERY_TEST_UTIL_H_
#define SHARDLINE_TESTS_CLIENT_RECOVERY_TEST_UTIL_H_

#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "client/admin_client.h"
#include "common/job_spec.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/client/process_test_util.h"

namespace shardline::client::testing {

inline std::string WriteSpec(const std::string& dir, const std::string& name, int steps, int stages = 2,
                      int replicas = 1) {
  const std::string path = dir + "/" + name + ".json";
  std::ofstream(path) << R"({"name": ")" << name << R"(",
    "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 32, "n_heads": 2, "n_layers": 3},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": )" << steps << R"(, "global_batch": 8, "micro_batches": )" << 4 / replicas
                      << R"(, "seed": 5, "log_every": 1000,
              "optimizer": {"kind": "adamw", "lr": 0.003, "warmup_steps": 2, "grad_clip": 1.0}},
    "parallel": {"pipeline_stages": )" << stages << R"(, "data_parallel": )" << replicas
                      << R"(, "schedule": "1f1b"},
    "checkpoint": {"every_steps": 10}})";
  return path;
}

// Polls until `done(status)` (or about `seconds`); the last status.
inline shardline::v1::JobStatus WaitFor(AdminClient& admin, const std::string& job_id, double seconds,
                                 const std::function<bool(const shardline::v1::JobStatus&)>& done) {
  shardline::v1::JobStatus last;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    absl::StatusOr<shardline::v1::JobStatus> status = admin.Get(job_id);
    if (status.ok()) {
      last = *status;
      if (done(last)) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return last;
}

// The weights shardline-train ends with on `spec_path`: what every
// recovered run must end with.
inline absl::StatusOr<common::SafetensorsContents> TrainReference(const std::string& dir, const std::string& spec_path) {
  const std::string ended = RunToEnd(
      {kBin + "/shardline-train", spec_path, "--threads=1", "--out=" + dir + "/ref.safetensors"}, dir + "/train.log", 120);
  if (ended != "exited with status 0") return absl::InternalError("shardline-train " + ended);
  return common::ReadSafetensors(dir + "/ref.safetensors");
}

inline void ExpectSameWeights(const common::SafetensorsContents& want, const common::SafetensorsContents& got) {
  ASSERT_EQ(want.tensors.size(), got.tensors.size());
  for (const auto& [name, tensor] : want.tensors) {
    ASSERT_EQ(got.tensors.count(name), 1u) << name;
    const auto x = tensor.values<float>();
    const auto y = got.tensors.at(name).values<float>();
    ASSERT_EQ(x.size(), y.size()) << name;
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]) << name << "[" << i << "]";
  }
}

// Submits `spec_path` and waits until the job runs past its first
// checkpoint (step 12, step 10 committed): its status then.
inline void SubmitPastACheckpoint(AdminClient& admin, const std::string& spec_path, shardline::v1::JobStatus* running) {
  auto spec = common::LoadJobSpec(spec_path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto job = admin.Submit(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  *running = WaitFor(admin, job->job_id(), 60, [](const auto& s) { return s.step() >= 12 && s.committed_step() >= 10; });
  ASSERT_EQ(running->state(), shardline::v1::RUNNING) << running->message();
}

// Waits for the job to end: it must succeed, with `reference`'s weights
// bit for bit. Its last status.
inline void ExpectSucceedsWith(AdminClient& admin, const std::string& job_id, const common::SafetensorsContents& reference,
                        shardline::v1::JobStatus* ended) {
  *ended = WaitFor(admin, job_id, 120, [](const auto& s) {
    return s.state() == shardline::v1::SUCCEEDED || s.state() == shardline::v1::FAILED ||
           s.state() == shardline::v1::CANCELLED;
  });
  ASSERT_EQ(ended->state(), shardline::v1::SUCCEEDED) << ended->message();
  auto exported = admin.Export(job_id);
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto weights = common::ParseSafetensors(*exported);
  ASSERT_TRUE(weights.ok()) << weights.status();
  ExpectSameWeights(reference, *weights);
}

}  // namespace shardline::client::testing

#endif  // SHARDLINE_TESTS_CLIENT_RECOVERY_TEST_UTIL_H_
