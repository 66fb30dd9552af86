#include "common/init.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/command_line.h"
#include "glog/logging.h"

namespace shardline::common {

absl::string_view Version() { return SHARDLINE_VERSION; }

std::vector<std::string> InitProcess(int argc, char** argv, absl::string_view usage) {
  absl::StatusOr<CommandLine> command_line =
      ParseFlags(argc, argv, [](const std::string& name) { return std::getenv(name.c_str()); });
  const char* program = argc > 0 ? argv[0] : "shardline";
  if (const char* slash = std::strrchr(program, '/'); slash != nullptr) program = slash + 1;
  if (!command_line.ok()) {
    std::fprintf(stderr, "Error: %s\nRun '%s --help' for the flags.\n",
                 std::string(command_line.status().message()).c_str(), program);
    std::exit(kExitInvalidInput);
  }
  if (command_line->help) {
    std::printf("%s", FlagsHelp(usage).c_str());
    std::exit(0);
  }
  if (command_line->version) {
    std::printf("%s %s\n", program, SHARDLINE_VERSION);
    std::exit(0);
  }
  if (std::getenv("GLOG_logtostderr") == nullptr && std::getenv("GLOG_log_dir") == nullptr) {
    FLAGS_logtostderr = true;
  }
  google::InitGoogleLogging(argv[0]);
  google::InstallFailureSignalHandler();
  return std::move(command_line->positional);
}

}  // namespace shardline::common
