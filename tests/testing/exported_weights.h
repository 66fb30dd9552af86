// ExpectSameWeights: an exported safetensors file holds exactly `want`'s
// tensors, bit for bit (a distributed run against the reference trainer).
#ifndef SHARDLINE_TESTS_TESTING_EXPORTED_WEIGHTS_H_
#define SHARDLINE_TESTS_TESTING_EXPORTED_WEIGHTS_H_

#include <map>
#include <string>

#include "common/safetensors.h"
#include "gtest/gtest.h"

namespace shardline::testing {

inline void ExpectSameWeights(const std::string& exported, const std::map<std::string, common::Tensor>& want) {
  auto got = common::ParseSafetensors(exported);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->tensors.size(), want.size());
  for (const auto& [name, tensor] : want) {
    ASSERT_EQ(got->tensors.count(name), 1u) << name;
    const auto a = got->tensors.at(name).values<float>();
    const auto b = tensor.values<float>();
    ASSERT_EQ(a.size(), b.size()) << name;
    for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(a[i], b[i]) << name << "[" << i << "]";
  }
}

}  // namespace shardline::testing

#endif  // SHARDLINE_TESTS_TESTING_EXPORTED_WEIGHTS_H_
