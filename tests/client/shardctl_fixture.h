// The fixture of the shardctl tests: a real coordinator and two workers
// (separate processes on loopback) per test program, a job spec to submit,
// and shardctl's exit descriptions.
#ifndef SHARDLINE_TESTS_CLIENT_SHARDCTL_FIXTURE_H_
#define SHARDLINE_TESTS_CLIENT_SHARDCTL_FIXTURE_H_

#include <errno.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/client/process_cluster.h"
#include "tests/client/process_test_util.h"

namespace shardline::client::testing::shardctl {

inline constexpr int kSteps = 8;

inline std::string WriteSpec(const std::string& path, int steps) {
  std::ofstream(path) << R"({"name": "ctl",
    "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 32, "n_heads": 2, "n_layers": 3},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": )" << steps << R"(, "global_batch": 8, "micro_batches": 4, "seed": 5,
              "optimizer": {"kind": "adamw", "lr": 0.003, "warmup_steps": 2}},
    "parallel": {"pipeline_stages": 2, "schedule": "1f1b"},
    "checkpoint": {"every_steps": 4}})";
  return path;
}

using Cluster = ProcessCluster;

template <typename Message>
inline Message FromJson(const std::string& json) {
  Message m;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &m);
  EXPECT_TRUE(status.ok()) << status << "\n" << json;
  return m;
}

inline constexpr char kOk[] = "exited with status 0";
inline constexpr char kFailed[] = "exited with status 1";
inline constexpr char kUnreachable[] = "exited with status 2";
inline constexpr char kInvalid[] = "exited with status 3";

class ShardctlTest : public ::testing::Test {
 protected:
  // A cluster of its own per test program (its name: its directory).
  static void SetUpTestSuite() {
    cluster_ = Cluster::Start(program_invocation_short_name, {2, "localhost"}).release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr) << "the cluster did not start"; }
  Cluster& cluster() { return *cluster_; }
  std::string Spec(int steps) { return WriteSpec(absl::StrCat(cluster_->dir(), "/spec", steps, ".json"), steps); }

  inline static Cluster* cluster_ = nullptr;
};

}  // namespace shardline::client::testing::shardctl

#endif  // SHARDLINE_TESTS_CLIENT_SHARDCTL_FIXTURE_H_
