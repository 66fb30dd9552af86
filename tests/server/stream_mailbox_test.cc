#include "server/stream_mailbox.h"

#include <string>

#include "gtest/gtest.h"
#include "shardline/v1/admin.pb.h"
#include "tests/server/job_manager_fixture.h"

namespace shardline::server {
namespace {

using testing::Drain;

TEST(StreamMailboxTest, ASubscriberFarBehindLosesTheOldestMessagesNotTheLatest) {
  StreamMailbox<int> mailbox(100);
  for (int i = 0; i < 600; ++i) ASSERT_TRUE(mailbox.Push(i));
  const std::vector<int> got = Drain(mailbox);
  ASSERT_EQ(got.size(), 100u);
  EXPECT_EQ(got.front(), 500);
  EXPECT_EQ(got.back(), 599);

  StreamMailbox<int> everything(StreamMailbox<int>::kUnlimited);
  for (int i = 0; i < 600; ++i) ASSERT_TRUE(everything.Push(i));
  EXPECT_EQ(Drain(everything).size(), 600u);
}

// The hostile-client probe: WatchJob streams that stop reading grew the
// coordinator by the statuses queued for them. A mailbox with a byte bound
// holds at most that much, the newest message always kept.
TEST(StreamMailboxTest, ASubscriberThatStopsReadingHoldsAtMostTheByteBound) {
  StreamMailbox<shardline::v1::JobStatus> mailbox(1024, 64 << 10);
  shardline::v1::JobStatus status;
  status.set_message(std::string(10 << 10, 'm'));  // 10 KiB each
  for (int i = 0; i < 1000; ++i) {
    status.set_step(i);
    ASSERT_TRUE(mailbox.Push(status));
  }
  const std::vector<shardline::v1::JobStatus> got = Drain(mailbox);
  ASSERT_FALSE(got.empty());
  EXPECT_LE(got.size(), 7u) << "64 KiB of 10 KiB statuses";
  EXPECT_EQ(got.back().step(), 999) << "the latest is kept";

  StreamMailbox<shardline::v1::JobStatus> huge_one(1024, 1 << 10);
  ASSERT_TRUE(huge_one.Push(status));
  EXPECT_EQ(Drain(huge_one).size(), 1u) << "a message larger than the bound still goes, alone";
}

}  // namespace
}  // namespace shardline::server
