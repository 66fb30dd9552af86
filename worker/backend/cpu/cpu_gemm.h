// Row-major single-precision GEMMs (GemmShape, backend_types.h) on a
// CpuThreadPool: OpenBLAS runs single-threaded in every call, and the pool's
// threads each run one call on their own piece of C, cut by shape and thread
// count alone.
//
// Why not OpenBLAS' own threads: between GEMMs they yield-spin on the cores
// the pool's kernels need (15% of a step's samples in the profile,
// docs/benchmarks.md), and at the small shapes of the addition model its
// two-thread weight-gradient GEMMs ran at half the speed of two independent
// halves.
//
// A batch of at least as many GEMMs as threads runs item by item. Otherwise
// each item's C is cut into a grid of as many pieces as threads (rows and
// columns in multiples of 16; on two threads the longer side in halves,
// beyond that near-square pieces, so that the pieces together pack as few
// elements of A and B as they can).
//
// A pair of independent GEMMs (a linear layer's input and weight gradients)
// on two threads runs each whole on one thread, rather than both in halves:
// neither thread packs the operand the other also reads, and the two take
// the same multiply-adds: 2.5-7% faster (medians) than the halves on the
// large model's backward shapes (docs/benchmarks.md).
//
// Determinism: a batch run item by item gives the same bits on any thread
// count. A cut GEMM's element sums over k as OpenBLAS does for that piece's
// shape, so results are the same bits for the same thread count (and for
// any, where OpenBLAS picks the same kernel for the pieces as for the whole).
#ifndef SHARDLINE_WORKER_BACKEND_CPU_CPU_GEMM_H_
#define SHARDLINE_WORKER_BACKEND_CPU_CPU_GEMM_H_

#include "worker/backend/backend.h"
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

// Two independent GEMMs at once where PairRunsSplit, each on half of the
// threads (each cut for that half, so on two threads each runs whole on
// one); otherwise one Gemm after the other, each on all of them.
void GemmPair(CpuThreadPool& pool, const GemmOperands& first, const GemmOperands& second);
// Whether GemmPair on `threads` threads splits them: an even count, and
// neither GEMM so small that Gemm would run it on the calling thread alone.
bool PairRunsSplit(int threads, const GemmShape& first, const GemmShape& second);

}  // namespace shardline::worker::cpu

#endif  // SHARDLINE_WORKER_BACKEND_CPU_CPU_GEMM_H_
