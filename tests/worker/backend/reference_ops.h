// Naive float64 implementations of the backend operations, written from the
// formulas and nothing else. The conformance suite checks every backend
// against these.
#ifndef SHARDLINE_TESTS_WORKER_BACKEND_REFERENCE_OPS_H_
#define SHARDLINE_TESTS_WORKER_BACKEND_REFERENCE_OPS_H_

#include <cstdint>
#include <vector>

#include "worker/backend/attention.h"
#include "worker/backend/backend_types.h"

namespace shardline::worker::reference {

// C (row-major, with ldc/stride_c of `shape`) updated as Gemm would.
void Gemm(const GemmShape& shape, const std::vector<double>& a, const std::vector<double>& b,
          std::vector<double>& c);
double Gelu(double x);
double GeluGrad(double x);
// y, mean, rstd of a LayerNorm over rows of `cols`.
void LayerNorm(const std::vector<double>& x, const std::vector<double>& gamma,
               const std::vector<double>& beta, int64_t rows, int64_t cols, double eps,
               std::vector<double>& y, std::vector<double>& mean, std::vector<double>& rstd);
std::vector<double> CausalSoftmax(const std::vector<double>& scores, int64_t batch, int64_t t,
                                  double scale);
std::vector<double> CrossEntropy(const std::vector<double>& logits, const std::vector<int32_t>& targets,
                                 int64_t rows, int64_t vocab);
// out [batch, t, C] of causal attention over qkv [batch, t, 3C].
std::vector<double> Attention(const AttentionShape& shape, const std::vector<double>& qkv);

}  // namespace shardline::worker::reference

#endif  // SHARDLINE_TESTS_WORKER_BACKEND_REFERENCE_OPS_H_
