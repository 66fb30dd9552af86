// Process start-up shared by every Shardline binary: parses absl flags, sets
// the usage message and starts glog (logging to stderr unless the GLOG_*
// environment says otherwise, which is what systemd and Docker want).
#ifndef SHARDLINE_COMMON_INIT_H_
#define SHARDLINE_COMMON_INIT_H_

#include <vector>

#include "absl/strings/string_view.h"

namespace shardline::common {

// Returns the positional arguments (argv[0] first). Exits with a usage
// message on a malformed or unknown flag.
std::vector<char*> InitProcess(int argc, char** argv, absl::string_view usage);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_INIT_H_
