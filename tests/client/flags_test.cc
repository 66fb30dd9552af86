// Every binary's command line, as a user meets it: --help lists all of the
// program's flags (not only those of the file holding main) and exits 0; an
// unknown flag or a bad value exits 3 with "Error: ..." on stderr; flag
// files and SHARDLINE_* variables set flags; a worker that would advertise
// a wildcard address refuses to start, saying what to set.
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "tests/client/process_test_util.h"

namespace shardline::client {
namespace {

using testing::kBin;
using testing::RunToEnd;
using testing::TempDir;

constexpr char kOk[] = "exited with status 0";
constexpr char kInvalid[] = "exited with status 3";

struct Output {
  std::string ended, out, err;
};

Output RunProgram(const std::vector<std::string>& argv) {
  static int runs = 0;
  const std::string dir = TempDir("flags");
  const std::string out = absl::StrCat(dir, "/out", runs, ".log");
  const std::string err = absl::StrCat(dir, "/err", runs++, ".log");
  Output o;
  o.ended = RunToEnd(argv, out, 30, err);
  o.out = common::ReadFile(out).value_or("");
  o.err = common::ReadFile(err).value_or("");
  return o;
}

// Each binary and flags that live outside the file holding its main.
const std::vector<std::pair<std::string, std::vector<std::string>>> kPrograms = {
    {"shardline-coordinator", {"--listen", "--state_dir", "--lease_ms", "--port_file"}},
    {"shardline-worker", {"--coordinator", "--advertise_host", "--link_timeout_ms", "--gemm_flops"}},
    {"shardctl", {"--coordinator", "--o "}},
    {"shardline-local", {"--workers"}},
    {"shardline-train", {"--device", "--threads"}},
};

TEST(FlagsTest, HelpListsEveryFlagAndExitsZero) {
  for (const auto& [program, flags] : kPrograms) {
    const Output o = RunProgram({kBin + "/" + program, "--help"});
    EXPECT_EQ(o.ended, kOk) << program << ": " << o.err;
    EXPECT_TRUE(absl::StartsWith(o.out, "usage: ")) << program << ": " << o.out;
    for (const std::string& flag : flags) {
      EXPECT_TRUE(absl::StrContains(o.out, "  " + flag)) << program << " --help lacks " << flag << ":\n" << o.out;
    }
    EXPECT_TRUE(absl::StrContains(o.out, "SHARDLINE_")) << program;
    const Output v = RunProgram({kBin + "/" + program, "--version"});
    EXPECT_EQ(v.ended, kOk) << program;
    EXPECT_TRUE(absl::StrContains(v.out, "0.")) << v.out;
  }
}

// docs/operations.md names every flag --help lists, so that the page a
// user reads first is complete.
TEST(FlagsTest, OperationsGuideNamesEveryFlag) {
  const std::string guide = common::ReadFile(std::string(SHARDLINE_SOURCE_DIR) + "/docs/operations.md").value_or("");
  ASSERT_FALSE(guide.empty());
  for (const auto& [program, flags] : kPrograms) {
    const Output o = RunProgram({kBin + "/" + program, "--help"});
    for (absl::string_view line : absl::StrSplit(o.out, '\n')) {
      if (!absl::StartsWith(line, "  --") || !absl::StrContains(line, " (default: ")) continue;
      const std::string flag(line.substr(2, line.find(' ', 2) - 2));
      bool named = false;
      // As --flag, or -flag (shardctl's -o).
      for (const std::string& form : {flag, flag.substr(1)}) {
        for (const char* after : {"`", "=", " "}) named = named || absl::StrContains(guide, "`" + form + after);
      }
      EXPECT_TRUE(named) << "docs/operations.md does not name " << program << "'s " << flag;
    }
  }
}

TEST(FlagsTest, UnknownFlagsAndBadValuesExitThreeNamingThem) {
  for (const auto& [program, flags] : kPrograms) {
    const Output unknown = RunProgram({kBin + "/" + program, "--no_such_flag=1"});
    EXPECT_EQ(unknown.ended, kInvalid) << program;
    EXPECT_EQ(unknown.out, "") << program;
    EXPECT_TRUE(absl::StartsWith(unknown.err, "Error: unknown flag --no_such_flag")) << program << ": " << unknown.err;
  }
  const Output bad = RunProgram({kBin + "/shardline-worker", "--threads=many"});
  EXPECT_EQ(bad.ended, kInvalid);
  EXPECT_TRUE(absl::StartsWith(bad.err, "Error: --threads: bad value \"many\"")) << bad.err;
}

TEST(FlagsTest, FlagFilesAndTheEnvironmentSetFlags) {
  // The coordinator validates --lease_ms before touching its state
  // directory, so a refused value shows which setting reached it.
  const std::string dir = TempDir("flags-sources");
  const std::string flagfile = dir + "/coordinator.flags";
  std::ofstream(flagfile) << "# a coordinator\n--state_dir=" << dir << "/state\n--lease_ms=50\n";
  const Output from_file = RunProgram({kBin + "/shardline-coordinator", "--flagfile=" + flagfile});
  EXPECT_EQ(from_file.ended, kInvalid);
  EXPECT_TRUE(absl::StrContains(from_file.err, "--lease_ms must be at least 100")) << from_file.err;

  const Output from_env = RunProgram({"/usr/bin/env", "SHARDLINE_LEASE_MS=60", "SHARDLINE_STATE_DIR=" + dir + "/state",
                               kBin + "/shardline-coordinator"});
  EXPECT_EQ(from_env.ended, kInvalid);
  EXPECT_TRUE(absl::StrContains(from_env.err, "--lease_ms must be at least 100")) << from_env.err;

  const Output bad_env = RunProgram({"/usr/bin/env", "SHARDLINE_LEASE_MS=soon", kBin + "/shardline-coordinator"});
  EXPECT_EQ(bad_env.ended, kInvalid);
  EXPECT_TRUE(absl::StartsWith(bad_env.err, "Error: SHARDLINE_LEASE_MS: bad value")) << bad_env.err;

  for (const std::string n : {"0", "1025"}) {
    const Output probes = RunProgram(
        {kBin + "/shardline-coordinator", "--state_dir=" + dir + "/state", "--concurrent_probes=" + n});
    EXPECT_EQ(probes.ended, kInvalid);
    EXPECT_TRUE(absl::StrContains(probes.err, "--concurrent_probes must be from 1 to 1024, not " + n)) << probes.err;
  }
}

TEST(FlagsTest, AWorkerOnAWildcardAddressMustBeToldWhatToAdvertise) {
  for (const std::string listen : {"0.0.0.0:0", "[::]:0"}) {
    const Output o = RunProgram(
        {kBin + "/shardline-worker", "--name=w", "--listen=" + listen, "--coordinator=127.0.0.1:1", "--insecure"});
    EXPECT_EQ(o.ended, kInvalid) << listen << ": " << o.err;
    EXPECT_TRUE(absl::StartsWith(o.err, "Error: --listen=" + listen)) << o.err;
    EXPECT_TRUE(absl::StrContains(o.err, "set --advertise_host")) << o.err;
  }
}

}  // namespace
}  // namespace shardline::client
