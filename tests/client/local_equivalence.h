// shardline-local against shardline-train on one spec: every metrics
// record and every weight the same (the end-to-end tests' check).
#ifndef SHARDLINE_TESTS_CLIENT_LOCAL_EQUIVALENCE_H_
#define SHARDLINE_TESTS_CLIENT_LOCAL_EQUIVALENCE_H_

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/client/process_test_util.h"

namespace shardline::client {

// The text of a JSON number field in one metrics line ("" when absent).
inline std::string Field(const std::string& line, const std::string& name) {
  const std::string key = "\"" + name + "\": ";
  const size_t at = line.find(key);
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size();
  return line.substr(begin, line.find_first_of(",}", begin) - begin);
}

inline std::vector<std::string> Lines(const std::string& path) {
  absl::StatusOr<std::string> text = common::ReadFile(path);
  EXPECT_TRUE(text.ok()) << path;
  return absl::StrSplit(text.value_or(""), '\n', absl::SkipEmpty());
}

// shardline-train and shardline-local on `spec`, the latter with
// `local_flags`: every metrics record and every weight the same.
inline void ExpectLocalEqualsTrain(const std::string& dir, const std::string& spec,
                                   const std::vector<std::string>& local_flags, size_t records = 13) {
  EXPECT_EQ(testing::RunToEnd({testing::kBin + "/shardline-train", spec, "--threads=1",
                               "--metrics_out=" + dir + "/ref/metrics.jsonl", "--out=" + dir + "/ref.safetensors"},
                              dir + "/train.log", 120),
            "exited with status 0");
  std::vector<std::string> argv = {testing::kBin + "/shardline-local", spec, "--threads_per_worker=1",
                                    "--metrics_out=" + dir + "/local/metrics.jsonl",
                                    "--out=" + dir + "/local.safetensors"};
  argv.insert(argv.end(), local_flags.begin(), local_flags.end());
  EXPECT_EQ(testing::RunToEnd(argv, dir + "/local.log", 240), "exited with status 0")
      << common::ReadFile(dir + "/local.log").value_or("");
  // Every record: the same step, loss, learning rate, grad norm and accuracy,
  // to the last digit; the measured speed differs.
  const auto ref = Lines(dir + "/ref/metrics.jsonl"), local = Lines(dir + "/local/metrics.jsonl");
  ASSERT_EQ(ref.size(), records);
  ASSERT_EQ(local.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    for (const char* field : {"step", "loss", "lr", "grad_norm", "accuracy", "examples", "val_loss", "bits_per_byte"}) {
      EXPECT_EQ(Field(local[i], field), Field(ref[i], field)) << field << " in record " << i;
    }
  }
  auto a = common::ReadSafetensors(dir + "/ref.safetensors");
  auto b = common::ReadSafetensors(dir + "/local.safetensors");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  for (const auto& [name, tensor] : a->tensors) {
    ASSERT_EQ(b->tensors.count(name), 1u) << name;
    const auto x = tensor.values<float>();
    const auto y = b->tensors.at(name).values<float>();
    ASSERT_EQ(x.size(), y.size()) << name;
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]) << name << "[" << i << "]";
  }
}

}  // namespace shardline::client

#endif  // SHARDLINE_TESTS_CLIENT_LOCAL_EQUIVALENCE_H_
