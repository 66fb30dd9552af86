// Helpers for model tests: small specs and runtimes on the CPU backend.
#ifndef SHARDLINE_TESTS_WORKER_NN_NN_TEST_UTIL_H_
#define SHARDLINE_TESTS_WORKER_NN_NN_TEST_UTIL_H_

#include <memory>
#include <string>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "worker/backend/backend_factory.h"

namespace shardline::worker::testing {

// A tiny addition job: 2 blocks of width 16, 2 heads.
inline shardline::v1::JobSpec TinySpec(int micro_batches = 4, int global_batch = 8,
                                       const std::string& optimizer = "adamw") {
  const std::string json = R"({"name": "tiny",
    "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 16, "n_heads": 2, "n_layers": 2},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": 20, "global_batch": )" + std::to_string(global_batch) +
                           R"(, "micro_batches": )" + std::to_string(micro_batches) +
                           R"(, "seed": 5, "optimizer": {"kind": ")" + optimizer +
                           R"(", "lr": 0.01, "warmup_steps": 2}}})";
  auto spec = common::ParseJobSpec(json);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

inline std::unique_ptr<Backend> CpuBackend() {
  auto backend = CreateBackend("cpu", BackendOptions{1});
  EXPECT_TRUE(backend.ok());
  return std::move(*backend);
}

}  // namespace shardline::worker::testing

#endif  // SHARDLINE_TESTS_WORKER_NN_NN_TEST_UTIL_H_
