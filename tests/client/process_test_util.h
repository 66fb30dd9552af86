// Helpers for tests that drive the real binaries as processes on loopback:
// scratch directories, a program run to its end under a deadline, and the
// port a daemon writes once it listens.
#ifndef SHARDLINE_TESTS_CLIENT_PROCESS_TEST_UTIL_H_
#define SHARDLINE_TESTS_CLIENT_PROCESS_TEST_UTIL_H_

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "client/child_process.h"
#include "common/file_util.h"
#include "gtest/gtest.h"

namespace shardline::client::testing {

inline const std::string kBin = SHARDLINE_BIN_DIR;

// An empty directory of this name under the test's temporary directory.
inline std::string TempDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/e2e-" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Runs a program to completion (stopped after `seconds`), its output in
// `log` (standard error in `stderr_path` when given); how it ended
// ("exited with status N", or "timed out").
inline std::string RunToEnd(const std::vector<std::string>& argv, const std::string& log, int seconds,
                            const std::string& stderr_path = "") {
  auto child = ChildProcess::Start(argv, log, stderr_path);
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return "not started";
  std::string ended;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while ((*child)->Running(&ended)) {
    if (std::chrono::steady_clock::now() > deadline) {
      (*child)->Stop();
      return "timed out";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return ended;
}

// The port a daemon wrote to `path` (--port_file), waiting up to 30 s for
// it (a worker registers after measuring its GEMM rate: seconds on cores
// other tests' daemons share); empty if it never came.
inline std::string WaitForPort(const std::string& path) {
  std::string port;
  for (int i = 0; i < 1500 && port.empty(); ++i) {
    port = std::string(absl::StripTrailingAsciiWhitespace(common::ReadFile(path).value_or("")));
    if (port.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return port;
}

}  // namespace shardline::client::testing

#endif  // SHARDLINE_TESTS_CLIENT_PROCESS_TEST_UTIL_H_
