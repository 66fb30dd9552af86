#include "worker/backend/cpu/cpu_thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

#include "glog/logging.h"

namespace shardline::worker::cpu {
namespace {

// The job state is one word, so a worker claims a part of the job it saw or
// learns that the job is over in one compare-and-swap: generation (24 bits) |
// parts (20 bits) | next unclaimed part (20 bits).
constexpr int kPartBits = 20;
constexpr uint64_t kPartMask = (uint64_t{1} << kPartBits) - 1;
constexpr int64_t kMaxParts = static_cast<int64_t>(kPartMask);

uint64_t Generation(uint64_t state) { return state >> (2 * kPartBits); }
int64_t Parts(uint64_t state) { return static_cast<int64_t>((state >> kPartBits) & kPartMask); }
int64_t Next(uint64_t state) { return static_cast<int64_t>(state & kPartMask); }

// How long an idle worker watches for the next job before it sleeps: long
// enough for back-to-back kernels. Measured with bench_train's addition model
// on 2 threads: while OpenBLAS had threads of its own, 30 µs was 35% slower
// than 5 µs and 200 µs 2.4x slower; with the GEMMs on this pool (cpu_gemm.h),
// 50 µs and 1 ms were no better than 5 µs in alternating runs, 200 µs slower.
constexpr std::chrono::microseconds kSpin(5);

}  // namespace

CpuThreadPool::CpuThreadPool(int threads) {
  CHECK_GE(threads, 1);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

CpuThreadPool::~CpuThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_.store(true);
  }
  for (std::thread& worker : workers_) worker.join();
}

void CpuThreadPool::Run(int64_t parts, absl::FunctionRef<void(int64_t)> part) {
  if (parts <= 0) return;
  if (workers_.empty() || parts == 1) {
    for (int64_t i = 0; i < parts; ++i) part(i);
    return;
  }
  if (parts > kMaxParts) {  // more than the state word counts: in rounds
    for (int64_t first = 0; first < parts; first += kMaxParts) {
      Run(std::min(kMaxParts, parts - first), [&](int64_t i) { part(first + i); });
    }
    return;
  }
  job_ = &part;
  parts_done_.store(0, std::memory_order_relaxed);
  const uint64_t generation = (Generation(state_.load(std::memory_order_relaxed)) + 1) &
                              ((uint64_t{1} << (64 - 2 * kPartBits)) - 1);
  state_.store((generation << (2 * kPartBits)) | (static_cast<uint64_t>(parts) << kPartBits),
               std::memory_order_release);
  {
    absl::MutexLock lock(&mu_);  // its release wakes sleeping workers
  }
  Drain(generation);
  while (parts_done_.load(std::memory_order_acquire) < parts) _mm_pause();
}

void CpuThreadPool::ParallelFor(size_t n, size_t grain, absl::FunctionRef<void(size_t, size_t)> range) {
  grain = std::max<size_t>(grain, 1);
  if (workers_.empty() || n < 2 * grain) {
    if (n > 0) range(0, n);
    return;
  }
  // A few parts per thread, so a thread that wakes late takes fewer; each a
  // multiple of 16 items (whole vectors, whole cache lines of floats).
  const size_t parts = std::min<size_t>(n / grain, 4 * static_cast<size_t>(threads()));
  const size_t chunk = ((n + parts - 1) / parts + 15) / 16 * 16;
  const int64_t count = static_cast<int64_t>((n + chunk - 1) / chunk);
  Run(count, [&](int64_t i) {
    const size_t begin = static_cast<size_t>(i) * chunk;
    range(begin, std::min(n, begin + chunk));
  });
}

void CpuThreadPool::Drain(uint64_t generation) {
  uint64_t state = state_.load(std::memory_order_acquire);
  while (Generation(state) == generation && Next(state) < Parts(state)) {
    if (!state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;  // `state` now holds the current word
    }
    // The part is ours: the job (and job_) live until every part is done.
    (*job_)(Next(state));
    parts_done_.fetch_add(1, std::memory_order_release);
    state = state_.load(std::memory_order_acquire);
  }
}

void CpuThreadPool::WorkerLoop() {
  // Generation 0 is the state the pool was built with, not what this thread
  // reads when it starts: a job published before then is still to be joined.
  uint64_t seen = 0;
  while (true) {
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    uint64_t generation = Generation(state_.load(std::memory_order_acquire));
    while (generation == seen && !stopping_.load(std::memory_order_relaxed) &&
           std::chrono::steady_clock::now() < spin_until) {
      for (int i = 0; i < 16; ++i) _mm_pause();
      generation = Generation(state_.load(std::memory_order_acquire));
    }
    if (generation == seen) {
      const auto woken = [this, seen] {
        return stopping_.load() || Generation(state_.load(std::memory_order_acquire)) != seen;
      };
      mu_.LockWhen(absl::Condition(&woken));
      mu_.Unlock();
      if (stopping_.load()) return;
      generation = Generation(state_.load(std::memory_order_acquire));
    }
    seen = generation;
    Drain(generation);
  }
}

}  // namespace shardline::worker::cpu
