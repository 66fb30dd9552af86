#include "worker/data/data_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace shardline::worker::data {
namespace {

// A fresh directory with a data root inside it and a file beside the root.
class DataFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/shardline_data_file_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    root_ = dir_ + "/root";
    ASSERT_EQ(::mkdir(root_.c_str(), 0755), 0);
    Write(root_ + "/text.txt", "hello, world");
    Write(dir_ + "/secret.txt", "not for jobs");
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  static void Write(const std::string& path, const std::string& bytes) { std::ofstream(path) << bytes; }
  // The whole file, read as windows are.
  static std::string Contents(const DataFile& file) {
    std::string bytes(file.size(), '\0');
    auto span = absl::MakeSpan(reinterpret_cast<unsigned char*>(bytes.data()), bytes.size());
    const absl::Status read = file.ReadAt(0, span);
    EXPECT_TRUE(read.ok()) << read;
    return bytes;
  }
  DataAccess Access() const {
    DataAccess access;
    access.root = root_;
    return access;
  }
  std::string dir_, root_;
};

TEST_F(DataFileTest, RelativePathsAreTakenFromTheRootAndAbsoluteOnesMustLieUnderIt) {
  auto relative = DataFile::Open("text.txt", Access());
  ASSERT_TRUE(relative.ok()) << relative.status();
  EXPECT_EQ(Contents(**relative), "hello, world");
  auto absolute = DataFile::Open(root_ + "/text.txt", Access());
  ASSERT_TRUE(absolute.ok()) << absolute.status();
  EXPECT_EQ(Contents(**absolute), "hello, world");
}

// The hostile-client probe: /etc/shadow was trained on and its weights exported.
TEST_F(DataFileTest, PathsOutsideTheRootAreRefusedHoweverSpelt) {
  for (const std::string& path : {std::string("/etc/shadow"), std::string("/etc/passwd"), dir_ + "/secret.txt",
                                   std::string("../secret.txt"), root_ + "/../secret.txt"}) {
    auto read = DataFile::Open(path, Access());
    EXPECT_FALSE(read.ok()) << path;
    if (read.status().code() != absl::StatusCode::kNotFound) {
      EXPECT_EQ(read.status().code(), absl::StatusCode::kPermissionDenied) << path << ": " << read.status();
    }
  }
  ASSERT_EQ(::symlink((dir_ + "/secret.txt").c_str(), (root_ + "/link.txt").c_str()), 0);
  EXPECT_EQ(DataFile::Open("link.txt", Access()).status().code(), absl::StatusCode::kPermissionDenied)
      << "a symlink out of the root";
}

// The probes: /dev/zero was read until 2.3 GB and silently truncated; a FIFO
// blocked the worker forever.
TEST_F(DataFileTest, OnlyRegularFilesAreReadAndAFifoDoesNotBlock) {
  DataAccess anywhere;
  EXPECT_EQ(DataFile::Open("/dev/zero", anywhere).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DataFile::Open(root_, anywhere).status().code(), absl::StatusCode::kInvalidArgument) << "a directory";
  const std::string fifo = root_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  auto read = DataFile::Open("fifo", Access());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << read.status();
  EXPECT_NE(read.status().message().find("not a regular file"), std::string::npos) << read.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "it returned: it did not block";
}

TEST_F(DataFileTest, AFileLargerThanTheBoundIsRefusedUnread) {
  DataAccess access = Access();
  access.max_bytes = 5;
  auto read = DataFile::Open("text.txt", access);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(read.status().message().find("more than the 5"), std::string::npos) << read.status();
}

TEST_F(DataFileTest, ACancelledReadStops) {
  std::atomic<bool> cancelled{true};
  DataAccess access = Access();
  access.cancelled = &cancelled;
  EXPECT_EQ(DataFile::Open("text.txt", access).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(access.Check(absl::Now()).code(), absl::StatusCode::kCancelled);
  cancelled = false;
  EXPECT_TRUE(access.Check(absl::Now()).ok());
  EXPECT_EQ(access.Check(absl::Now() - access.deadline - absl::Seconds(1)).code(),
            absl::StatusCode::kDeadlineExceeded);
}

// Read at any offset: what the file held when it was opened; an empty file
// holds nothing; bytes beyond it are OUT_OF_RANGE.
TEST_F(DataFileTest, AFileIsReadAsItIs) {
  std::string bytes;
  for (int i = 0; i < (3 << 20) + 5; ++i) bytes += static_cast<char>(i * 7);
  Write(root_ + "/big.bin", bytes);
  Write(root_ + "/empty.bin", "");
  auto big = DataFile::Open("big.bin", Access());
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ((*big)->size(), bytes.size());
  EXPECT_EQ(Contents(**big), bytes);
  unsigned char window[3];
  ASSERT_TRUE((*big)->ReadAt(1000, absl::MakeSpan(window)).ok());
  EXPECT_EQ(std::string(reinterpret_cast<char*>(window), 3), bytes.substr(1000, 3));
  EXPECT_EQ((*big)->ReadAt(bytes.size() - 2, absl::MakeSpan(window)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*big)->ReadAt(~uint64_t{0}, absl::MakeSpan(window)).code(), absl::StatusCode::kOutOfRange);
  auto empty = DataFile::Open("empty.bin", Access());
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ((*empty)->size(), 0u);
  EXPECT_TRUE((*empty)->ReadAt(0, {}).ok());
}

// The probe: a data file truncated in place while a job read it killed the
// worker (SIGBUS from the mapping). Now the read that finds it short says
// so, and one renamed over it leaves the open file reading the old bytes.
TEST_F(DataFileTest, AFileCutShortWhileOpenGivesDataLossNotAFault) {
  Write(root_ + "/cut.bin", std::string(1 << 20, 'a'));
  auto cut = DataFile::Open("cut.bin", Access());
  ASSERT_TRUE(cut.ok()) << cut.status();
  ASSERT_EQ(::truncate((root_ + "/cut.bin").c_str(), 4096), 0);
  unsigned char window[16];
  EXPECT_TRUE((*cut)->ReadAt(100, absl::MakeSpan(window)).ok()) << "what it still holds reads";
  const absl::Status read = (*cut)->ReadAt(500000, absl::MakeSpan(window));
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
  EXPECT_NE(read.message().find("'cut.bin' ends before byte 500016 of the 1048576 it held when the job opened it: "
                                "it was truncated or rewritten in place"),
            std::string::npos)
      << read;

  Write(root_ + "/renamed.bin", std::string(1 << 20, 'b'));
  auto renamed = DataFile::Open("renamed.bin", Access());
  ASSERT_TRUE(renamed.ok()) << renamed.status();
  Write(root_ + "/new.bin", "short");
  ASSERT_EQ(::rename((root_ + "/new.bin").c_str(), (root_ + "/renamed.bin").c_str()), 0);
  ASSERT_TRUE((*renamed)->ReadAt(500000, absl::MakeSpan(window)).ok());
  EXPECT_EQ(window[0], 'b') << "the file it opened";
}

}  // namespace
}  // namespace shardline::worker::data
