// Row-major single-precision GEMMs (GemmShape, backend_types.h) on a
// CpuThreadPool: OpenBLAS runs single-threaded in every call, and the pool's
// threads each run one call on their own part, split by shape alone.
//
// Why not OpenBLAS' own threads: between GEMMs they yield-spin on the cores
// the pool's kernels need (15% of a step's samples in the profile,
// docs/benchmarks.md), and at the small shapes of the addition model its
// two-thread weight-gradient GEMMs ran at half the speed of two independent
// halves.
//
// Determinism: a batch of GEMMs runs item by item (each on one thread), so
// its bits do not depend on the thread count. A single GEMM is split into as
// many parts as threads, along the longer of C's two dimensions (multiples of
// 16); each element's sum over k is OpenBLAS' for that part's shape, so
// results are the same bits for the same thread count.
#ifndef SHARDLINE_WORKER_BACKEND_CPU_CPU_GEMM_H_
#define SHARDLINE_WORKER_BACKEND_CPU_CPU_GEMM_H_

#include "worker/backend/backend_types.h"
#include "worker/backend/cpu/cpu_thread_pool.h"

namespace shardline::worker::cpu {

// Sets OpenBLAS to one thread for the whole process (all CpuBackends split
// their GEMMs themselves) and returns the thread count it had before the
// first call: OPENBLAS_NUM_THREADS or the number of cores.
int TakeOverBlasThreads();

// C = alpha·op(A)·op(B) + beta·C for every item of the batch. With k = 0,
// C = beta·C (BLAS libraries differ there).
void Gemm(CpuThreadPool& pool, const GemmShape& shape, const float* a, const float* b, float* c);

}  // namespace shardline::worker::cpu

#endif  // SHARDLINE_WORKER_BACKEND_CPU_CPU_GEMM_H_
