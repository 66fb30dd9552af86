// StageSender: messages go to the link in the order given, each only once its
// tensor's transfer is done; ready ones go at once on the caller's thread;
// failures of a transfer or of the link come back from the next Send/Flush
// and drop what was queued; the queue is bounded; destruction waits for the
// transfers that still write into queued messages.
#include "worker/runtime/stage_sender.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/testing/manual_completion.h"
#include "tests/testing/thread_state.h"

namespace shardline::worker::runtime {
namespace {

using shardline::testing::ManualCompletion;

struct Sent {
  bool to_next;
  int micro_batch;
  std::thread::id thread;
};

// Records what is sent; fails every send once `fail` is set.
class RecordingLink final : public transport::StageLink {
 public:
  absl::Status SendToNext(transport::StageMessage m) override { return Record(true, m); }
  absl::Status SendToPrevious(transport::StageMessage m) override { return Record(false, m); }
  // A StageSender never receives.
  absl::StatusOr<transport::StageMessage> ReceiveFromPrevious() override { return absl::InternalError("not a receiver"); }
  absl::StatusOr<transport::StageMessage> ReceiveFromNext() override { return absl::InternalError("not a receiver"); }
  void Close(const std::string&) override { fail = true; }

  std::vector<Sent> sent() {
    absl::MutexLock lock(&mu_);
    return sent_;
  }
  std::vector<int> micro_batches() {
    std::vector<int> out;
    for (const Sent& s : sent()) out.push_back(s.micro_batch);
    return out;
  }
  std::atomic<bool> fail{false};

