// The command line of every Shardline binary: its Abseil flags, set from (in
// rising precedence) their defaults, SHARDLINE_<FLAG> environment variables,
// --flagfile files and the arguments themselves. Unlike absl::ParseCommandLine
// it reports what is wrong instead of exiting, so that every binary exits 3
// with "Error: ..." on an unknown flag or a bad value, and its --help lists
// every flag of the program (Abseil's own --help shows only those defined in
// the file holding main).
#ifndef SHARDLINE_COMMON_COMMAND_LINE_H_
#define SHARDLINE_COMMON_COMMAND_LINE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardline::common {

// What the command line asked for besides setting flags.
struct CommandLine {
  std::vector<std::string> positional;  // argv[0] first, then the non-flag arguments
  bool help = false;              // --help, -h or --helpfull: print FlagsHelp and exit 0
  bool version = false;           // --version
};

// Looks an environment variable up; nullptr when unset.
using EnvLookup = std::function<const char*(const std::string& name)>;

// The environment variable that sets `flag`'s default: SHARDLINE_ and the
// flag's name in upper case (SHARDLINE_LINK_TIMEOUT_MS).
std::string FlagEnvironmentName(absl::string_view flag);

// Sets the program's flags from `env` and then argv (a lone "--" ends the
// flags; "--name=value", "--name value", and for booleans "--name",
// "--noname"; --flagfile=FILE reads one such flag per line, "#" comments).
// InvalidArgument naming the flag (or variable) on an unknown flag, a
// missing or bad value or an unreadable flag file; flags set before the
// error keep their new values.
absl::StatusOr<CommandLine> ParseFlags(int argc, char** argv, const EnvLookup& env);

// The usage line, then every flag of the program (not Abseil's own) sorted
// by name with its type, default and meaning, then how the environment sets
// them.
std::string FlagsHelp(absl::string_view usage);

// The names of the program's flags (not Abseil's own), sorted.
std::vector<std::string> FlagNames();

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_COMMAND_LINE_H_
