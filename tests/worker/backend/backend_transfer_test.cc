// The backend's asynchronous copies (the stage links' staging path) and its
// work timers, on every backend built: a copy to the host sees the work
// queued before it and not the work after it (AwaitOnDevice), a copy to the
// device (also one that may start early, after a mark) is seen by the work
// after it, bad buffers are refused, and a timer measures the work between
// its marks.
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"

namespace shardline::worker {
namespace {

using testing::Download;

class TransferTest : public testing::BackendTest {};

// Host memory from AllocateHostStaging (page-locked on CUDA), freed at scope end.
class StagingFloats {
 public:
  StagingFloats(Backend& backend, size_t n) : backend_(backend), n_(n) {
    auto memory = backend.AllocateHostStaging(n * sizeof(float));
    EXPECT_TRUE(memory.ok()) << memory.status();
    data_ = static_cast<float*>(memory.value_or(nullptr));
  }
  ~StagingFloats() { if (data_ != nullptr) backend_.FreeHostStaging(data_); }
  absl::Span<float> span() { return {data_, data_ == nullptr ? 0 : n_}; }

 private:
  Backend& backend_;
  const size_t n_;
  float* data_ = nullptr;
};

// Big enough that a copy racing the work around it would be caught mid-way.
constexpr size_t kAsyncFloats = size_t{4} << 20;

TEST_P(TransferTest, CopyToHostAsyncSeesTheWorkBeforeItAndNotTheWorkAfter) {
  auto x = backend().Allocate(kAsyncFloats * sizeof(float));
  ASSERT_TRUE(x.ok());
  StagingFloats host(backend(), kAsyncFloats);
  ASSERT_FALSE(host.span().empty());
  std::fill(host.span().begin(), host.span().end(), -1.0f);
  ASSERT_TRUE(backend().Fill(x->span<float>(), 1.0f).ok());
  auto copy = backend().CopyToHostAsync(DeviceSpan<const float>(x->span<float>()), host.span());
  ASSERT_TRUE(copy.ok()) << copy.status();
  // Overwrites the source, but only once the copy has read it.
  ASSERT_TRUE(backend().AwaitOnDevice(*copy).ok());
  ASSERT_TRUE(backend().Fill(x->span<float>(), 2.0f).ok());
  ASSERT_TRUE(copy->Wait().ok());
  EXPECT_TRUE(copy->done());
  for (size_t i = 0; i < kAsyncFloats; ++i) ASSERT_EQ(host.span()[i], 1.0f) << i;
  const std::vector<float> after = Download(backend(), *x);
  EXPECT_EQ(std::count(after.begin(), after.end(), 2.0f), static_cast<long>(kAsyncFloats));
}

TEST_P(TransferTest, CopyToDeviceAsyncIsSeenByTheWorkAfterIt) {
  auto y = backend().Allocate(kAsyncFloats * sizeof(float));
  ASSERT_TRUE(y.ok());
  StagingFloats host(backend(), kAsyncFloats);
  ASSERT_FALSE(host.span().empty());
  std::fill(host.span().begin(), host.span().end(), 5.0f);
  ASSERT_TRUE(backend().Fill(y->span<float>(), 0.0f).ok());
  auto copy = backend().CopyToDeviceAsync(absl::Span<const float>(host.span()), y->span<float>());
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_TRUE(backend().Scale(y->span<float>(), 2.0f).ok());
  ASSERT_TRUE(copy->Wait().ok());
  std::fill(host.span().begin(), host.span().end(), 7.0f);  // free to reuse now
  const std::vector<float> got = Download(backend(), *y);
  EXPECT_EQ(std::count(got.begin(), got.end(), 10.0f), static_cast<long>(kAsyncFloats));
}

// A copy to the device that may start once a mark is done (CUDA: on the
// upload stream, alongside the work before it) is still seen by the work
// queued after it; the mark itself is done once the work before it has run.
TEST_P(TransferTest, CopyToDeviceAfterAMarkIsSeenByTheWorkAfterIt) {
  auto y = backend().Allocate(kAsyncFloats * sizeof(float));
  auto busy = backend().Allocate(kAsyncFloats * sizeof(float));
  ASSERT_TRUE(y.ok() && busy.ok());
  StagingFloats host(backend(), kAsyncFloats);
  ASSERT_FALSE(host.span().empty());
  std::fill(host.span().begin(), host.span().end(), 5.0f);
  ASSERT_TRUE(backend().Fill(y->span<float>(), 0.0f).ok());
  auto mark = backend().MarkQueued();  // y's last use so far
  ASSERT_TRUE(mark.ok()) << mark.status();
  ASSERT_TRUE(backend().Fill(busy->span<float>(), 1.0f).ok());  // work the copy may overlap
  auto copy = backend().CopyToDeviceAsync(absl::Span<const float>(host.span()), y->span<float>(), *mark);
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_TRUE(backend().Scale(y->span<float>(), 2.0f).ok());
  ASSERT_TRUE(copy->Wait().ok());
  ASSERT_TRUE(mark->Wait().ok());
  EXPECT_TRUE(mark->done());
  const std::vector<float> got = Download(backend(), *y);
  EXPECT_EQ(std::count(got.begin(), got.end(), 10.0f), static_cast<long>(kAsyncFloats));
}

TEST_P(TransferTest, AsyncCopiesValidateTheirBuffers) {
  auto x = backend().Allocate(16 * sizeof(float));
  ASSERT_TRUE(x.ok());
  std::vector<float> small(8);
  EXPECT_EQ(backend().CopyToHostAsync(DeviceSpan<const float>(x->span<float>()), absl::Span<float>(small)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend().CopyToDeviceAsync(absl::Span<const float>(std::vector<float>(32)), x->span<float>()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend().CopyToDeviceAsync(absl::Span<const float>(std::vector<float>(32)), x->span<float>(),
                                        HostTransfer()).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto nothing = backend().CopyToHostAsync(DeviceSpan<const float>(), absl::Span<float>());
  ASSERT_TRUE(nothing.ok());
  EXPECT_TRUE(nothing->done());
  EXPECT_TRUE(backend().AwaitOnDevice(*nothing).ok());
}

// A timer measures the device time of the work queued between its marks:
// never more than the wall time around it all, and more than nothing for
// real work; it reads only once stopped, and stops once.
TEST_P(TransferTest, WorkTimerMeasuresTheWorkBetweenItsMarks) {
  const int64_t n = 512;
  auto a = backend().AllocateZeros(n * n), c = backend().AllocateZeros(n * n);
  ASSERT_TRUE(a.ok() && c.ok());
  GemmShape shape;
  shape.m = shape.n = shape.k = n;
  const auto wall_start = std::chrono::steady_clock::now();
  auto timer = backend().StartTimer();
  ASSERT_TRUE(timer.ok()) << timer.status();
  EXPECT_EQ((*timer)->Seconds().status().code(), absl::StatusCode::kFailedPrecondition);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(backend().Gemm(shape, a->span<float>(), a->span<float>(), c->span<float>()).ok());
  }
  ASSERT_TRUE((*timer)->Stop().ok());
  auto seconds = (*timer)->Seconds();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_GT(*seconds, 0.0);
  EXPECT_LE(*seconds, wall);
  EXPECT_EQ((*timer)->Stop().code(), absl::StatusCode::kFailedPrecondition);
}

// Small work a backend does and its expected results: a GEMM of ones
// (every entry k), copied back both ways.
void CheckWorksOnThisThread(Backend& backend) {
  const int64_t n = 64;
  auto a = backend.Allocate(n * n * sizeof(float)), c = backend.Allocate(n * n * sizeof(float));
  ASSERT_TRUE(a.ok() && c.ok());
  ASSERT_TRUE(backend.Fill(a->span<float>(), 1.0f).ok());
  GemmShape shape;
  shape.m = shape.n = shape.k = n;
  ASSERT_TRUE(backend.Gemm(shape, a->span<float>(), a->span<float>(), c->span<float>()).ok());
  StagingFloats host(backend, n * n);
  ASSERT_FALSE(host.span().empty());
  auto copy = backend.CopyToHostAsync(DeviceSpan<const float>(c->span<float>()), host.span());
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_TRUE(copy->Wait().ok());
  EXPECT_EQ(std::count(host.span().begin(), host.span().end(), static_cast<float>(n)), n * n);
  EXPECT_TRUE(backend.MemoryAvailable().ok());
  const std::vector<float> synced = Download(backend, *c);
  EXPECT_EQ(std::count(synced.begin(), synced.end(), static_cast<float>(n)), n * n);
}

// A worker creates its backend on one thread and trains on another.
TEST_P(TransferTest, WorksFromAThreadOtherThanItsCreator) {
  std::thread other([this] { CheckWorksOnThisThread(backend()); });
  other.join();
}

INSTANTIATE_TEST_SUITE_P(Backends, TransferTest, ::testing::ValuesIn(testing::BackendsUnderTest()),
                         testing::BackendTestName);

// CUDA's current device is per thread: a backend on the second GPU, driven
// from a thread that has been using the first (as a worker's job thread
// may), still runs on its own device.
TEST(CudaFactoryTest, SecondDeviceWorksFromAThreadUsingTheFirst) {
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  auto second = CreateBackend("cuda:1");
  ASSERT_TRUE(second.ok()) << second.status();
  std::thread other([&] {
    auto first = CreateBackend("cuda:0");  // makes device 0 current on this thread
    ASSERT_TRUE(first.ok()) << first.status();
    CheckWorksOnThisThread(**second);
    CheckWorksOnThisThread(**first);
  });
  other.join();
}

}  // namespace
}  // namespace shardline::worker
