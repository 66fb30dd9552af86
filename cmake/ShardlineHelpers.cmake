# Helper functions so every target of ours gets the same flags.
#
#   shardline_library(NAME SRCS a.cc b.cc DEPS x y [PUBLIC_INCLUDES])
#   shardline_binary(NAME SRCS main.cc DEPS x y)
#   shardline_test(NAME SRCS t.cc DEPS x y [TIMEOUT s] [LABELS l] [ARGS ...])

set(SHARDLINE_WARNINGS -Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers)

function(shardline_apply_flags target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${SHARDLINE_WARNINGS}>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings --expt-relaxed-constexpr>)
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
endfunction()

# Precompiled headers (cmake/precompiled.h: gRPC, protobuf, Abseil, glog,
# the generated headers): made once by an OWNER object library and reused
# by every target of one kind. GCC takes a precompiled header only where
# the code model matches (a library's -fPIC, an executable's -fPIE), so
# libraries, binaries and tests (-O1, GoogleTest) have one owner each.
# -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON builds without them.
#
#   shardline_precompiled_header(OWNER HEADER [PIE] [DEPS x y])
#   shardline_reuse_precompiled_header(TARGET OWNER)
#   shardline_compile_as_executable(TARGET)
function(shardline_compile_as_executable target)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
  target_compile_options(${target} PRIVATE -fPIE)
endfunction()

function(shardline_precompiled_header owner header)
  cmake_parse_arguments(ARG "PIE" "" "DEPS" ${ARGN})
  add_library(${owner} OBJECT ${PROJECT_SOURCE_DIR}/cmake/precompiled.cc)
  if(ARG_PIE)
    shardline_compile_as_executable(${owner})
  endif()
  shardline_apply_flags(${owner})
  target_link_libraries(${owner} PRIVATE shardline_precompiled_deps ${ARG_DEPS})
  target_precompile_headers(${owner} PRIVATE ${header})
endfunction()

# A target that reuses a header gets the owner's include directories and
# definitions (-pthread's _REENTRANT too): GCC takes the header only where
# they match.
function(shardline_reuse_precompiled_header target owner)
  if(TARGET ${owner})
    target_link_libraries(${target} PRIVATE shardline_precompiled_deps)
    target_precompile_headers(${target} REUSE_FROM ${owner})
  endif()
endfunction()

function(shardline_library name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SRCS})
  shardline_apply_flags(${name})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  shardline_reuse_precompiled_header(${name} shardline_library_pch)
endfunction()

function(shardline_binary name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  shardline_apply_flags(${name})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  shardline_reuse_precompiled_header(${name} shardline_binary_pch)
endfunction()

# Every test gets a CTest TIMEOUT (default 120 s): a hang is a failure. Test
# binaries use our own main (tests/testing/gtest_main.cc), which exits with
# SHARDLINE_ALL_SKIPPED_EXIT_CODE when every test it ran was skipped: CTest
# then shows the entry as Skipped, not Passed.
set(SHARDLINE_ALL_SKIPPED_EXIT_CODE 77)

function(shardline_test_properties name timeout labels)
  set_tests_properties(${name} PROPERTIES TIMEOUT ${timeout}
                       SKIP_RETURN_CODE ${SHARDLINE_ALL_SKIPPED_EXIT_CODE})
  if(labels)
    set_tests_properties(${name} PROPERTIES LABELS "${labels}")
  endif()
endfunction()

function(shardline_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  add_executable(${name} ${ARG_SRCS})
  shardline_apply_flags(${name})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} shardline_gtest_main GTest::gtest)
  shardline_reuse_precompiled_header(${name} shardline_test_pch)
  add_test(NAME ${name} COMMAND ${name})
  shardline_test_properties(${name} ${ARG_TIMEOUT} "${ARG_LABELS}")
endfunction()

# Registers an extra CTest entry running an existing test binary with a filter.
function(shardline_test_filtered name binary filter)
  cmake_parse_arguments(ARG "" "TIMEOUT" "LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  add_test(NAME ${name} COMMAND ${binary} --gtest_filter=${filter})
  shardline_test_properties(${name} ${ARG_TIMEOUT} "${ARG_LABELS}")
endfunction()