 private:
  absl::Status Record(bool to_next, const transport::StageMessage& m) {
    if (fail) return absl::UnavailableError("peer gone");
    absl::MutexLock lock(&mu_);
    sent_.push_back({to_next, m.micro_batch, std::this_thread::get_id()});
    return absl::OkStatus();
  }
  absl::Mutex mu_;
  std::vector<Sent> sent_;
};

transport::StageMessage Message(int micro_batch) {
  transport::StageMessage m;
  m.kind = transport::StageMessage::Kind::kActivation;
  m.micro_batch = micro_batch;
  m.values = transport::HostBuffer::Zeros(16);
  return m;
}

using Direction = StageSender::Direction;

TEST(StageSenderTest, ReadyMessagesGoOutAtOnceOnTheCallersThread) {
  RecordingLink link;
  StageSender sender(link);
  ASSERT_TRUE(sender.Send(Direction::kNext, Message(0)).ok());
  ASSERT_TRUE(sender.Send(Direction::kPrevious, Message(1), HostTransfer()).ok());
  const std::vector<Sent> sent = link.sent();  // no Flush: already there
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_TRUE(sent[0].to_next);
  EXPECT_FALSE(sent[1].to_next);
  EXPECT_EQ(sent[0].thread, std::this_thread::get_id());
  EXPECT_EQ(sent[1].thread, std::this_thread::get_id());
}

TEST(StageSenderTest, WaitsForEachTransferAndKeepsTheOrder) {
  RecordingLink link;
  StageSender sender(link);
  auto first = std::make_shared<ManualCompletion>();
  auto third = std::make_shared<ManualCompletion>();
  ASSERT_TRUE(sender.Send(Direction::kNext, Message(0), HostTransfer(first)).ok());
  // Ready, but queued behind the first: it must not overtake it.
  ASSERT_TRUE(sender.Send(Direction::kNext, Message(1)).ok());
  ASSERT_TRUE(sender.Send(Direction::kPrevious, Message(2), HostTransfer(third)).ok());
  third->Finish();
  // The sender's thread now waits for the first transfer: nothing may have
  // gone out before it (the ready second and third must not overtake it).
  ASSERT_TRUE(first->AwaitBlockedWait(absl::Seconds(10))) << "the sender never waited for the first transfer";
  EXPECT_TRUE(link.sent().empty()) << "sent before the first message's tensor was written";
  first->Finish();
  ASSERT_TRUE(sender.Flush().ok());
  EXPECT_EQ(link.micro_batches(), (std::vector<int>{0, 1, 2}));
  for (const Sent& s : link.sent()) EXPECT_NE(s.thread, std::this_thread::get_id());
  // Idle again: a ready message goes out at once.
  ASSERT_TRUE(sender.Send(Direction::kNext, Message(3)).ok());
  EXPECT_EQ(link.micro_batches(), (std::vector<int>{0, 1, 2, 3}));
}

TEST(StageSenderTest, AFailedTransferIsReportedAndNothingAfterItIsSent) {
  RecordingLink link;
  StageSender sender(link);
  auto broken = std::make_shared<ManualCompletion>();
  ASSERT_TRUE(sender.Send(Direction::kNext, Message(0), HostTransfer(broken)).ok());
  ASSERT_TRUE(sender.Send(Direction::kNext, Message(1)).ok());
  broken->Finish(absl::InternalError("copy failed"));
  const absl::Status flushed = sender.Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kInternal);
  EXPECT_NE(flushed.message().find("copy failed"), std::string::npos);
  EXPECT_TRUE(link.sent().empty());
  EXPECT_EQ(sender.Send(Direction::kNext, Message(2)).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(link.sent().empty());
}

TEST(StageSenderTest, ALinkFailureIsReturnedAndSticks) {
  RecordingLink link;
  StageSender sender(link);
  link.fail = true;
  EXPECT_EQ(sender.Send(Direction::kNext, Message(0)).code(), absl::StatusCode::kUnavailable);
  link.fail = false;
  EXPECT_EQ(sender.Send(Direction::kNext, Message(1)).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sender.Flush().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(link.sent().empty());
}

TEST(StageSenderTest, SendBlocksWhileTheQueueIsFull) {
  RecordingLink link;
  StageSender sender(link, /*max_queued=*/1);
  auto first = std::make_shared<ManualCompletion>();
  ASSERT_TRUE(sender.Send(Direction::kNext, Message(0), HostTransfer(first)).ok());
  // The sender's thread has taken the first message off the queue and waits
  // for its transfer; the second fills the queue, the third must wait.
  ASSERT_TRUE(first->AwaitBlockedWait(absl::Seconds(10)));
  auto second = std::make_shared<ManualCompletion>();
  std::atomic<int> returned{0};
  std::atomic<pid_t> producer_id{0};
  std::atomic<bool> producer_done{false};
  std::thread producer([&] {
    producer_id = shardline::testing::CurrentThreadId();
    EXPECT_TRUE(sender.Send(Direction::kNext, Message(1), HostTransfer(second)).ok());
    returned++;
    EXPECT_TRUE(sender.Send(Direction::kNext, Message(2)).ok());
    returned++;
    producer_done = true;
  });
  // Nothing else can make the producer sleep: it blocked in the third Send.
  ASSERT_TRUE(shardline::testing::AwaitThreadBlockedOrDone(producer_id, producer_done, absl::Seconds(10)));
  EXPECT_EQ(returned.load(), 1) << "three messages queued past a bound of one";
  first->Finish();
  second->Finish();
  producer.join();
  EXPECT_EQ(returned.load(), 2);
  ASSERT_TRUE(sender.Flush().ok());
  EXPECT_EQ(link.micro_batches(), (std::vector<int>{0, 1, 2}));
}

TEST(StageSenderTest, DestructionWaitsForTransfersStillWritingQueuedMessages) {
  RecordingLink link;
  auto first = std::make_shared<ManualCompletion>();
  auto second = std::make_shared<ManualCompletion>();
  auto sender = std::make_unique<StageSender>(link);
  ASSERT_TRUE(sender->Send(Direction::kNext, Message(0), HostTransfer(first)).ok());
  ASSERT_TRUE(first->AwaitBlockedWait(absl::Seconds(10)));  // taken by the sender's thread
  ASSERT_TRUE(sender->Send(Direction::kNext, Message(1), HostTransfer(second)).ok());  // queued
  std::atomic<pid_t> destroyer_id{0};
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    destroyer_id = shardline::testing::CurrentThreadId();
    sender.reset();
    destroyed = true;
  });
  // The destructor has begun (it sleeps only in joining the sender's thread):
  // the step has failed, and what is left must be dropped, not sent.
  ASSERT_TRUE(shardline::testing::AwaitThreadBlockedOrDone(destroyer_id, destroyed, absl::Seconds(10)));
  first->Finish();
  // The queued message is still being written: its transfer is waited for
  // before the message is dropped, and the sender is not gone meanwhile.
  ASSERT_TRUE(second->AwaitBlockedWait(absl::Seconds(10)))
      << "dropped a queued message whose tensor the device was still writing";
  EXPECT_FALSE(destroyed) << "destroyed while a transfer still wrote a queued message";
  second->Finish();
  destroyer.join();
  EXPECT_TRUE(destroyed);
  EXPECT_TRUE(link.sent().empty()) << "a sender being destroyed drops what it holds";
}

}  // namespace
}  // namespace shardline::worker::runtime
