#include "common/command_line.h"

#include <algorithm>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"

namespace shardline::common {
namespace {

// Flag files nest at most this deep (a file naming itself is an error).
constexpr int kMaxFlagFileDepth = 4;
// And hold at most this much (a flag file is a few lines, not /dev/zero).
constexpr size_t kMaxFlagFileBytes = size_t{1} << 20;

// Abseil registers flags of its own (--flagfile, --fromenv, --undefok...);
// ours are the rest.
bool IsOurs(const absl::CommandLineFlag& flag) {
  const std::string file = flag.Filename();
  return !flag.IsRetired() && !absl::StartsWith(file, "absl/") && !absl::StrContains(file, "/absl/");
}

absl::CommandLineFlag* FindOurs(absl::string_view name) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag != nullptr && IsOurs(*flag) ? flag : nullptr;
}

// At most this much of a bad argument is quoted back.
std::string Clipped(absl::string_view text) {
  constexpr size_t kMax = 200;
  return text.size() <= kMax ? std::string(text) : absl::StrCat(text.substr(0, kMax), "...");
}

class Parser {
 public:
  explicit Parser(CommandLine* out) : out_(out) {}

  // Parses `args` (argv without argv[0], or a flag file's lines); `from` says
  // where they came from, for messages.
  absl::Status Parse(const std::vector<std::string>& args, const std::string& from, int depth) {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& arg = args[i];
      if (arg == "--") {
        if (depth > 0) return absl::InvalidArgumentError(absl::StrCat("\"--\" in ", from));
        for (size_t j = i + 1; j < args.size(); ++j) Positional(args[j]);
        return absl::OkStatus();
      }
      if (arg.size() < 2 || arg[0] != '-') {
        if (depth > 0) {
          return absl::InvalidArgumentError(absl::StrCat(from, ": \"", Clipped(arg), "\" is not a flag"));
        }
        Positional(arg);
        continue;
      }
      absl::string_view body = absl::StripPrefix(absl::StripPrefix(arg, "-"), "-");
      absl::string_view name = body;
      absl::string_view value;
      bool has_value = false;
      if (size_t eq = body.find('='); eq != absl::string_view::npos) {
        name = body.substr(0, eq);
        value = body.substr(eq + 1);
        has_value = true;
      }
      if (name == "help" || name == "h" || name == "helpfull" || name == "helpshort") {
        out_->help = true;
        continue;
      }
      if (name == "version") {
        out_->version = true;
        continue;
      }
      if (name == "flagfile") {
        if (!has_value) {
          if (i + 1 >= args.size()) return Missing(name, from);
          value = args[++i];
        }
        if (absl::Status s = ReadFlagFile(std::string(value), depth + 1); !s.ok()) return s;
        continue;
      }
      absl::CommandLineFlag* flag = FindOurs(name);
      bool negated = false;
      if (flag == nullptr && absl::StartsWith(name, "no") && !has_value) {
        flag = FindOurs(name.substr(2));
        negated = flag != nullptr && flag->IsOfType<bool>();
        if (!negated) flag = nullptr;
      }
      if (flag == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("unknown flag --", Clipped(name), Where(from)));
      }
      std::string text;
      if (negated) {
        text = "false";
      } else if (has_value) {
        text = std::string(value);
      } else if (flag->IsOfType<bool>()) {
        text = "true";
      } else if (i + 1 < args.size()) {
        text = args[++i];
      } else {
        return Missing(name, from);
      }
      if (absl::Status s = Set(*flag, text, absl::StrCat("--", flag->Name(), Where(from))); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  static absl::Status Set(absl::CommandLineFlag& flag, const std::string& text, const std::string& what) {
    std::string error;
    if (!flag.ParseFrom(text, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": bad value \"", Clipped(text), "\" (", Clipped(error), ")"));
    }
    return absl::OkStatus();
  }

 private:
  static std::string Where(const std::string& from) { return from.empty() ? "" : " in " + from; }

  static absl::Status Missing(absl::string_view name, const std::string& from) {
    return absl::InvalidArgumentError(absl::StrCat("flag --", Clipped(name), Where(from), " needs a value"));
  }

  void Positional(const std::string& arg) { out_->positional.push_back(arg); }

  absl::Status ReadFlagFile(const std::string& path, int depth) {
    if (depth > kMaxFlagFileDepth) {
      return absl::InvalidArgumentError(absl::StrCat("--flagfile ", Clipped(path), ": nested more than ",
                                                     kMaxFlagFileDepth, " deep"));
    }
    // Read no more than the limit and a byte (/dev/zero ends here too).
    absl::StatusOr<std::string> text = ReadFileBounded(path, kMaxFlagFileBytes);
    if (absl::IsInvalidArgument(text.status())) {
      return absl::InvalidArgumentError(absl::StrCat("--flagfile ", Clipped(path), ": larger than ",
                                                     kMaxFlagFileBytes, " bytes"));
    }
    if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("--flagfile ", Clipped(path), ": cannot read it"));
    std::vector<std::string> lines;
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      absl::string_view flag = absl::StripAsciiWhitespace(line);
      if (!flag.empty() && flag[0] != '#') lines.emplace_back(flag);
    }
    return Parse(lines, path, depth);
  }

  CommandLine* out_;
};

}  // namespace

std::string FlagEnvironmentName(absl::string_view flag) {
  return absl::StrCat("SHARDLINE_", absl::AsciiStrToUpper(flag));
}

absl::StatusOr<CommandLine> ParseFlags(int argc, char** argv, const EnvLookup& env) {
  CommandLine result;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!IsOurs(*flag)) continue;
    const std::string variable = FlagEnvironmentName(name);
    if (const char* value = env(variable); value != nullptr) {
      if (absl::Status s = Parser::Set(*flag, value, variable); !s.ok()) return s;
    }
  }
  result.positional.push_back(argc > 0 ? argv[0] : "");
  Parser parser(&result);
  const std::vector<std::string> args(argv + std::min(argc, 1), argv + argc);
  if (absl::Status s = parser.Parse(args, "", 0); !s.ok()) return s;
  return result;
}

std::vector<std::string> FlagNames() {
  std::vector<std::string> names;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsOurs(*flag)) names.emplace_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string FlagsHelp(absl::string_view usage) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsOurs(*flag)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string text = absl::StrCat("usage: ", usage, "\n\nFlags:\n");
  for (const absl::CommandLineFlag* flag : flags) {
    const std::string default_value = flag->DefaultValue();
    absl::StrAppendFormat(&text, "  --%s (default: %s)\n      %s\n", flag->Name(),
                          default_value.empty() ? "\"\"" : default_value, flag->Help());
  }
  absl::StrAppend(&text,
                  "  --flagfile=FILE\n      read flags from FILE, one per line (\"#\" starts a comment)\n"
                  "  --help, --version\n      print this, or the version, and exit\n\n"
                  "Each flag's default may also come from the environment: --link_timeout_ms from\n"
                  "SHARDLINE_LINK_TIMEOUT_MS, and so on (the command line wins). An unknown flag or a\n"
                  "bad value exits with status 3. Logging: GLOG_v, GLOG_minloglevel (glog's variables).\n");
  return text;
}

}  // namespace shardline::common
