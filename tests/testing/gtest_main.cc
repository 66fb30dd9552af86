// The main() of every GoogleTest binary of ours. It runs the tests as
// GoogleTest's own main does, with one difference: when every test that ran
// was skipped (GTEST_SKIP) and none failed, it exits with
// SHARDLINE_ALL_SKIPPED_EXIT_CODE, which CTest's SKIP_RETURN_CODE
// (cmake/ShardlineHelpers.cmake, one number for both) reports as "Skipped".
// Without it, a CUDA suite on a machine with no GPU, where every test skips,
// would show as "Passed". A filter that selects no test is a mistake in the
// CTest registration, not a pass: it fails. Unless the caller set
// TEST_TMPDIR, the tests' files (::testing::TempDir()) go under this build
// tree's own directory, SHARDLINE_TEST_TMPDIR, so suites of two build trees
// run side by side without touching each other's.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "gtest/gtest.h"

int main(int argc, char** argv) {
  ::setenv("TEST_TMPDIR", SHARDLINE_TEST_TMPDIR, /*overwrite=*/0);
  std::error_code ignored;
  std::filesystem::create_directories(std::getenv("TEST_TMPDIR"), ignored);
  ::testing::InitGoogleTest(&argc, argv);
  const int result = RUN_ALL_TESTS();
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (result == 0 && unit.test_to_run_count() == 0 && !GTEST_FLAG_GET(list_tests)) {
    std::printf("no test matched the filter\n");
    return 1;
  }
  if (result == 0 && unit.test_to_run_count() > 0 && unit.skipped_test_count() == unit.test_to_run_count()) {
    std::printf("every test skipped: exit code %d (CTest: Skipped)\n", SHARDLINE_ALL_SKIPPED_EXIT_CODE);
    return SHARDLINE_ALL_SKIPPED_EXIT_CODE;
  }
  return result;
}
