// Helpers for backend tests: deterministic random data, moving vectors in and
// out of a backend, and element-wise comparison with a readable failure.
#ifndef SHARDLINE_TESTS_WORKER_BACKEND_BACKEND_TEST_UTIL_H_
#define SHARDLINE_TESTS_WORKER_BACKEND_BACKEND_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/backend.h"
#include "worker/backend/backend_factory.h"

namespace shardline::worker::testing {

inline std::vector<float> RandomVector(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

template <typename T>
DeviceBuffer Upload(Backend& backend, const std::vector<T>& values) {
  auto buffer = backend.Allocate(values.size() * sizeof(T));
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_TRUE(backend.CopyToDevice(absl::Span<const T>(values), buffer->template span<T>()).ok());
  return std::move(*buffer);
}

template <typename T = float>
std::vector<T> Download(Backend& backend, const DeviceBuffer& buffer) {
  std::vector<T> out(buffer.bytes() / sizeof(T));
  const absl::Status status =
      backend.CopyToHost(DeviceSpan<const T>(buffer.template span<T>()), absl::Span<T>(out));
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// |actual − expected| ≤ atol + rtol·|expected| for every element.
inline ::testing::AssertionResult AllNear(const std::vector<float>& actual,
                                          const std::vector<double>& expected, double atol,
                                          double rtol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " vs expected " << expected.size();
  }
  size_t bad = 0, first = 0;
  double worst = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double err = std::fabs(actual[i] - expected[i]);
    if (!(err <= atol + rtol * std::fabs(expected[i]))) {
      if (bad++ == 0) first = i;
      worst = std::max(worst, err);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << actual.size() << " elements differ; first at " << first << ": "
         << actual[first] << " vs " << expected[first] << " (worst error " << worst << ")";
}

inline std::vector<double> AsDoubles(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Bit for bit (NaNs included).
inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Backends to run a TEST_P suite over: the CPU backend always, CUDA when built.
inline std::vector<std::string> BackendsUnderTest() {
  std::vector<std::string> devices = {"cpu"};
  if (CudaCompiledIn()) devices.push_back("cuda:0");
  return devices;
}

inline std::string BackendTestName(const ::testing::TestParamInfo<std::string>& info) {
  return info.param == "cpu" ? "cpu" : "cuda0";
}

// Fixture base: creates the backend named by the parameter, or skips the test
// when it names a CUDA device and this machine has none.
class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() != "cpu" && CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device on this machine";
    }
    auto backend = CreateBackend(GetParam());
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
  }
  Backend& backend() { return *backend_; }

 private:
  std::unique_ptr<Backend> backend_;
};

}  // namespace shardline::worker::testing

#endif  // SHARDLINE_TESTS_WORKER_BACKEND_BACKEND_TEST_UTIL_H_
