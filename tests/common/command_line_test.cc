// common/command_line: flags from the environment, flag files and argv, in
// that order of precedence, with an error (not an exit) naming what is wrong.
#include "common/command_line.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, cl_count, 7, "how many things");
ABSL_FLAG(std::string, cl_name, "", "what it is called");
ABSL_FLAG(bool, cl_verbose, false, "say more");

namespace shardline::common {
namespace {

class CommandLineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::SetFlag(&FLAGS_cl_count, 7);
    absl::SetFlag(&FLAGS_cl_name, "");
    absl::SetFlag(&FLAGS_cl_verbose, false);
  }

  // Parses `args` (argv[0] added) with `env` as the environment.
  absl::StatusOr<CommandLine> Parse(std::vector<std::string> args,
                                    const std::map<std::string, std::string>& env = {}) {
    args.insert(args.begin(), "prog");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return ParseFlags(static_cast<int>(argv.size()), argv.data(), [&env](const std::string& name) {
      auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  }

  std::string FlagFile(const std::string& name, const std::string& text) {
    const std::string path = ::testing::TempDir() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
};

TEST_F(CommandLineTest, SetsFlagsInEveryFormAndKeepsPositionalArgumentsInOrder) {
  auto parsed = Parse({"first", "--cl_count=3", "-cl_name", "x y", "second", "--cl_verbose", "--", "--cl_count=9"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_cl_count), 3);
  EXPECT_EQ(absl::GetFlag(FLAGS_cl_name), "x y");
  EXPECT_TRUE(absl::GetFlag(FLAGS_cl_verbose));
  EXPECT_EQ(parsed->positional, (std::vector<std::string>{"prog", "first", "second", "--cl_count=9"}));
  EXPECT_FALSE(parsed->help);

  ASSERT_TRUE(Parse({"--nocl_verbose"}).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_cl_verbose));
  ASSERT_TRUE(Parse({"--cl_verbose=true", "-h"}).ok());
  EXPECT_TRUE(absl::GetFlag(FLAGS_cl_verbose));
  EXPECT_TRUE(Parse({"--help"})->help);
  EXPECT_TRUE(Parse({"--version"})->version);
}

TEST_F(CommandLineTest, TheEnvironmentSetsDefaultsAndTheCommandLineWins) {
  EXPECT_EQ(FlagEnvironmentName("cl_count"), "SHARDLINE_CL_COUNT");
  ASSERT_TRUE(Parse({}, {{"SHARDLINE_CL_COUNT", "11"}, {"SHARDLINE_CL_NAME", "env"}}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_cl_count), 11);
  EXPECT_EQ(absl::GetFlag(FLAGS_cl_name), "env");
  ASSERT_TRUE(Parse({"--cl_count=12"}, {{"SHARDLINE_CL_COUNT", "11"}}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_cl_count), 12);
  // Variables of other programs' flags, or of no flag, are not ours to refuse.
  EXPECT_TRUE(Parse({}, {{"SHARDLINE_NOT_A_FLAG", "x"}}).ok());

  auto bad = Parse({}, {{"SHARDLINE_CL_COUNT", "many"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "SHARDLINE_CL_COUNT")) << bad.status();
}

TEST_F(CommandLineTest, UnknownFlagsAndBadValuesAreErrorsNamingThem) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--cl_cuont=3"}, "unknown flag --cl_cuont"},
      {{"--cl_count=three"}, "--cl_count: bad value \"three\""},
      {{"--cl_count"}, "flag --cl_count needs a value"},
      {{"--nocl_count"}, "unknown flag --nocl_count"},
      {{"--cl_verbose=maybe"}, "--cl_verbose: bad value"},
      // Abseil's own flags are not this program's.
      {{"--fromenv=cl_count"}, "unknown flag --fromenv"},
      {{"--flagfile"}, "needs a value"},
  };
  for (const auto& [args, message] : cases) {
    auto parsed = Parse(args);
    ASSERT_FALSE(parsed.ok()) << args[0];
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), message)) << parsed.status();
  }
  // A huge argument is quoted only in part.
  auto huge = Parse({"--" + std::string(100000, 'x')});
  ASSERT_FALSE(huge.ok());
  EXPECT_LT(huge.status().message().size(), 400u);
}

TEST_F(CommandLineTest, FlagFilesHoldOneFlagALineAndTheCommandLineAfterThemWins) {
  const std::string inner = FlagFile("inner.flags", "--cl_name=inner\n");
  const std::string outer = FlagFile("outer.flags", "# a comment\n\n  --cl_count=5  \n--flagfile=" + inner + "\n");
  ASSERT_TRUE(Parse({"--flagfile=" + outer}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_cl_count), 5);
  EXPECT_EQ(absl::GetFlag(FLAGS_cl_name), "inner");
  ASSERT_TRUE(Parse({"--flagfile", outer, "--cl_count=6"}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_cl_count), 6);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {FlagFile("typo.flags", "--cl_cuont=1\n"), "unknown flag --cl_cuont in "},
      {FlagFile("positional.flags", "stray\n"), "\"stray\" is not a flag"},
      {FlagFile("self.flags", "--flagfile=" + ::testing::TempDir() + "/self.flags\n"), "nested more than"},
      {::testing::TempDir() + "/missing.flags", "cannot read it"},
      {FlagFile("huge.flags", std::string(2 << 20, '#')), "larger than 1048576 bytes"},
  };
  for (const auto& [path, message] : bad) {
    auto parsed = Parse({"--flagfile=" + path});
    ASSERT_FALSE(parsed.ok()) << path;
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), message)) << parsed.status();
  }
}

TEST_F(CommandLineTest, HelpListsEveryFlagOfTheProgramSortedWithDefaults) {
  const std::string help = FlagsHelp("prog [flags]");
  EXPECT_TRUE(absl::StartsWith(help, "usage: prog [flags]\n")) << help;
  const size_t count = help.find("  --cl_count (default: 7)\n      how many things\n");
  const size_t name = help.find("  --cl_name (default: \"\")\n      what it is called\n");
  const size_t verbose = help.find("  --cl_verbose (default: false)\n      say more\n");
  ASSERT_NE(count, std::string::npos) << help;
  ASSERT_NE(name, std::string::npos) << help;
  ASSERT_NE(verbose, std::string::npos) << help;
  EXPECT_LT(count, name);
  EXPECT_LT(name, verbose);
  EXPECT_FALSE(absl::StrContains(help, "--fromenv")) << "Abseil's own flags are not listed";
  EXPECT_TRUE(absl::StrContains(help, "SHARDLINE_")) << help;
}

}  // namespace
}  // namespace shardline::common
