// The tests' precompiled header: cmake/precompiled.h and GoogleTest
// (tests/CMakeLists.txt: shardline_test_pch, reused by every test binary).
#ifndef SHARDLINE_TESTS_TESTING_PRECOMPILED_H_
#define SHARDLINE_TESTS_TESTING_PRECOMPILED_H_

#include "cmake/precompiled.h"
#include "gtest/gtest.h"

#endif  // SHARDLINE_TESTS_TESTING_PRECOMPILED_H_
