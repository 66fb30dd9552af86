// Process start-up shared by every Shardline binary: sets its flags from the
// environment, flag files and the command line (common/command_line.h),
// answers --help and --version, and starts glog (logging to stderr unless
// the GLOG_* environment says otherwise, which is what systemd and Docker
// want).
#ifndef SHARDLINE_COMMON_INIT_H_
#define SHARDLINE_COMMON_INIT_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace shardline::common {

// Exit status of every binary for invalid input: an unknown flag, a bad
// value, a malformed spec.
inline constexpr int kExitInvalidInput = 3;

// This build's version ("0.1.0").
absl::string_view Version();

// Returns the positional arguments (argv[0] first). Prints "Error: ..." and
// exits kExitInvalidInput on an unknown flag or a bad value; prints the
// flags (--help) or the version and exits 0 when asked.
std::vector<std::string> InitProcess(int argc, char** argv, absl::string_view usage);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_INIT_H_
