// The wire pace (worker/transport/wire_pace.h) between two ExchangeStreams
// joined by an emulated wire of known speed: frames a sender writes back to
// back are marked and timed at the receiver, at the wire's rate, each
// message's halves included (stage_frame_coding.h: kMinTimedFrameBytes);
// the time between messages sent one at a time is not timed at all.
#include <grpcpp/support/byte_buffer.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/transport/exchange_stream.h"
#include "worker/transport/stage_frame_coding.h"

namespace shardline::worker::transport {
namespace {

// One direction of a wire: each frame written arrives at `to` after
// bytes / rate (data frames; grants at once), one at a time, and only then
// is the write done for `from`.
class EmulatedWire final : public FrameWriter {
 public:
  EmulatedWire(ExchangeStream& from, ExchangeStream& to, double bytes_per_second)
      : from_(from), to_(to), bytes_per_second_(bytes_per_second), thread_([this] { Run(); }) {}
  ~EmulatedWire() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void StartFrameWrite(const grpc::ByteBuffer* frame, bool /*more_follows*/) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(*frame);  // shares the slices
    }
    wake_.notify_all();
  }
  void EndCall(const absl::Status& /*status*/) override {}

 private:
  void Run() {
    for (;;) {
      grpc::ByteBuffer frame;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        frame = queue_.front();
        queue_.pop_front();
      }
      if (frame.Length() > 64) absl::SleepFor(absl::Seconds(static_cast<double>(frame.Length()) / bytes_per_second_));
      EXPECT_TRUE(to_.FrameReceived(frame).ok());
      from_.FrameWritten(true);
    }
  }

  ExchangeStream& from_;
  ExchangeStream& to_;
  const double bytes_per_second_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<grpc::ByteBuffer> queue_;
  bool stop_ = false;
  std::thread thread_;
};

constexpr size_t kElements = 16 << 10;  // 64 KiB a message: one frame
constexpr double kWireBytesPerSecond = 20e6;

std::shared_ptr<const StageMessage> Activation(int micro_batch, size_t elements = kElements) {
  auto m = std::make_shared<StageMessage>();
  m->kind = StageMessage::Kind::kActivation;
  m->step = 1;
  m->micro_batch = micro_batch;
  m->batch = 1;
  m->t = 1;
  m->values = HostBuffer::Zeros(elements);
  m->targets = {0};
  return m;
}

struct Joined {
  ExchangeStream sender{Options()};
  ExchangeStream receiver{Options()};
  EmulatedWire forward{sender, receiver, kWireBytesPerSecond};
  EmulatedWire back{receiver, sender, kWireBytesPerSecond};
  Joined() {
    sender.Attach(&forward, receiver.window_frames());
    receiver.Attach(&back, sender.window_frames());
  }
  ~Joined() {
    sender.Detach(absl::OkStatus());
    receiver.Detach(absl::OkStatus());
  }
  static ExchangeOptions Options() {
    ExchangeOptions o;
    o.timeout = absl::Seconds(30);
    return o;
  }
};

TEST(WirePaceTest, FramesSentBackToBackAreTimedAtTheWiresRate) {
  Joined link;
  constexpr int kMessages = 24;
  std::thread receiving([&] {
    for (int i = 0; i < kMessages; ++i) ASSERT_TRUE(link.receiver.Receive().ok());
  });
  for (int i = 0; i < kMessages; ++i) ASSERT_TRUE(link.sender.Send(Activation(i)).ok());
  receiving.join();
  const WirePace pace = link.receiver.wire_pace();
  // All but the first (and any the sender did not have queued) were timed.
  EXPECT_GE(pace.bytes, (kMessages / 2) * kElements * sizeof(float));
  const double rate = static_cast<double>(pace.bytes) / (static_cast<double>(pace.nanos) * 1e-9);
  // The wire took at least bytes / rate for each (its header included), so
  // the payload never seems faster; a loaded machine only makes it slower.
  EXPECT_LE(rate, kWireBytesPerSecond);
  EXPECT_GE(rate, kWireBytesPerSecond / 4);
  EXPECT_EQ(link.sender.wire_pace().bytes, 0u);  // nothing came back to back the other way
}

TEST(WirePaceTest, LargeMessagesSentOneAtATimeAreTimedByTheirSecondHalfOnly) {
  Joined link;
  constexpr int kMessages = 4;
  constexpr size_t kLarge = 2 * kMinTimedFrameBytes / sizeof(float);  // 512 KiB: two frames
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(link.sender.Send(Activation(i, kLarge)).ok());
    ASSERT_TRUE(link.receiver.Receive().ok());  // arrived before the next is sent
    absl::SleepFor(absl::Milliseconds(100));    // the stage computing: not the wire
  }
  // Each message's second half followed its first at once: timed; the
  // 100 ms between messages (8x a half's 13 ms on this wire) never.
  const WirePace pace = link.receiver.wire_pace();
  EXPECT_EQ(pace.bytes, kMessages * kLarge * sizeof(float) / 2);
  const double rate = static_cast<double>(pace.bytes) / (static_cast<double>(pace.nanos) * 1e-9);
  EXPECT_LE(rate, kWireBytesPerSecond);
  EXPECT_GE(rate, kWireBytesPerSecond / 4);
}

TEST(WirePaceTest, SmallMessagesSentOneAtATimeAreNotTimed) {
  Joined link;
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(link.sender.Send(Activation(i)).ok());  // 64 KiB: one frame
    ASSERT_TRUE(link.receiver.Receive().ok());
  }
  // The time between those frames is the sender's, not the wire's.
  EXPECT_EQ(link.receiver.wire_pace().bytes, 0u);
  EXPECT_EQ(link.receiver.wire_pace().nanos, 0u);
}

}  // namespace
}  // namespace shardline::worker::transport
