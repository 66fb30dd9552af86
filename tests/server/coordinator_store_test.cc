#include "server/coordinator_store.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"

namespace shardline::server {
namespace {

std::string FreshPath(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/coordinator-store-" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir + "/coordinator.db";
}

shardline::v1::JobStatus Status(const std::string& id, shardline::v1::JobState state, int64_t step) {
  shardline::v1::JobStatus s;
  s.set_job_id(id);
  s.set_state(state);
  s.set_step(step);
  return s;
}

TEST(CoordinatorStoreTest, CountersNeverRepeatAcrossReopens) {
  const std::string path = FreshPath("counters");
  std::vector<int64_t> jobs;
  std::vector<uint64_t> epochs;
  for (int incarnation = 1; incarnation <= 3; ++incarnation) {
    auto store = CoordinatorStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ((*store)->incarnation(), incarnation);
    for (int i = 0; i < 2; ++i) {
      jobs.push_back(*(*store)->TakeJobNumber());
      epochs.push_back(*(*store)->TakeEpoch());
    }
  }
  EXPECT_EQ(jobs, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(epochs, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6}));
}

TEST(CoordinatorStoreTest, JobsComeBackInSubmissionOrderWithTheirLastStatus) {
  const std::string path = FreshPath("jobs");
  shardline::v1::JobSpec spec;
  spec.set_name("first");
  {
    auto store = CoordinatorStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->SaveJob(spec, Status("job-2", shardline::v1::PENDING, 0)).ok());
    spec.set_name("second");
    ASSERT_TRUE((*store)->SaveJob(spec, Status("job-10", shardline::v1::RUNNING, 3)).ok());
    // An update keeps the job's place.
    spec.set_name("first, renamed");
    ASSERT_TRUE((*store)->SaveJob(spec, Status("job-2", shardline::v1::SUCCEEDED, 7)).ok());
  }
  auto store = CoordinatorStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].status.job_id(), "job-2");
  EXPECT_EQ((*jobs)[0].status.state(), shardline::v1::SUCCEEDED);
  EXPECT_EQ((*jobs)[0].status.step(), 7);
  EXPECT_EQ((*jobs)[0].spec.name(), "first, renamed");
  EXPECT_EQ((*jobs)[1].status.job_id(), "job-10");
  EXPECT_EQ((*jobs)[1].status.step(), 3);
  EXPECT_EQ((*jobs)[1].spec.name(), "second");
}

TEST(CoordinatorStoreTest, ADeletedJobStaysDeletedAndItsNumberIsNotHandedOutAgain) {
  const std::string path = FreshPath("delete");
  shardline::v1::JobSpec spec;
  {
    auto store = CoordinatorStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int i = 0; i < 3; ++i) {
      const int64_t number = *(*store)->TakeJobNumber();
      ASSERT_TRUE((*store)->SaveJob(spec, Status(absl::StrCat("job-", number), shardline::v1::SUCCEEDED, 1)).ok());
    }
    ASSERT_TRUE((*store)->DeleteJob("job-2").ok());
    const absl::Status again = (*store)->DeleteJob("job-2");
    EXPECT_EQ(again.code(), absl::StatusCode::kNotFound) << again;
    EXPECT_EQ((*store)->DeleteJob("job-9").code(), absl::StatusCode::kNotFound);
  }
  auto store = CoordinatorStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].status.job_id(), "job-1");
  EXPECT_EQ((*jobs)[1].status.job_id(), "job-3");
  EXPECT_EQ(*(*store)->TakeJobNumber(), 4);
}

TEST(CoordinatorStoreTest, ASecondCoordinatorOnTheSameStateIsRefused) {
  const std::string path = FreshPath("exclusive");
  auto first = CoordinatorStore::Open(path);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = CoordinatorStore::Open(path);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_NE(second.status().message().find("another coordinator"), std::string::npos) << second.status();
  // The first one keeps working.
  EXPECT_TRUE((*first)->TakeJobNumber().ok());
}

TEST(CoordinatorStoreTest, AFileThatIsNotOurDatabaseIsDataLoss) {
  const std::string path = FreshPath("garbage");
  ASSERT_TRUE(common::WriteFileAtomically(path, std::string(4096, 'x')).ok());
  auto store = CoordinatorStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
}

}  // namespace
}  // namespace shardline::server
