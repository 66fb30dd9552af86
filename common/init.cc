#include "common/init.h"

#include <cstdlib>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "glog/logging.h"

namespace shardline::common {

std::vector<char*> InitProcess(int argc, char** argv, absl::string_view usage) {
  absl::SetProgramUsageMessage(usage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (std::getenv("GLOG_logtostderr") == nullptr && std::getenv("GLOG_log_dir") == nullptr) {
    FLAGS_logtostderr = true;
  }
  google::InitGoogleLogging(argv[0]);
  google::InstallFailureSignalHandler();
  return positional;
}

}  // namespace shardline::common
