// CpuThreadPool runs the CPU backend's own kernels (element-wise,
// normalisation, softmax, loss, optimizer) on as many threads as OpenBLAS
// uses for GEMMs: the calling thread plus threads() − 1 workers. The two never
// run at once (a backend is driven by one thread, and a kernel returns only
// when all its parts are done), so the cores are not oversubscribed: while a
// kernel runs, OpenBLAS' idle threads yield to ours, and ours sleep (after a
// short spin) while a GEMM runs.
//
// Determinism: callers split work into parts whose boundaries do not depend
// on which thread runs them, and each part writes its own outputs, so results
// are the same bits whatever the thread count.
//
// Run() is called by one thread at a time (the backend's); not reentrant.
#ifndef SHARDLINE_WORKER_BACKEND_CPU_CPU_THREAD_POOL_H_
#define SHARDLINE_WORKER_BACKEND_CPU_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace shardline::worker::cpu {

class CpuThreadPool {
 public:
  // threads >= 1: the caller counts as one.
  explicit CpuThreadPool(int threads);
  ~CpuThreadPool();
  CpuThreadPool(const CpuThreadPool&) = delete;
  CpuThreadPool& operator=(const CpuThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls part(i) once for every i in [0, parts), spread over the threads;
  // returns when all calls have returned.
  void Run(int64_t parts, absl::FunctionRef<void(int64_t)> part);

  // Splits [0, n) into contiguous ranges (up to four per thread, so a
  // thread that wakes late takes fewer; at least `grain` items each, a
  // multiple of 16) and calls range(begin, end) for each; below 2·grain,
  // one call on the calling thread. For work whose result does not depend
  // on where the ranges fall (element-wise, row-wise).
  void ParallelFor(size_t n, size_t grain, absl::FunctionRef<void(size_t, size_t)> range);

 private:
  void WorkerLoop();
  // Takes parts of job `generation` until none are left.
  void Drain(uint64_t generation);

  // The current job: set by Run() before it publishes a new state_, read by
  // a thread only once it has claimed one of the job's parts.
  absl::FunctionRef<void(int64_t)>* job_ = nullptr;
  // Generation, part count and next unclaimed part (cpu_thread_pool.cc).
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> parts_done_{0};
  std::atomic<bool> stopping_{false};
  // Sleeping workers wait on it for a new generation (or stopping_); Run()
  // locks and unlocks it after publishing one, so they re-check.
  absl::Mutex mu_;

  std::vector<std::thread> workers_;  // last: they start using the above
};

}  // namespace shardline::worker::cpu

#endif  // SHARDLINE_WORKER_BACKEND_CPU_CPU_THREAD_POOL_H_
